"""flexinfer_core.testing: each invariant can fail, and says what broke.

A check that cannot fail proves nothing, so each is shown a decision that breaks it:
one made from another input than the scenario it is checked against.
"""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from flexinfer_core import GpuLease, ModelState, Phase, SharedState
from flexinfer_core.testing import (
    GroupScenario,
    check_break_before_make,
    check_cooldown,
    check_invariants,
    check_lease_parks_the_group,
    check_one_holder,
    check_priority,
    group_scenarios_for,
    preemptions,
)

from .builders import T0

CHAT = ModelState(
    name="chat", group="gpu-0", priority=500, phase=Phase.READY,
    shared_state=SharedState.ACTIVE, last_active=T0 - timedelta(minutes=10), replicas=1,
)  # fmt: skip
BATCH = ModelState(
    name="batch", group="gpu-0", priority=100, shared_state=SharedState.QUEUED,
    last_active=T0 - timedelta(seconds=5), replicas=0,
)  # fmt: skip
SERVING = GroupScenario(models=(CHAT, BATCH), now=T0, running=frozenset({"chat"}))


def test_a_valid_decision_passes_every_check() -> None:
    decision = check_invariants(SERVING)
    assert decision.leader == "chat"
    assert preemptions(SERVING, decision) == []


def test_one_holder_fails_on_two_active_members() -> None:
    decision = SERVING.decide()
    broken = attrs.evolve(
        decision,
        members=tuple(attrs.evolve(m, state=SharedState.ACTIVE) for m in decision.members),
    )
    with pytest.raises(AssertionError, match=r"\['batch', 'chat'\]"):
        check_one_holder(SERVING, broken)


def test_priority_fails_when_a_lower_priority_member_takes_a_ready_holder() -> None:
    # The decision for a group where chat had failed: batch leads.
    failed = attrs.evolve(SERVING, models=(attrs.evolve(CHAT, phase=Phase.FAILED), BATCH))
    with pytest.raises(AssertionError, match=r"chat \(priority 500\) lost the card to batch"):
        check_priority(SERVING, failed.decide())
    assert preemptions(SERVING, failed.decide()) == []  # chat was Failed there, not Ready


def test_cooldown_fails_when_the_card_moves_inside_it() -> None:
    # coder was preempted a minute ago (5m cooldown) and batch holds the card; chat,
    # higher priority and demanded, must wait.
    coder = ModelState(
        name="coder", group="gpu-0", phase=Phase.PREEMPTED, preempted_at=T0 - timedelta(minutes=1)
    )
    batch = attrs.evolve(BATCH, phase=Phase.READY, shared_state=SharedState.ACTIVE)
    chat = attrs.evolve(
        CHAT, phase=Phase.IDLE, shared_state=SharedState.QUEUED, last_active=T0, replicas=0
    )
    inside = GroupScenario(models=(chat, batch, coder), now=T0, running=frozenset({"batch"}))
    assert check_invariants(inside).leader == "batch"
    outside = attrs.evolve(inside, models=(chat, batch, attrs.evolve(coder, preempted_at=None)))
    assert outside.decide().leader == "chat"
    with pytest.raises(AssertionError, match=r"chat took the card from \['batch'\]"):
        check_cooldown(inside, outside.decide())


def test_lease_check_fails_when_a_leased_group_has_a_leader() -> None:
    leased = attrs.evolve(SERVING, leases=(GpuLease(name="ft", group="gpu-0", owner="ft"),))
    assert check_invariants(leased).leader is None
    with pytest.raises(AssertionError, match="chat leads under a lease"):
        check_lease_parks_the_group(leased, SERVING.decide())


def test_break_before_make_fails_when_the_leader_starts_beside_old_pods() -> None:
    # batch preempted a Ready chat whose pods are still there: batch must wait.
    takeover = GroupScenario(
        models=(attrs.evolve(CHAT, priority=50), attrs.evolve(BATCH, priority=100)),
        now=T0,
        running=frozenset({"chat"}),
    )
    assert check_invariants(takeover).member("batch").desired_replicas == 0
    no_pods = attrs.evolve(takeover, running=frozenset())
    with pytest.raises(AssertionError, match=r"batch scaled up while \['chat'\]"):
        check_break_before_make(takeover, no_pods.decide())


def test_group_scenarios_for_refuses_members_of_several_groups() -> None:
    with pytest.raises(ValueError, match="one namespace and group"):
        group_scenarios_for([CHAT, attrs.evolve(BATCH, group="gpu-1")])
    with pytest.raises(ValueError, match="at least one member"):
        group_scenarios_for([])
