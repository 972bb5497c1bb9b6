"""docs/election.md 3: the v1alpha1 GPUGroup decision."""

from __future__ import annotations

from datetime import timedelta

import attrs

from flexinfer_core import (
    AntiThrashing,
    Event,
    GpuGroupAction,
    GpuGroupMember,
    GpuGroupPhase,
    GpuGroupState,
    MemberState,
    PreemptionPolicy,
    decide_gpu_group,
    reasons,
)

from .builders import T0, ago


def group(*members: GpuGroupMember, **fields: object) -> GpuGroupState:
    return GpuGroupState("gg", members=members, **fields)  # type: ignore[arg-type]


def busy_current(**fields: object) -> GpuGroupMember:
    base: dict[str, object] = {
        "name": "chat",
        "last_request": ago(5),
        "has_pods": True,
        "ready": True,
    }
    base.update(fields)
    return GpuGroupMember(**base)  # type: ignore[arg-type]


def test_order_queued_first_then_priority_then_oldest_then_name() -> None:
    members = (
        GpuGroupMember("idle-vip", priority=900),
        GpuGroupMember("b", priority=100, queued=1, oldest_waiting=ago(10)),
        GpuGroupMember("a", priority=100, queued=1, oldest_waiting=ago(10)),
        GpuGroupMember("old", priority=100, queued=1, oldest_waiting=ago(60)),
        GpuGroupMember("hi", priority=200, queued=1, oldest_waiting=ago(1)),
    )
    decision = decide_gpu_group(group(*members), now=T0)
    assert decision.active_model == "hi"
    from flexinfer_core.gpugroup import member_order

    assert [m.name for m in sorted(members, key=member_order)] == [
        "hi",
        "old",
        "a",
        "b",
        "idle-vip",
    ]


def test_nobody_queued_keeps_current_until_idle_timeout() -> None:
    current = busy_current(last_request=ago(299))
    decision = decide_gpu_group(group(current, GpuGroupMember("b"), current_model="chat"), now=T0)
    assert (decision.action, decision.active_model) == (GpuGroupAction.KEEP, "chat")
    assert decision.phase is GpuGroupPhase.ACTIVE
    assert decision.next_change_at == T0 + timedelta(seconds=1)


def test_nobody_queued_after_idle_timeout_scales_all_to_zero() -> None:
    current = busy_current(last_request=ago(300))
    decision = decide_gpu_group(group(current, GpuGroupMember("b"), current_model="chat"), now=T0)
    assert decision.action is GpuGroupAction.IDLE
    assert decision.reason == reasons.IDLE_TIMEOUT
    assert decision.active_model is None
    assert dict(decision.desired_replicas) == {"chat": 0, "b": 0}
    assert decision.phase is GpuGroupPhase.IDLE


def test_start_from_idle_without_anti_thrashing_gates() -> None:
    decision = decide_gpu_group(group(GpuGroupMember("a", queued=1, oldest_waiting=ago(0))), now=T0)
    assert decision.action is GpuGroupAction.SWAP
    assert decision.reason == reasons.START
    assert decision.replicas_for("a") == 1
    assert decision.swap_count == 1 and decision.last_swap_time == T0
    assert decision.phase is GpuGroupPhase.SWAPPING


def contested(**winner_fields: object) -> GpuGroupState:
    winner: dict[str, object] = {
        "name": "coder",
        "priority": 200,
        "queued": 3,
        "oldest_waiting": ago(30),
    }
    winner.update(winner_fields)
    return group(
        busy_current(queued=1, oldest_waiting=ago(1)),
        GpuGroupMember(**winner),  # type: ignore[arg-type]
        current_model="chat",
        last_swap_time=ago(minutes=10),
        swap_count=4,
    )


def test_swap_when_no_gate_holds() -> None:
    decision = decide_gpu_group(contested(), now=T0)
    assert decision.action is GpuGroupAction.SWAP
    assert decision.active_model == "coder"
    assert decision.swap_count == 5
    assert decision.last_swap_time == T0
    assert "chat" in decision.last_swap_reason and "coder" in decision.last_swap_reason
    chat = next(s for s in decision.member_statuses if s.name == "chat")
    assert (chat.preempted_at, chat.preempted_by) == (T0, "coder")


def test_a_swap_carries_its_events() -> None:
    decision = decide_gpu_group(contested(), now=T0)
    assert decision.group_events == (Event("gg", reasons.SWAP, decision.message),)
    assert decision.member_events == (
        Event(
            "chat",
            reasons.PREEMPTED,
            f"chat was preempted by coder: {decision.message}",
            type="Warning",
        ),
    )
    start = decide_gpu_group(group(GpuGroupMember("a", queued=1, oldest_waiting=ago(0))), now=T0)
    assert [e.reason for e in start.group_events] == [reasons.START]
    assert start.member_events == ()  # nobody held the GPU


def test_no_events_without_a_swap() -> None:
    kept = decide_gpu_group(contested(queued=2), now=T0)
    assert (kept.group_events, kept.member_events) == ((), ())


def test_gate_queue_threshold() -> None:
    decision = decide_gpu_group(contested(queued=2), now=T0)
    assert decision.action is GpuGroupAction.KEEP
    assert decision.blocked_by == reasons.QUEUE_BELOW_THRESHOLD
    assert decision.active_model == "chat"


def test_gate_hysteresis_window() -> None:
    decision = decide_gpu_group(contested(oldest_waiting=ago(9)), now=T0)
    assert decision.blocked_by == reasons.HYSTERESIS
    assert decision.next_change_at == T0 + timedelta(seconds=1)


def test_hysteresis_zero_disables_it() -> None:
    state = attrs.evolve(
        contested(oldest_waiting=ago(0)),
        anti_thrashing=AntiThrashing(hysteresis_window=timedelta(0)),
    )
    assert decide_gpu_group(state, now=T0).action is GpuGroupAction.SWAP


def test_gate_minimum_run_duration() -> None:
    state = attrs.evolve(contested(), last_swap_time=ago(20))
    decision = decide_gpu_group(state, now=T0)
    assert decision.blocked_by == reasons.MINIMUM_RUN


def test_gate_cooldown_after_preemption() -> None:
    decision = decide_gpu_group(contested(preempted_at=ago(59)), now=T0)
    assert decision.blocked_by == reasons.COOLDOWN_AFTER_PREEMPTION
    after = decide_gpu_group(contested(preempted_at=ago(60)), now=T0)
    assert after.action is GpuGroupAction.SWAP


def test_anti_thrashing_disabled_swaps_at_once() -> None:
    state = attrs.evolve(
        contested(queued=1, oldest_waiting=ago(0), preempted_at=ago(1)),
        last_swap_time=ago(1),
        anti_thrashing=AntiThrashing(enabled=False),
    )
    assert decide_gpu_group(state, now=T0).action is GpuGroupAction.SWAP


def test_idle_current_yields_to_any_queue() -> None:
    # The gates protect a model in use; an idle one must not starve a single request.
    state = group(
        busy_current(last_request=ago(minutes=6)),
        GpuGroupMember("coder", queued=1, oldest_waiting=ago(0)),
        current_model="chat",
        last_swap_time=ago(minutes=10),
    )
    assert decide_gpu_group(state, now=T0).action is GpuGroupAction.SWAP


def test_graceful_drain_waits_for_old_pods_then_times_out() -> None:
    swapped = decide_gpu_group(contested(), now=T0)
    assert swapped.phase is GpuGroupPhase.DRAINING
    assert dict(swapped.desired_replicas) == {"chat": 0, "coder": 0}
    # Recorded status applied; chat's pods still terminating 30 s later.
    state = attrs.evolve(contested(), current_model="coder", last_swap_time=T0, swap_count=5)
    later = decide_gpu_group(state, now=T0 + timedelta(seconds=30))
    assert later.action is GpuGroupAction.DRAIN
    assert later.reason == reasons.DRAINING
    assert later.replicas_for("coder") == 0
    # After the 60 s drain timeout the winner starts even if pods linger.
    timed_out = decide_gpu_group(state, now=T0 + timedelta(seconds=60))
    assert timed_out.replicas_for("coder") == 1
    # And as soon as the old pods are gone it starts, before the timeout.
    gone = attrs.evolve(
        state,
        members=(
            busy_current(has_pods=False, queued=1, oldest_waiting=ago(1)),
            GpuGroupMember("coder", priority=200, queued=3, oldest_waiting=ago(30)),
        ),
    )
    started = decide_gpu_group(gone, now=T0 + timedelta(seconds=5))
    assert started.replicas_for("coder") == 1
    assert started.swap_count == 5  # no second swap recorded


def test_immediate_preemption_does_not_wait() -> None:
    state = attrs.evolve(contested(), preemption_policy=PreemptionPolicy.IMMEDIATE)
    decision = decide_gpu_group(state, now=T0)
    assert dict(decision.desired_replicas) == {"chat": 0, "coder": 1}


def test_member_statuses() -> None:
    state = group(
        busy_current(),
        GpuGroupMember("b", queued=2, oldest_waiting=ago(3)),
        GpuGroupMember("c", preempted_at=ago(100), preempted_by="chat"),
        GpuGroupMember("d"),
        current_model="chat",
    )
    statuses = {s.name: s for s in decide_gpu_group(state, now=T0).member_statuses}
    assert statuses["chat"].state is MemberState.ACTIVE
    assert (statuses["b"].state, statuses["b"].queued_requests, statuses["b"].queued_since) == (
        MemberState.QUEUED,
        2,
        ago(3),
    )
    assert statuses["c"].state is MemberState.PREEMPTED
    assert statuses["d"].state is MemberState.IDLE


def test_missing_members_fail_the_group() -> None:
    state = group(GpuGroupMember("ghost", exists=False, queued=1))
    decision = decide_gpu_group(state, now=T0)
    assert decision.phase is GpuGroupPhase.FAILED
    assert "ghost" in decision.message


def test_deciding_again_after_recording_the_swap_keeps_it() -> None:
    first = decide_gpu_group(contested(), now=T0)
    recorded = attrs.evolve(
        contested(),
        current_model=first.active_model,
        last_swap_time=first.last_swap_time,
        swap_count=first.swap_count,
        members=tuple(
            attrs.evolve(m, preempted_at=s.preempted_at, preempted_by=s.preempted_by)
            for m, s in zip(
                contested().members,
                sorted(first.member_statuses, key=lambda s: s.name),
                strict=False,
            )
        ),
    )
    second = decide_gpu_group(recorded, now=T0)
    assert second.active_model == first.active_model
    assert second.swap_count == first.swap_count
    assert second.last_swap_time == first.last_swap_time
    assert first.group_events and first.member_events
    assert (second.group_events, second.member_events) == ((), ())  # recorded once


def test_drain_without_a_recorded_swap_does_not_wait_forever() -> None:
    # activeModel set but no lastSwapTime (hand-written status): a lingering pod of
    # another member must not hold the holder back on every reconcile.
    state = group(
        GpuGroupMember("coder", queued=1, oldest_waiting=ago(5)),
        GpuGroupMember("chat", has_pods=True),
        current_model="coder",
    )
    decision = decide_gpu_group(state, now=T0)
    assert decision.replicas_for("coder") == 1
    assert decision.phase is GpuGroupPhase.SWAPPING


def test_a_member_whose_cache_is_not_ready_never_runs_and_the_next_one_does() -> None:
    """Issue 9: GPUGroup members follow the Models' rule: runnable only while the
    ModelCache they mount is complete (a pod would mount a partial copy)."""
    waiting = GpuGroupMember(
        "big", priority=900, queued=3, oldest_waiting=ago(30), cache_ready=False
    )
    other = GpuGroupMember("small", priority=100, queued=1, oldest_waiting=ago(30))
    decision = decide_gpu_group(group(waiting, other), now=T0)
    assert decision.active_model == "small"
    assert dict(decision.desired_replicas).get("big", 0) == 0
    alone = decide_gpu_group(group(waiting), now=T0)
    assert alone.active_model is None
    assert "big: its ModelCache is not ready" in alone.message


def test_instants_from_the_future_are_read_as_now_said_and_rewritten() -> None:
    """A lastAccessTime from 9999 kept the current model in use (the group never idled
    to zero); a preemptedAt from 9999 kept its member in its cooldown."""
    future = T0.replace(year=9999)
    current = busy_current(last_request=future, idle_timeout=timedelta(seconds=60))
    state = group(current, current_model="chat", last_swap_time=ago(600))
    decision = decide_gpu_group(state, now=T0)
    assert decision.action is GpuGroupAction.KEEP
    assert decision.rewrite_last_access_time == ("chat",)
    assert "chat's status.lastAccessTime 9999-" in decision.message
    assert [e.reason for e in decision.group_events] == [reasons.TIMESTAMP_IN_FUTURE]
    rewritten = group(
        attrs.evolve(current, last_request=T0), current_model="chat", last_swap_time=ago(600)
    )
    later = decide_gpu_group(rewritten, now=T0 + timedelta(seconds=61))
    assert (later.action, later.reason) == (GpuGroupAction.IDLE, reasons.IDLE_TIMEOUT)

    anti = AntiThrashing(
        request_queue_threshold=1,
        hysteresis_window=timedelta(0),
        minimum_run_duration=timedelta(0),
        cooldown_after_preemption=timedelta(seconds=60),
    )
    waiting = GpuGroupMember("code", queued=3, oldest_waiting=ago(30), preempted_at=future)
    blocked = decide_gpu_group(
        group(busy_current(), waiting, current_model="chat", anti_thrashing=anti), now=T0
    )
    assert blocked.blocked_by == reasons.COOLDOWN_AFTER_PREEMPTION
    assert dict((s.name, s.preempted_at) for s in blocked.member_statuses)["code"] == T0
    cooled = GpuGroupMember("code", queued=3, oldest_waiting=ago(30), preempted_at=T0)
    swapped = decide_gpu_group(
        group(busy_current(), cooled, current_model="chat", anti_thrashing=anti),
        now=T0 + timedelta(seconds=61),
    )
    assert swapped.active_model == "code"


def test_a_queue_report_from_the_future_neither_blocks_the_swap_nor_goes_unsaid() -> None:
    """The proxy's annotation is not the controller's to rewrite: an oldestWaiting from
    9999, read as now at every decision, held the hysteresis gate shut for good."""
    future = T0.replace(year=9999)
    state = contested(oldest_waiting=future)
    decision = decide_gpu_group(state, now=T0)
    assert decision.action is GpuGroupAction.SWAP
    assert decision.active_model == "coder"
    assert "demand.ai.flexinfer/coder's oldestWaiting 9999-" in decision.message
    assert reasons.TIMESTAMP_IN_FUTURE in [e.reason for e in decision.group_events]
    # a reportedAt from the future counts as a report made now, and is said
    dated = contested(reported_at=future)
    later = decide_gpu_group(dated, now=T0)
    assert later.action is GpuGroupAction.SWAP
    assert "demand.ai.flexinfer/coder's reportedAt 9999-" in later.message
    # within the tolerance nothing is said and the wait counts from now
    near = decide_gpu_group(contested(oldest_waiting=T0 + timedelta(seconds=1)), now=T0)
    assert near.blocked_by == reasons.HYSTERESIS
    assert "in the future" not in near.message


def _in_flight(count: int, *, reported: float = 1) -> GpuGroupState:
    """contested(), chat answering `count` requests (its report `reported` s old)."""
    state = contested()
    chat = busy_current(queued=1, oldest_waiting=ago(1), in_flight=count, reported_at=ago(reported))
    return attrs.evolve(state, members=(chat, state.members[1]))


def test_graceful_keeps_the_serving_member_up_while_it_answers_requests_in_flight() -> None:
    # docs/election.md 1.6: the swap is decided, but chat keeps its pod to finish.
    swapped = decide_gpu_group(_in_flight(2), now=T0)
    assert swapped.action is GpuGroupAction.SWAP
    assert dict(swapped.desired_replicas) == {"chat": 1, "coder": 0}
    recorded = attrs.evolve(_in_flight(2), current_model="coder", last_swap_time=T0)
    later = decide_gpu_group(recorded, now=T0 + timedelta(seconds=30))
    assert dict(later.desired_replicas) == {"chat": 1, "coder": 0}
    assert later.phase is GpuGroupPhase.DRAINING
    assert later.message == "waiting for chat to drain (2 in flight, until 12:01:00)"
    # The count drops to 0: chat goes, and coder starts once its pods are gone.
    done = attrs.evolve(_in_flight(0), current_model="coder", last_swap_time=T0)
    assert dict(decide_gpu_group(done, now=T0 + timedelta(seconds=31)).desired_replicas) == {
        "chat": 0,
        "coder": 0,
    }
    # Stuck: at the drain timeout chat is scaled down whatever is in flight.
    timed_out = decide_gpu_group(recorded, now=T0 + timedelta(seconds=60))
    assert dict(timed_out.desired_replicas) == {"chat": 0, "coder": 1}


def test_no_drain_of_requests_in_flight_when_immediate_stale_or_without_timeout() -> None:
    immediate = attrs.evolve(_in_flight(2), preemption_policy=PreemptionPolicy.IMMEDIATE)
    assert decide_gpu_group(immediate, now=T0).replicas_for("chat") == 0
    stale = _in_flight(2, reported=301)
    assert decide_gpu_group(stale, now=T0).replicas_for("chat") == 0
    no_timeout = attrs.evolve(_in_flight(2), drain_timeout=timedelta(0))
    assert decide_gpu_group(no_timeout, now=T0).replicas_for("chat") == 0
