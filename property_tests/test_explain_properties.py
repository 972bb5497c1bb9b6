"""`flexinfer explain` says what the controller decides, rule by rule, for every input.

The explanation is built from the controller's own functions; these properties pin
that down (same election, same decision, exactly one deciding rule, in spec order),
and check that every change it announces really happens at the instant it names.
"""

from __future__ import annotations

from datetime import datetime

import attrs
from hypothesis import given

from flexinfer_core import (
    GpuGroupPhase,
    GpuGroupState,
    apply_decision,
    decide_gpu_group,
    decide_group,
    elect_leader,
)
from flexinfer_core.election import RULES, explain_election
from flexinfer_core.explain import explain_group
from flexinfer_core.gpugroup import GPU_GROUP_RULES, explain_gpu_group
from flexinfer_core.testing.strategies import GroupScenario, gpu_group_states, group_scenarios


@given(group_scenarios(lease_unreadable=None))
def test_the_trace_is_the_election_with_one_deciding_rule(sc: GroupScenario) -> None:
    trace = explain_election(
        sc.models,
        now=sc.now,
        leases=sc.leases,
        unreadable_lease_sources=sc.unreadable_lease_sources,
    )
    assert trace.election == elect_leader(
        sc.models,
        now=sc.now,
        leases=sc.leases,
        unreadable_lease_sources=sc.unreadable_lease_sources,
    )
    assert [(r.number, r.name) for r in trace.rules] == list(RULES)
    deciding = [r for r in trace.rules if r.applied]
    assert len(deciding) == 1
    assert deciding[0].number != 6  # classify never decides
    # The message is the deciding rule's own (the fail-open prefix aside).
    assert trace.election.message.endswith(deciding[0].why)


@given(group_scenarios(lease_unreadable=None))
def test_explain_decides_exactly_what_the_controller_decides(sc: GroupScenario) -> None:
    explanation = explain_group(
        sc.models,
        now=sc.now,
        leases=sc.leases,
        unreadable_lease_sources=sc.unreadable_lease_sources,
        running=sc.running,
    )
    assert explanation.decision == sc.decide()


@given(group_scenarios(min_size=1))
def test_an_announced_change_happens_at_its_instant_and_not_before(sc: GroupScenario) -> None:
    """With nobody demanded (so no demand is assumed to continue), the first change
    explain announces is what deciding the applied state says at that instant, and
    the instant just before it still decides as now."""
    quiet = attrs.evolve(
        sc,
        models=tuple(
            attrs.evolve(m, last_active=None) if m.last_active is not None else m for m in sc.models
        ),
    )
    explanation = explain_group(quiet.models, now=quiet.now, leases=quiet.leases)
    change = explanation.next_change
    if change is None:
        return
    applied = apply_decision(quiet.models, explanation.decision)
    running = frozenset(m.name for m in explanation.decision.members if m.desired_replicas > 0)
    settled = decide_group(applied, now=quiet.now, leases=quiet.leases, running=running)
    at = decide_group(applied, now=change.at, leases=quiet.leases, running=running)
    assert (at.leader, at.reason) == (change.leader, change.reason)
    assert (at.leader, at.reason, [m.desired_replicas for m in at.members]) != (
        settled.leader,
        settled.reason,
        [m.desired_replicas for m in settled.members],
    )
    assert change.when  # every announced change names what crosses then


@given(gpu_group_states())
def test_the_gpu_group_trace_is_the_decision_with_one_deciding_step(
    case: tuple[GpuGroupState, datetime],
) -> None:
    state, now = case
    trace = explain_gpu_group(state, now=now)
    assert trace.decision == decide_gpu_group(state, now=now)
    assert [(r.number, r.name) for r in trace.rules] == list(GPU_GROUP_RULES)
    deciding = [r.number for r in trace.rules if r.applied and r.number <= 10]
    assert len(deciding) == 1
    # The drain step applies exactly when the holder waits for the old pods.
    assert trace.rules[-1].applied == (trace.decision.phase is GpuGroupPhase.DRAINING)
