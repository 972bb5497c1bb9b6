"""`explain_election` and `explain_group`: each rule's outcome, and what changes next."""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from flexinfer_core import (
    AntiThrashing,
    GpuGroupMember,
    GpuGroupState,
    GpuLease,
    Phase,
    Serverless,
    SharedState,
    elect_leader,
    reasons,
)
from flexinfer_core.election import RULES, explain_election
from flexinfer_core.explain import explain_gpu_group_ahead, explain_group
from flexinfer_core.gpugroup import explain_gpu_group

from .builders import T0, ago, member

READY = Phase.READY
ACTIVE = SharedState.ACTIVE
QUEUED = SharedState.QUEUED
LEASE = GpuLease(name="maint", group="homelab-gpu", owner="alice")

# One case per deciding rule: (members, leases, the rule that decides, its reason).
CASES = {
    "empty group": ([], (), 1, reasons.EMPTY_GROUP),
    "lease": ([member("a", phase=READY)], (LEASE,), 2, reasons.GPU_LEASE_HELD),
    "forced": ([member("a"), member("b", force_promotion=True)], (), 3, reasons.FORCE_PROMOTED),
    "cooldown": (
        [
            member("a", phase=READY, shared_state=ACTIVE),
            member("b", phase=Phase.PREEMPTED, preempted_at=ago(30), last_active=ago(5)),
        ],
        (),
        4,
        reasons.SWAP_COOLDOWN,
    ),
    "loading": (
        [
            member("a", phase=Phase.LOADING, shared_state=ACTIVE, last_active=ago(10)),
            member("b", last_active=ago(5)),
        ],
        (),
        5,
        reasons.LOADING_HOLDER,
    ),
    "preemption": (
        [
            member("a", phase=READY, last_active=ago(5)),
            member("b", priority=200, last_active=ago(1)),
        ],
        (),
        7,
        reasons.DEMAND_PREEMPTION,
    ),
    "ready": (
        [member("a", phase=READY, last_active=ago(5)), member("b", last_active=ago(1))],
        (),
        10,
        reasons.READY_LEADER,
    ),
    "recent": (
        [member("a"), member("b", last_active=ago(minutes=3))],
        (),
        11,
        reasons.RECENT_DEMAND,
    ),
    "default yields": (
        [
            member("a", phase=READY, shared_state=ACTIVE, default_member=True),
            member("b", priority=0, last_active=ago(1)),
        ],
        (),
        8,
        reasons.DEFAULT_YIELDS,
    ),
    "default returns": (
        [
            member("a", phase=Phase.IDLE, shared_state=ACTIVE, last_active=ago(minutes=6)),
            member("b", priority=0, default_member=True),
        ],
        (),
        9,
        reasons.RETURN_TO_DEFAULT,
    ),
    "fallback": ([member("a"), member("b")], (), 12, reasons.FALLBACK),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_exactly_the_deciding_rule_applies_and_the_election_is_the_same(case: str) -> None:
    models, leases, deciding, reason = CASES[case]
    trace = explain_election(models, now=T0, leases=leases)
    assert trace.election == elect_leader(models, now=T0, leases=leases)
    assert trace.election.reason == reason
    assert [(r.number, r.name) for r in trace.rules] == list(RULES)
    assert [r.number for r in trace.rules if r.applied] == [deciding]
    assert trace.deciding_rule.why == trace.election.message
    for rule in trace.rules:
        if rule.number > deciding:
            assert rule.why == f"not reached: rule {deciding} decided"
        assert rule.why


def test_rules_say_why_they_did_not_decide() -> None:
    expired = GpuLease(name="old", group="homelab-gpu", expires_at=ago(minutes=1))
    models = [
        member("chat", priority=100, phase=READY, last_active=ago(10)),
        member("coder", priority=50, last_active=ago(5), preempted_at=ago(minutes=9)),
        member("broken", phase=Phase.FAILED),
    ]
    why = {r.number: r.why for r in explain_election(models, now=T0, leases=[expired]).rules}
    assert why[1] == "3 member(s)"
    assert (
        why[2]
        == "no active GPU lease on group homelab-gpu (old expired at 2026-03-01T11:59:00+00:00)"
    )
    assert why[3] == "no member has forcePromotion set"
    assert why[4] == (
        "the 5m swap cooldown after coder's preemption ended at 2026-03-01T11:56:00+00:00"
    )
    assert why[5] == "no holder is pending or loading within its load grace"
    assert why[6] == (
        "ready: chat; wanted within 5m: chat; demanded within 2m: chat; "
        "not runnable: broken (failed)"
    )
    assert why[7] == "the best demanded member, chat, is the ready one"


def test_equal_priority_against_a_busy_leader_says_it_is_busy() -> None:
    models = [
        member("chat", phase=READY, shared_state=ACTIVE, last_active=ago(5)),
        member("coder", last_active=ago(3)),
    ]
    trace = explain_election(models, now=T0)
    assert trace.rules[6].why == (
        "coder (priority 100) does not outrank the ready chat (priority 100), which is busy "
        "(demanded within 2m)"
    )


def test_a_loading_holder_outranked_by_demand_says_who_outranks_it() -> None:
    models = [
        member("a", phase=Phase.LOADING, shared_state=ACTIVE, last_active=ago(10)),
        member("b", priority=300, last_active=ago(1)),
    ]
    trace = explain_election(models, now=T0)
    assert trace.rules[4].why == (
        "a is loading, but b (priority 300) is demanded and outranks it (priority 100)"
    )
    assert trace.election.leader_name == "b"


def test_an_unreadable_lease_is_named_in_rule_two_and_the_message() -> None:
    trace = explain_election(
        [member("a", phase=READY)], now=T0, unreadable_lease_sources=["gpuleases"]
    )
    assert trace.rules[1].why == (
        "no readable lease parks the group, and gpuleases could not be read: proceeding as "
        "unleased (fail open)"
    )
    assert trace.election.message.startswith("GPU leases could not be read (gpuleases)")
    assert trace.election.leader_name == "a"


# --- what changes next --------------------------------------------------------------


def test_cooldown_then_the_waiting_model_takes_the_card() -> None:
    models = [
        member("chat", phase=READY, shared_state=ACTIVE, last_active=ago(minutes=3), replicas=1),
        member(
            "coder",
            phase=Phase.PREEMPTED,
            shared_state=QUEUED,
            preempted_at=ago(30),
            last_active=ago(10),
        ),
    ]
    explanation = explain_group(models, now=T0)
    assert explanation.decision.reason == reasons.SWAP_COOLDOWN
    first, second = explanation.upcoming
    assert first.at == T0 + timedelta(minutes=2, microseconds=1)
    assert first.what == "chat scales from 1 to 0"
    assert first.when == "chat's 5m idle timeout ends"
    assert second.at == ago(30) + timedelta(minutes=5)
    assert second.what == "coder can take the card"
    assert second.when == "the 5m swap cooldown after coder's preemption ends"
    assert second.leader == "coder"
    assert second.assumes_demand == ("coder",)


def test_lease_expiry_is_the_next_change() -> None:
    lease = GpuLease(
        name="maint", group="homelab-gpu", owner="alice", expires_at=T0 + timedelta(hours=1)
    )
    models = [member("chat", phase=Phase.PREEMPTED, last_active=ago(minutes=1))]
    change = explain_group(models, now=T0, leases=[lease]).next_change
    assert change is not None
    assert (change.at, change.what, change.when) == (
        lease.expires_at,
        "chat can take the card",
        "GPU lease maint expires",
    )


def test_nothing_ahead_when_no_threshold_changes_the_decision() -> None:
    models = [
        member("chat", phase=READY, shared_state=ACTIVE, serverless=Serverless(enabled=False)),
        member("coder"),
    ]
    explanation = explain_group(models, now=T0)
    assert explanation.decision.leader == "chat"
    assert explanation.upcoming == ()


def test_a_demanded_holder_keeps_the_card_while_its_requests_keep_coming() -> None:
    models = [
        member("chat", phase=READY, shared_state=ACTIVE, last_active=ago(5), replicas=1),
        member("coder", last_active=ago(3)),
    ]
    explanation = explain_group(models, now=T0)
    # Equal priority against a busy leader: nothing changes while both keep asking.
    assert explanation.decision.leader == "chat"
    assert explanation.upcoming == ()


# --- GPUGroups ---------------------------------------------------------------------------


def _gpu_state(**fields: object) -> GpuGroupState:
    members = (
        GpuGroupMember(name="a", last_request=ago(60), has_pods=True, ready=True),
        GpuGroupMember(name="b", queued=1, oldest_waiting=ago(5)),
    )
    defaults: dict[str, object] = {
        "name": "card",
        "members": members,
        "current_model": "a",
        "last_swap_time": ago(minutes=10),
    }
    return GpuGroupState(**{**defaults, **fields})  # type: ignore[arg-type]


def test_a_gate_that_holds_is_the_deciding_step_and_the_swap_comes_when_the_holder_idles() -> None:
    explanation = explain_gpu_group_ahead(_gpu_state(), now=T0)
    decided = [r for r in explanation.rules if r.applied]
    assert [(r.number, r.name) for r in decided] == [(6, "queue threshold")]
    assert decided[0].why == "a keeps the GPU: b has 1 queued request(s), below the threshold of 3"
    (change,) = explanation.upcoming
    # a's last request (60 s ago) leaves its 5m idle timeout: the queued b takes the card.
    assert change.at == ago(60) + timedelta(minutes=5)
    assert (change.what, change.reason) == ("b takes the GPU", reasons.SWAP)


def test_every_gate_says_why_it_let_the_swap_through() -> None:
    members = (
        GpuGroupMember(name="a", last_request=ago(1), has_pods=True, ready=True),
        GpuGroupMember(name="b", queued=5, oldest_waiting=ago(30), preempted_at=ago(minutes=5)),
    )
    trace = explain_gpu_group(_gpu_state(members=members), now=T0)
    why = {r.number: r.why for r in trace.rules}
    assert why[6] == "b has 5 queued request(s), at least the threshold of 3"
    assert why[7] == "b's oldest request has waited at least the 10s hysteresis window"
    assert why[8] == "a has run at least the minimum 30s since the last swap"
    assert why[9] == "b was not preempted in the last 1m"
    assert [r.number for r in trace.rules if r.applied] == [10, 11]
    assert trace.decision.reason == reasons.SWAP
    # a still has pods: Graceful preemption drains them first.
    assert trace.rules[10].applied and trace.rules[10].name == "drain"


def test_anti_thrashing_off_says_so_for_every_gate() -> None:
    members = (
        GpuGroupMember(name="a", last_request=ago(1), has_pods=True, ready=True),
        GpuGroupMember(name="b", queued=1, oldest_waiting=ago(1)),
    )
    state = _gpu_state(members=members, anti_thrashing=AntiThrashing(enabled=False))
    trace = explain_gpu_group(state, now=T0)
    assert {trace.rules[n].why for n in range(5, 9)} == {"anti-thrashing is disabled"}


def test_the_drain_step_names_the_drainer_and_its_deadline() -> None:
    # b was swapped in 20 s ago; a still answers 2 requests (docs/election.md 1.6).
    members = (
        GpuGroupMember(
            name="a", has_pods=True, ready=True, in_flight=2, reported_at=ago(1),
            preempted_at=ago(20),
        ),
        GpuGroupMember(name="b", queued=1, oldest_waiting=ago(30), reported_at=ago(1)),
    )  # fmt: skip
    state = _gpu_state(members=members, current_model="b", last_swap_time=ago(20))
    trace = explain_gpu_group(state, now=T0)
    drain = trace.rules[10]
    assert (drain.number, drain.name, drain.applied) == (11, "drain", True)
    deadline = (ago(20) + timedelta(seconds=60)).isoformat()
    assert drain.why == (
        f"a drains its requests in flight before it is scaled to 0 (2 in flight, deadline "
        f"{deadline}: the 1m drain timeout after the swap)"
    )
    # Its answers ended, its pod still terminating: the wait has the same deadline.
    gone = (attrs.evolve(members[0], in_flight=0, ready=False), members[1])
    trace = explain_gpu_group(attrs.evolve(state, members=gone), now=T0)
    assert trace.rules[10].applied
    assert trace.rules[10].why.endswith(
        f"at the latest until {deadline} (the 1m drain timeout after the swap)"
    )
    assert "the pods of a" in trace.rules[10].why


def test_a_packed_gpu_group_looks_ahead_as_the_controller_decides_it() -> None:
    """With a shared card and a budget (docs/election.md 3, "Packing"), the decision is
    the packed one and the changes ahead count a co-resident leaving the card."""
    gib = 2**30
    members = (
        GpuGroupMember(name="chat", last_request=ago(5), has_pods=True, ready=True,
                       seated=True, vram_estimate=8 * gib),
        GpuGroupMember(name="embed", last_request=ago(200), has_pods=True, ready=True,
                       seated=True, vram_estimate=8 * gib),
    )  # fmt: skip
    state = _gpu_state(members=members, current_model="chat", vram_budget=24 * gib)
    packed = explain_gpu_group_ahead(state, now=T0, shared_card=True)
    assert packed.holders == {"chat", "embed"}
    assert packed.packing is not None and packed.packing.holders == ("chat", "embed")
    assert dict(packed.decision.desired_replicas) == {"chat": 1, "embed": 1}
    first = packed.upcoming[0]
    # embed's 5m idle timeout lapses 100 s on: it gives up its seat, chat keeps the card.
    assert (first.at, first.what, first.leader) == (ago(200) + timedelta(minutes=5),
                                                    "embed leaves the card", "chat")  # fmt: skip
    assert first.when == "embed is idle past its idle timeout and gives up its seat"
    # Without a shared card the members take turns: embed is not kept up beside chat.
    plain = explain_gpu_group_ahead(state, now=T0)
    assert plain.packing is None and plain.holders == {"chat"}
    assert dict(plain.decision.desired_replicas)["embed"] == 0
