"""docs/election.md 1.3: what the decision says for each member."""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from flexinfer_core import (
    Condition,
    GpuLease,
    Phase,
    Serverless,
    SharedState,
    apply_decision,
    decide_group,
    desired_replicas,
    group_models,
    observed_phase,
    reasons,
    standalone_models,
)
from flexinfer_core.election import Threshold
from flexinfer_core.group import describe_threshold, handed_over, shown_on_its_way, thresholds

from .builders import T0, ago, member

TICK = timedelta(microseconds=1)

READY = Phase.READY
ACTIVE = SharedState.ACTIVE
QUEUED = SharedState.QUEUED


def swap_scenario() -> list:  # type: ignore[type-arg]
    return [
        member(
            "chat",
            priority=100,
            phase=READY,
            shared_state=ACTIVE,
            last_active=ago(minutes=3),
            service_labels=("chat", "default"),
        ),
        member("coder", priority=200, last_active=ago(2), service_labels=("code",)),
        member("embed", priority=50),
        member("vision", priority=200),
    ]


def test_leader_and_queue_positions() -> None:
    decision = decide_group(swap_scenario(), now=T0)
    assert decision.leader == "coder"
    leader = decision.member("coder")
    assert (leader.state, leader.queue_position, leader.preempted_by) == (ACTIVE, 0, "")
    # Non-leaders ranked by priority desc, then name asc, 1-based.
    positions = {m.name: m.queue_position for m in decision.members if m.name != "coder"}
    assert positions == {"vision": 1, "chat": 2, "embed": 3}
    # preemptedBy names who took the card from a member that was serving, and only it:
    # a queued member's status never names the holder (see the next test).
    assert {n: decision.member(n).preempted_by for n in positions} == {
        "vision": "",
        "chat": "coder",
        "embed": "",
    }
    assert decision.member("chat").message == "preempted by coder (queue position 2)"
    assert decision.member("vision").message == "queued for the GPU (queue position 1)"
    assert all(decision.member(n).state is QUEUED for n in positions)


def test_a_handover_between_two_others_changes_nothing_on_a_queued_member() -> None:
    """b takes the card from a: c and d keep their places in the queue, so their
    statuses stay as written (a write would tell their readers nothing new)."""
    group = [
        member("a", priority=100, phase=READY, replicas=1, last_active=ago(minutes=3)),
        member("b", priority=150, replicas=0),
        member("c", priority=50, replicas=0),
        member("d", priority=10, replicas=0),
    ]
    settled = apply_decision(group, decide_group(group, now=T0))
    assert decide_group(settled, now=T0).leader == "a"
    asked = [attrs.evolve(m, last_active=T0) if m.name == "b" else m for m in settled]
    decision = decide_group(asked, now=T0)
    assert decision.leader == "b"
    assert {c.name for c in decision.changes(asked) if c.status} == {"a", "b"}
    assert decision.member("c").message == "queued for the GPU (queue position 2)"


def test_ready_member_losing_the_card_is_preempted_with_event() -> None:
    decision = decide_group(swap_scenario(), now=T0)
    chat = decision.member("chat")
    assert chat.phase is Phase.PREEMPTED
    assert chat.preempted_at == T0
    ready = next(c for c in chat.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == (False, reasons.PREEMPTED)
    assert [e.reason for e in chat.events] == [reasons.PREEMPTED]
    # Members that were not Ready are not "evicted": no stamp, no event.
    embed = decision.member("embed")
    assert embed.phase is Phase.IDLE and embed.preempted_at is None and embed.events == ()


def test_a_handover_has_one_event_on_the_member_that_lost_the_card() -> None:
    """chat serves and loses the card: its Preempted Event names coder, which gets none."""
    models = swap_scenario()
    first = decide_group(models, now=T0)
    assert [(e.model, e.reason) for e in first.events] == [("chat", reasons.PREEMPTED)]
    assert "preempted by coder" in first.events[0].message
    second = decide_group(apply_decision(models, first), now=T0)
    assert second.events == ()


def test_new_leader_gets_promoted_event_once_when_nobody_is_evicted() -> None:
    # chat holds the card but is not serving (scaled to zero): nobody is evicted.
    models = [attrs.evolve(m, phase=Phase.IDLE) if m.name == "chat" else m for m in swap_scenario()]
    first = decide_group(models, now=T0)
    assert [(e.model, e.reason) for e in first.events] == [("coder", reasons.PROMOTED)]
    second = decide_group(apply_decision(models, first), now=T0)
    assert second.events == ()


def test_under_lease_preempted_reason_is_gpu_lease_held() -> None:
    lease = GpuLease(name="ft", group="homelab-gpu", owner="finetune")
    decision = decide_group(swap_scenario(), now=T0, leases=[lease])
    assert decision.leader is None
    chat = decision.member("chat")
    assert chat.phase is Phase.PREEMPTED
    assert chat.reason == reasons.GPU_LEASE_HELD == "GPULeaseHeld"
    assert [e.reason for e in chat.events] == [reasons.GPU_LEASE_HELD]
    assert {m.preempted_by for m in decision.members} == {"gpu-lease/finetune"}
    assert all(m.desired_replicas == 0 for m in decision.members)
    # Everyone is queued, ranked by priority then name.
    assert [m.queue_position for m in sorted(decision.members, key=lambda m: m.queue_position)] == [
        1,
        2,
        3,
        4,
    ]


def test_preempted_at_cleared_when_ready_again() -> None:
    back = member("chat", phase=READY, shared_state=ACTIVE, preempted_at=ago(minutes=30))
    decision = decide_group([back], now=T0)
    assert decision.member("chat").preempted_at is None


def test_preempted_at_kept_while_not_ready() -> None:
    models = [
        member("chat", phase=Phase.PREEMPTED, preempted_at=ago(minutes=30)),
        member("coder", phase=READY, shared_state=ACTIVE),
    ]
    decision = decide_group(models, now=T0)
    assert decision.member("chat").preempted_at == ago(minutes=30)


def test_active_services_annotation() -> None:
    decision = decide_group(swap_scenario(), now=T0)
    assert decision.member("coder").active_services == "code"
    assert {decision.member(n).active_services for n in ("chat", "embed", "vision")} == {""}


def test_active_services_joined_with_commas() -> None:
    models = [member("chat", phase=READY, service_labels=("chat", "default"))]
    assert decide_group(models, now=T0).member("chat").active_services == "chat,default"


# --- desired replicas ---------------------------------------------------------------


def test_desired_replicas_table() -> None:
    cases = [
        (member("a", serverless=Serverless(enabled=False)), 1),
        # Loading: kept up past its idle timeout while asked for within its cold start
        # timeout; a load nobody asked for (demand withdrawn) goes as idle ones go.
        (member("a", phase=Phase.LOADING, last_active=ago(minutes=5)), 1),
        (member("a", phase=Phase.LOADING), 0),
        (member("a", phase=Phase.LOADING, last_active=ago(minutes=6)), 0),
        (
            member(
                "a",
                phase=Phase.LOADING,
                last_active=ago(minutes=9),
                serverless=Serverless(cold_start_timeout=timedelta(minutes=10)),
            ),
            1,
        ),
        (member("a"), 0),
        (member("a", serverless=Serverless(min_replicas=2)), 2),
        (member("a", last_active=ago(minutes=6)), 0),
        (member("a", last_active=ago(minutes=6), serverless=Serverless(min_replicas=1)), 1),
        (member("a", last_active=ago(minutes=5)), 1),  # idle timeout is inclusive
        (member("a", last_active=ago(10)), 1),
        (member("a", last_active=ago(10), serverless=Serverless(min_replicas=3)), 3),
    ]
    for model, expected in cases:
        assert desired_replicas(model, now=T0) == expected, model


def test_non_leaders_want_zero() -> None:
    decision = decide_group(swap_scenario(), now=T0)
    assert [m.name for m in decision.members if m.desired_replicas > 0] == ["coder"]


def test_break_before_make_waits_for_old_pods() -> None:
    decision = decide_group(swap_scenario(), now=T0, running={"chat"})
    coder = decision.member("coder")
    assert coder.desired_replicas == 0
    assert coder.reason == reasons.WAITING_FOR_GPU
    assert "chat" in coder.message
    after = decide_group(apply_decision(swap_scenario(), decision), now=T0, running=())
    assert after.member("coder").desired_replicas == 1


def test_break_before_make_does_not_scale_down_a_leader_that_has_pods() -> None:
    models = [
        member("a", phase=READY, shared_state=ACTIVE, last_active=ago(1)),
        member("b", phase=Phase.PREEMPTED),
    ]
    decision = decide_group(models, now=T0, running={"a", "b"})
    assert decision.member("a").desired_replicas == 1


# --- writes --------------------------------------------------------------------------


def test_applying_then_deciding_again_writes_nothing() -> None:
    models = swap_scenario()
    first = decide_group(models, now=T0, running={"chat"})
    assert first.changes(models)
    applied = apply_decision(models, first)
    second = decide_group(applied, now=T0, running={"chat"})
    assert second.changes(applied) == ()


def test_changes_name_only_what_differs() -> None:
    models = swap_scenario()
    applied = apply_decision(models, decide_group(models, now=T0))
    # Someone scaled embed by hand: only its replicas differ.
    tampered = [
        m if m.name != "embed" else m.__class__(**{**_fields(m), "replicas": 3}) for m in applied
    ]
    changes = decide_group(tampered, now=T0).changes(tampered)
    assert [(c.name, c.status, c.replicas, c.active_services) for c in changes] == [
        ("embed", False, True, False)
    ]


@pytest.mark.parametrize(
    "recorded",
    [
        {"recorded_phase": None},  # status.phase never written
        {"recorded_phase": Phase.LOADING},
        {"recorded_message": "an older message"},
        {"recorded_group": "another-group"},
        {"generation": 7},  # the spec changed since observedGeneration
    ],
)
def test_changes_see_every_status_field_the_controller_writes(recorded: dict[str, object]) -> None:
    models = swap_scenario()
    applied = list(apply_decision(models, decide_group(models, now=T0)))
    embed = next(m for m in applied if m.name == "embed")
    tampered = [attrs.evolve(embed, **recorded) if m is embed else m for m in applied]
    changes = decide_group(tampered, now=T0).changes(tampered)
    assert [(c.name, c.status, c.replicas, c.active_services) for c in changes] == [
        ("embed", True, False, False)
    ]


def test_changes_say_which_way_to_scale() -> None:
    models = [attrs.evolve(m, replicas=1 if m.name == "chat" else 0) for m in swap_scenario()]
    decision = decide_group(models, now=T0)
    assert decision.leader == "coder"
    by_name = {c.name: c for c in decision.changes(models)}
    coder, chat = by_name["coder"], by_name["chat"]
    assert (coder.replicas_from, coder.replicas_to, coder.scale_up, coder.scale_down) == (
        0,
        1,
        True,
        False,
    )
    assert (chat.replicas_from, chat.replicas_to, chat.scale_up, chat.scale_down) == (
        1,
        0,
        False,
        True,
    )
    assert sorted(n for n, c in by_name.items() if c.scale_up or c.scale_down) == ["chat", "coder"]
    # Without a Deployment there is nothing to scale, whatever the decision wants.
    alone = [attrs.evolve(m, replicas=None) for m in models]
    assert not any(c.scale_up or c.scale_down for c in decide_group(alone, now=T0).changes(alone))


def _fields(m: object) -> dict:  # type: ignore[type-arg]
    return attrs.asdict(m, recurse=False)  # type: ignore[arg-type]


# --- next_change_at ------------------------------------------------------------------


def test_next_change_at_is_the_earliest_future_threshold() -> None:
    models = [
        member("a", phase=READY, shared_state=ACTIVE, last_active=ago(90)),
        member("b", preempted_at=ago(minutes=4)),
    ]
    decision = decide_group(models, now=T0)
    # a's demand window (2m after ago(90)) lapses in 30 s, before b's cooldown (1m).
    assert decision.next_change_at == T0 + timedelta(seconds=30)


def test_next_change_at_includes_lease_expiry() -> None:
    lease = GpuLease(name="ft", group="homelab-gpu", expires_at=T0 + timedelta(seconds=7))
    decision = decide_group([member("a", phase=READY)], now=T0, leases=[lease])
    assert decision.next_change_at == T0 + timedelta(seconds=7)


def test_quiet_group_has_no_deadline() -> None:
    decision = decide_group([member("a", phase=READY, last_active=ago(minutes=60))], now=T0)
    assert decision.next_change_at is None


# --- grouping and observed phase -------------------------------------------------------


def test_group_models_by_namespace_and_group() -> None:
    models = [
        member("a"),
        member("b"),
        member("c", namespace="lab"),
        member("solo", group=""),
    ]
    groups = group_models(models)
    assert sorted(groups) == [("default", "homelab-gpu"), ("lab", "homelab-gpu")]
    assert [m.name for m in groups[("default", "homelab-gpu")]] == ["a", "b"]
    assert [m.name for m in standalone_models(models)] == ["solo"]


def test_standalone_model_is_a_group_of_one() -> None:
    solo = member("solo", group="", last_active=ago(1))
    decision = decide_group([solo], now=T0)
    assert decision.leader == "solo"
    assert decision.member("solo").desired_replicas == 1


def test_observed_phase() -> None:
    assert observed_phase(Phase.IDLE, replicas=1, pods=0, ready_pods=0) is Phase.PENDING
    assert observed_phase(Phase.PENDING, replicas=1, pods=1, ready_pods=0) is Phase.LOADING
    assert observed_phase(Phase.LOADING, replicas=1, pods=1, ready_pods=1) is Phase.READY
    assert observed_phase(Phase.READY, replicas=0, pods=0, ready_pods=0) is Phase.IDLE
    # Terminating pods of a preempted member may still be ready: it stays Preempted.
    assert observed_phase(Phase.PREEMPTED, replicas=0, pods=1, ready_pods=1) is Phase.PREEMPTED
    assert (
        observed_phase(Phase.READY, replicas=1, pods=1, ready_pods=1, failed=True) is Phase.FAILED
    )


def test_ready_leader_with_stale_stamp_decides_the_same_after_apply() -> None:
    models = [
        member(
            "back",
            phase=READY,
            shared_state=ACTIVE,
            preempted_at=ago(30),
            last_active=ago(minutes=10),
        ),
        member("vip", priority=500, last_active=ago(1)),
    ]
    first = decide_group(models, now=T0)
    applied = apply_decision(models, first)
    second = decide_group(applied, now=T0)
    assert second.leader == first.leader == "vip"
    assert second.changes(applied) == ()


def test_a_leader_whose_cache_is_not_ready_runs_nothing() -> None:
    """Elected only because no member is runnable (rule 12): it keeps the card, but a pod
    would mount a copy that is not complete, so it wants no replicas until it is."""
    waiting = member("a", last_active=ago(1), cache_ready=False)
    decision = decide_group([waiting], now=T0)
    leader = decision.member("a")
    assert decision.leader == "a"
    assert leader.desired_replicas == 0
    assert leader.reason == reasons.CACHE_NOT_READY
    assert "ModelCache is not ready" in leader.message
    # Applying it and deciding again writes nothing more (the reason is kept).
    again = decide_group(list(apply_decision([waiting], decision)), now=T0)
    assert again.changes(apply_decision([waiting], decision)) == ()
    ready = decide_group([member("a", last_active=ago(1))], now=T0)
    assert ready.member("a").desired_replicas == 1


# --- instants recorded in the future ------------------------------------------------------


def test_a_far_future_last_active_is_read_as_now_said_and_rewritten() -> None:
    """Read as recorded, a lastActiveTime a year ahead keeps its member busy (and
    holding the card at equal priority) for a year."""
    future = T0 + timedelta(days=365)
    holder = member("chat", phase=READY, shared_state=ACTIVE, last_active=future, replicas=1)
    asker = member("code", last_active=ago(1), replicas=0)
    decision = decide_group([holder, asker], now=T0)

    chat = decision.member("chat")
    assert decision.leader == "chat"  # busy as of now, not as of next year
    assert chat.rewrite_last_active == T0
    assert "status.lastActiveTime 2027-" in chat.message
    assert chat.message.endswith("is in the future and is read as now")
    active = next(c for c in chat.conditions if c.type == "Active")
    assert active.message == chat.message
    assert [(e.reason, e.type) for e in chat.events] == [(reasons.TIMESTAMP_IN_FUTURE, "Warning")]
    assert [c.name for c in decision.changes([holder, asker]) if c.status] == ["chat", "code"]

    # Written back, it ages from now. The next decision drops the note from the message
    # (one more status write, no Event), then nothing changes; once chat is idle the
    # member that keeps asking takes the card.
    applied = apply_decision([holder, asker], decision)
    assert applied[0].last_active == T0
    again = decide_group(applied, now=T0)
    assert [(c.name, c.status, c.events) for c in again.changes(applied)] == [("chat", True, ())]
    assert "future" not in again.member("chat").message
    applied = apply_decision(applied, again)
    assert decide_group(applied, now=T0).changes(applied) == ()
    later = T0 + timedelta(minutes=3)
    still_asking = [applied[0], attrs.evolve(applied[1], last_active=later - timedelta(seconds=1))]
    assert decide_group(still_asking, now=later).leader == "code"


def test_a_far_future_preempted_at_starts_the_cooldown_now_not_next_year() -> None:
    holder = member("chat", phase=READY, shared_state=ACTIVE, last_active=ago(minutes=10))
    victim = member("old", phase=Phase.PREEMPTED, preempted_at=T0 + timedelta(days=365))
    vip = member("vip", priority=500, last_active=ago(1))
    now_decision = decide_group([holder, victim, vip], now=T0)
    assert now_decision.reason == reasons.SWAP_COOLDOWN
    old = now_decision.member("old")
    assert old.preempted_at == T0  # what the status will say from now on
    assert "status.sharedGroup.preemptedAt 2027-" in old.message
    assert old.rewrite_last_active is None
    applied = apply_decision([holder, victim, vip], now_decision)
    later = T0 + timedelta(minutes=5)
    vip_again = attrs.evolve(applied[2], last_active=later - timedelta(seconds=1))
    assert decide_group([applied[0], applied[1], vip_again], now=later).leader == "vip"


def test_a_clock_a_little_ahead_is_read_as_now_without_comment() -> None:
    skewed = member("chat", phase=READY, shared_state=ACTIVE, last_active=T0 + timedelta(seconds=5))
    decision = decide_group([skewed, member("code")], now=T0)
    chat = decision.member("chat")
    assert (chat.rewrite_last_active, chat.events) == (None, ())
    assert "future" not in chat.message
    assert decision.next_change_at == T0 + timedelta(minutes=2)  # the demand window, from now


def test_a_holder_s_way_to_serving_is_progress_and_serving_is_news() -> None:
    """coder took the card from chat and waits for chat's pod: the steps of its start
    (the pod gone, its own pod made, loading) are progress an adapter may coalesce;
    Ready, and chat's preemption, are news."""
    models = swap_scenario()
    waiting = apply_decision(models, decide_group(models, now=T0, running={"chat"}))
    assert decide_group(waiting, now=T0, running={"chat"}).changes(waiting) == ()

    def step(phase: Phase, replicas: int) -> tuple[bool, bool]:
        observed = [
            attrs.evolve(m, phase=phase, replicas=replicas) if m.name == "coder" else m
            for m in waiting
        ]
        running = {"coder"} if phase in (Phase.LOADING, READY) else set()
        change = next(
            c
            for c in decide_group(observed, now=T0, running=running).changes(observed)
            if c.name == "coder"
        )
        return change.status, change.progress

    assert step(Phase.IDLE, 0) == (True, True)  # chat's pod gone: scale-up, reason moves
    assert step(Phase.PENDING, 1) == (True, True)
    assert step(Phase.LOADING, 1) == (True, True)
    assert step(READY, 1) == (True, False)
    first = decide_group(models, now=T0, running={"chat"})
    assert not any(c.progress for c in first.changes(models))


def test_a_holder_is_shown_on_its_way_once_its_status_says_it_holds_the_card() -> None:
    """What lets an adapter hold a holder's later steps longer than its first: its
    status already says it holds the card and is not serving yet."""
    models = swap_scenario()
    waiting = apply_decision(models, decide_group(models, now=T0, running={"chat"}))
    before = next(m for m in models if m.name == "coder")
    coder = next(m for m in waiting if m.name == "coder")
    assert not shown_on_its_way(before)  # Queued: its taking the card is the news
    assert (coder.shared_state, coder.recorded_phase) == (ACTIVE, Phase.IDLE)
    assert shown_on_its_way(coder)  # Idle, but WaitingForGPU says why
    assert shown_on_its_way(attrs.evolve(coder, recorded_phase=Phase.LOADING))
    assert not shown_on_its_way(attrs.evolve(coder, recorded_phase=READY))
    # Active and Idle with nothing said of a wait (a Model alone, scaled from zero):
    # its first step is news.
    said = tuple(c for c in coder.conditions if c.type != "Ready")
    idle = Condition("Ready", False, "Idle", "coder is idle")
    assert not shown_on_its_way(attrs.evolve(coder, conditions=(*said, idle)))


def as_written(models: list) -> list:  # type: ignore[type-arg]
    """The models as a controller left them: each status written by a decision, the
    pods as they were."""
    settled = apply_decision(models, decide_group(models, now=T0 - timedelta(hours=1)))
    pairs = zip(settled, models, strict=True)
    return [attrs.evolve(s, phase=m.phase, replicas=m.replicas) for s, m in pairs]


def test_taking_the_card_from_an_evicted_member_is_progress_and_the_eviction_news() -> None:
    """chat serves; coder is asked for and takes the card: chat's eviction (its status
    naming coder, its Event) is news; coder's Active, with no Event of its own, is the
    first step of its way to serving, which an adapter may hold back."""
    models = as_written(
        [
            member("chat", priority=100, phase=READY, last_active=ago(minutes=3), replicas=1),
            member("coder", priority=200, replicas=0),
        ]
    )
    assert [(m.name, m.shared_state) for m in models] == [("chat", ACTIVE), ("coder", QUEUED)]
    asked = [attrs.evolve(m, last_active=ago(2)) if m.name == "coder" else m for m in models]
    decision = decide_group(asked, now=T0, running={"chat"})
    changes = {c.name: c for c in decision.changes(asked)}
    assert decision.member("chat").preempted_by == "coder"
    assert (changes["chat"].progress, [e.reason for e in changes["chat"].events]) == (
        False,
        [reasons.PREEMPTED],
    )
    assert (changes["coder"].status, changes["coder"].progress) == (True, True)


def test_taking_a_card_nobody_serves_is_news() -> None:
    """Nobody serves (chat idled out, its pods gone): coder's taking the card has its
    own Event (Promoted) and no eviction names it, so it is written at once."""
    models = as_written(
        [
            member("chat", priority=100, last_active=ago(minutes=3), replicas=0),
            member("coder", priority=200, replicas=0),
        ]
    )
    asked = [attrs.evolve(m, last_active=ago(2)) if m.name == "coder" else m for m in models]
    decision = decide_group(asked, now=T0)
    coder = next(c for c in decision.changes(asked) if c.name == "coder")
    assert [e.reason for e in coder.events] == [reasons.PROMOTED]
    assert (coder.status, coder.progress) == (True, False)


def test_a_holder_whose_status_is_not_written_yet_is_read_from_the_eviction() -> None:
    """chat's eviction is written (Preempted, naming coder), coder's status is not yet:
    coder holds the card all the same, with no second Event; its status is still the
    step an adapter may hold back, stamped with the eviction's time."""
    models = as_written(
        [
            member("chat", priority=100, phase=READY, last_active=ago(minutes=3), replicas=1),
            member("coder", priority=200, replicas=0),
        ]
    )
    asked = [attrs.evolve(m, last_active=ago(2)) if m.name == "coder" else m for m in models]
    evicted = apply_decision(asked, decide_group(asked, now=T0, running={"chat"}))
    # Only chat's status written: coder's as it was.
    written = [m if m.name == "chat" else a for m, a in zip(evicted, asked, strict=True)]
    chat = next(m for m in written if m.name == "chat")
    assert (chat.recorded_phase, chat.preempted_by) == (Phase.PREEMPTED, "coder")
    assert handed_over(written) == ("coder", T0)

    later = T0 + timedelta(seconds=1)
    decision = decide_group(written, now=later, running={"chat"})
    coder = decision.member("coder")
    assert (coder.state, coder.events) == (ACTIVE, ())
    (change,) = [c for c in decision.changes(written) if c.name == "coder"]
    assert (change.status, change.progress) == (True, True)


def test_an_eviction_names_the_holder_only_while_nobody_says_active() -> None:
    evicted = member("a", recorded_phase=Phase.PREEMPTED, preempted_by="b", preempted_at=ago(5),
                     shared_state=QUEUED)  # fmt: skip
    b = member("b", shared_state=QUEUED)
    assert handed_over([evicted, b]) == ("b", ago(5))
    assert handed_over([evicted, attrs.evolve(b, shared_state=ACTIVE)]) is None
    # The latest eviction counts; one naming a lease (or a member gone) names nobody.
    leased = member("c", recorded_phase=Phase.PREEMPTED, preempted_by="gpu-lease/trainer",
                    preempted_at=ago(1), shared_state=QUEUED)  # fmt: skip
    assert handed_over([evicted, b, leased]) is None
    draining = member("c", recorded_phase=Phase.DRAINING, preempted_by="a",
                      draining_since=ago(1), shared_state=QUEUED)  # fmt: skip
    assert handed_over([evicted, b, draining]) == ("a", ago(1))


def test_a_load_nobody_asked_for_stops_on_the_timer_at_its_cold_start_timeout() -> None:
    serverless = Serverless(
        idle_timeout=timedelta(minutes=2), cold_start_timeout=timedelta(minutes=8)
    )
    loading = member(
        "a", phase=Phase.LOADING, shared_state=SharedState.ACTIVE, last_active=ago(minutes=1),
        serverless=serverless,
    )  # fmt: skip
    end = ago(minutes=1) + timedelta(minutes=8) + TICK
    listed = [c for c in thresholds([loading], now=T0) if c.at == end and c.subject == "a"]
    assert any(c.kind is Threshold.IDLE_TIMEOUT for c in listed), listed
    idle = next(c for c in listed if c.kind is Threshold.IDLE_TIMEOUT)
    said = describe_threshold([loading], idle, now=T0)
    assert said == "a's load is no longer asked for (8m cold start timeout)"
    assert desired_replicas(loading, now=end - TICK) == 1
    assert desired_replicas(loading, now=end) == 0
