"""Properties of the v1alpha1 GPUGroup decision (spec/election.md section 3)."""

from __future__ import annotations

from datetime import datetime

import attrs
from hypothesis import given
from hypothesis import strategies as st

from flexinfer_core import (
    GpuGroupAction,
    GpuGroupDecision,
    GpuGroupMember,
    GpuGroupState,
    PreemptionPolicy,
    decide_gpu_group,
)
from property_tests.strategies import gpu_group_states

Case = tuple[GpuGroupState, datetime]


def record(state: GpuGroupState, decision: GpuGroupDecision) -> GpuGroupState:
    """The GPUGroup as observed once the controller has written the decision's status."""
    rows = {s.name: s for s in decision.member_statuses}
    return attrs.evolve(
        state,
        current_model=decision.active_model,
        last_swap_time=decision.last_swap_time,
        last_swap_reason=decision.last_swap_reason,
        swap_count=decision.swap_count,
        members=tuple(
            attrs.evolve(
                m, preempted_at=rows[m.name].preempted_at, preempted_by=rows[m.name].preempted_by
            )
            for m in state.members
        ),
    )


def member_order(m: GpuGroupMember) -> tuple[int, int, float, str]:
    """spec 3.1, written out: queued first, priority desc, oldest waiting first, name."""
    waiting = m.oldest_waiting.timestamp() if m.oldest_waiting is not None else float("inf")
    return (0 if m.queued else 1, -m.priority, waiting, m.name)


@given(gpu_group_states(), st.data())
def test_deterministic_and_independent_of_member_order(case: Case, data: st.DataObject) -> None:
    state, now = case
    shuffled = attrs.evolve(state, members=data.draw(st.permutations(state.members)))
    first = decide_gpu_group(state, now=now)
    assert decide_gpu_group(state, now=now) == first
    # The members come from spec.models[], whose order the user fixes; only a message
    # that lists missing members may follow it.
    assert attrs.evolve(decide_gpu_group(shuffled, now=now), message="") == attrs.evolve(
        first, message=""
    )


@given(gpu_group_states())
def test_at_most_one_member_wants_replicas(case: Case) -> None:
    state, now = case
    decision = decide_gpu_group(state, now=now)
    scaled = [name for name, n in decision.desired_replicas if n > 0]
    assert len(scaled) <= 1
    if scaled:
        assert scaled == [decision.active_model]


@given(gpu_group_states())
def test_graceful_swap_breaks_before_it_makes(case: Case) -> None:
    state, now = case
    decision = decide_gpu_group(state, now=now)
    for name, replicas in decision.desired_replicas:
        member = state.member(name)
        assert member is not None
        others_have_pods = any(m.has_pods for m in state.members if m.name != name)
        if replicas and not member.has_pods and others_have_pods:
            # Only once the drain timeout since the swap has run out, or Immediate. (No
            # recorded swap: the core starts the drain clock now.)
            swapped = decision.last_swap_time or now
            assert state.preemption_policy is PreemptionPolicy.IMMEDIATE or (
                now >= swapped + state.drain_timeout
            )


@given(gpu_group_states())
def test_recording_the_decision_is_a_fixed_point(case: Case) -> None:
    state, now = case
    first = decide_gpu_group(state, now=now)
    recorded = record(state, first)
    again = decide_gpu_group(recorded, now=now)
    assert again.action is not GpuGroupAction.SWAP
    assert again.active_model == first.active_model
    assert again.desired_replicas == first.desired_replicas
    assert again.swap_count == first.swap_count
    assert again.last_swap_time == first.last_swap_time
    assert again.member_statuses == first.member_statuses
    assert again.phase == first.phase


def _gate_holds(state: GpuGroupState, winner: GpuGroupMember, now: datetime) -> bool:
    """spec 3.3–3.4, written out: does some anti-thrashing rule keep the current model?"""
    anti = state.anti_thrashing
    return (
        winner.queued < anti.request_queue_threshold
        or (
            anti.hysteresis_window.total_seconds() > 0
            and winner.oldest_waiting is not None
            and now - winner.oldest_waiting < anti.hysteresis_window
        )
        or (
            state.last_swap_time is not None
            and now - state.last_swap_time < anti.minimum_run_duration
        )
        or (
            winner.preempted_at is not None
            and now - winner.preempted_at < anti.cooldown_after_preemption
        )
    )


def _in_use(state: GpuGroupState, current: GpuGroupMember, now: datetime) -> bool:
    """The current model is serving: queued requests, or activity within its idle timeout."""
    times = [t for t in (current.last_request, state.last_swap_time) if t is not None]
    return current.queued > 0 or (bool(times) and now - max(times) < current.idle_timeout)


@given(gpu_group_states())
def test_anti_thrashing_never_swaps_while_a_gate_holds(case: Case) -> None:
    state, now = case
    existing = sorted((m for m in state.members if m.exists), key=member_order)
    current = state.member(state.current_model) if state.current_model else None
    decision = decide_gpu_group(state, now=now)
    if (
        current is None
        or not current.exists
        or not state.anti_thrashing.enabled
        or not any(m.queued for m in existing)
    ):
        return
    winner = existing[0]
    if winner.name == current.name or not _in_use(state, current, now):
        return
    if _gate_holds(state, winner, now):
        assert decision.action is not GpuGroupAction.SWAP
        assert decision.active_model == current.name
        assert decision.swap_count == state.swap_count
    else:
        assert decision.action is GpuGroupAction.SWAP
        assert decision.active_model == winner.name
