"""Properties of draining before preemption (docs/election.md 1.6)."""

from __future__ import annotations

from datetime import timedelta

import attrs
from hypothesis import given

from flexinfer_core import Phase
from flexinfer_core.drain import drain_deadline, in_flight
from flexinfer_core.testing import check_invariants
from flexinfer_core.testing.strategies import (
    GroupScenario,
    draining_scenarios,
    group_scenarios,
)


@given(draining_scenarios())
def test_the_invariants_hold_while_members_drain(sc: GroupScenario) -> None:
    # One holder; only it and a drainer want replicas; a drainer never scales up; the
    # leader without pods waits while one drains; applying and deciding again is a no-op.
    check_invariants(sc)


@given(draining_scenarios())
def test_a_drain_is_entered_only_with_fresh_requests_in_flight(sc: GroupScenario) -> None:
    decision = sc.decide()
    for target in decision.members:
        observed = sc.member(target.name)
        if target.phase is Phase.DRAINING and observed.phase is not Phase.DRAINING:
            assert observed.phase is Phase.READY
            assert target.name != decision.leader
            assert in_flight(observed, sc.now) > 0
            assert observed.drain_timeout > timedelta(0)
            assert target.draining_since == sc.now


@given(draining_scenarios())
def test_a_drain_ends_at_zero_in_flight_or_at_its_deadline(sc: GroupScenario) -> None:
    decision = sc.decide()
    for target in decision.members:
        observed = sc.member(target.name)
        if observed.phase is not Phase.DRAINING or target.name == decision.leader:
            continue
        deadline = drain_deadline(observed)
        if deadline is not None and sc.now < deadline and in_flight(observed, sc.now) > 0:
            assert target.phase is Phase.DRAINING
            assert target.draining_since == observed.draining_since
            # the timer wakes the controller at the deadline at the latest
            assert decision.next_change_at is not None
            assert decision.next_change_at <= deadline
        else:
            assert (target.phase, target.desired_replicas) == (Phase.PREEMPTED, 0)
            assert target.preempted_at == sc.now


@given(group_scenarios(), draining_scenarios())
def test_drain_timeout_zero_decides_exactly_as_without_draining(
    sc: GroupScenario, facts: GroupScenario
) -> None:
    # Any in-flight reports, but every drain timeout 0: the decision is the one made
    # before draining existed.
    reports = [(m.in_flight, m.in_flight_at) for m in facts.models]
    with_reports = tuple(
        attrs.evolve(
            m,
            drain_timeout=timedelta(0),
            in_flight=reports[i % len(reports)][0],
            in_flight_at=reports[i % len(reports)][1],
        )
        for i, m in enumerate(sc.models)
    )
    before, after = sc.decide(), attrs.evolve(sc, models=with_reports).decide()
    assert (after.leader, after.reason, after.message) == (
        before.leader,
        before.reason,
        before.message,
    )
    assert after.members == before.members
    assert after.next_change_at == before.next_change_at
