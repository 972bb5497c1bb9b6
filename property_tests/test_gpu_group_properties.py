"""Properties of the v1alpha1 GPUGroup decision (docs/election.md section 3)."""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs
from hypothesis import event, given
from hypothesis import strategies as st

from flexinfer_core import (
    GpuGroupAction,
    GpuGroupDecision,
    GpuGroupMember,
    GpuGroupState,
    PreemptionPolicy,
    decide_gpu_group,
)
from flexinfer_core.gpugroup import record_gpu_group_decision
from flexinfer_core.gpugroup_packing import (
    PackedGpuGroupDecision,
    decide_packed_gpu_group,
    record_packed_decision,
    settled_packing,
)
from flexinfer_core.testing.strategies import gpu_group_states
from flexinfer_k8s.convert_gpugroups import gpu_group_status
from flexinfer_k8s.status_diff import status_differs

Case = tuple[GpuGroupState, datetime]
GIB = 2**30


record = record_gpu_group_decision


def with_live_demand(state: GpuGroupState, now: datetime) -> GpuGroupState:
    """docs/resources.md, written out: a report more than 5 minutes old is no demand."""
    return attrs.evolve(
        state,
        members=tuple(
            attrs.evolve(m, queued=0, oldest_waiting=None)
            if m.reported_at is not None and now - m.reported_at > timedelta(minutes=5)
            else m
            for m in state.members
        ),
    )


def member_order(m: GpuGroupMember) -> tuple[int, int, float, str]:
    """spec 3.1, written out: queued first, priority desc, oldest waiting first, name."""
    waiting = m.oldest_waiting.timestamp() if m.oldest_waiting is not None else float("inf")
    return (0 if m.queued else 1, -m.priority, waiting, m.name)


def check_deterministic(
    state: GpuGroupState, now: datetime, decision: GpuGroupDecision, data: st.DataObject
) -> None:
    """Deciding twice gives the same decision; so does listing the members in another order."""
    assert decide_gpu_group(state, now=now) == decision
    shuffled = attrs.evolve(state, members=data.draw(st.permutations(state.members)))
    # The members come from spec.models[], whose order the user fixes; only a message
    # that lists missing members may follow it.
    assert attrs.evolve(decide_gpu_group(shuffled, now=now), message="") == attrs.evolve(
        decision, message=""
    )


def check_one_scaled_member(decision: GpuGroupDecision) -> None:
    """At most one member wants replicas, and it is the active model."""
    scaled = [name for name, n in decision.desired_replicas if n > 0]
    assert scaled in ([], [decision.active_model])


def check_graceful_drain(state: GpuGroupState, now: datetime, decision: GpuGroupDecision) -> None:
    """Graceful: the holder starts only once the others' pods are gone or the drain timed out."""
    for name, replicas in decision.desired_replicas:
        member = state.member(name)
        assert member is not None
        others_have_pods = any(m.has_pods for m in state.members if m.name != name)
        if replicas and not member.has_pods and others_have_pods:
            # Only once the drain timeout since the swap has run out, or Immediate. (No
            # recorded swap at all: there is no drain to wait for; docs/election.md.)
            swapped = decision.last_swap_time
            assert (
                state.preemption_policy is PreemptionPolicy.IMMEDIATE
                or swapped is None
                or (now >= swapped + state.drain_timeout)
            )


@given(gpu_group_states(), st.data())
def test_every_decision_keeps_the_invariants(case: Case, data: st.DataObject) -> None:
    state, now = case
    decision = decide_gpu_group(state, now=now)
    check_deterministic(state, now, decision, data)
    check_one_scaled_member(decision)
    check_graceful_drain(state, now, decision)


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


def _gate_holds(state: GpuGroupState, winner: GpuGroupMember, now: datetime) -> str | None:
    """spec 3.3–3.4, written out: which anti-thrashing rule keeps the current model, if any
    ("several" when more than one does)."""
    anti = state.anti_thrashing
    gates = {
        "queue below threshold": winner.queued < anti.request_queue_threshold,
        "hysteresis": anti.hysteresis_window.total_seconds() > 0
        and winner.oldest_waiting is not None
        and now - winner.oldest_waiting < anti.hysteresis_window,
        "minimum run": state.last_swap_time is not None
        and now - state.last_swap_time < anti.minimum_run_duration,
        "cooldown after preemption": winner.preempted_at is not None
        and now - winner.preempted_at < anti.cooldown_after_preemption,
    }
    holding = [name for name, holds in gates.items() if holds]
    return holding[0] if len(holding) == 1 else ("several" if holding else None)


def _in_use(state: GpuGroupState, current: GpuGroupMember, now: datetime) -> bool:
    """The current model is serving: queued requests, or activity within its idle timeout."""
    times = [t for t in (current.last_request, state.last_swap_time) if t is not None]
    return current.queued > 0 or (bool(times) and now - max(times) < current.idle_timeout)


GATES = ("none", "queue below threshold", "hysteresis", "minimum run", "cooldown after preemption")
_JUST_UNDER = st.sampled_from((0.0, 0.5, 0.999))  # fraction of a gate's window already gone


@st.composite
def contested_states(draw: st.DrawFn) -> Case:
    """Anti-thrashing on; the current model is in use and a queued model outranks it; and
    exactly one gate (or none) set up to hold, each about as often as the others, at
    its window's edges too. Other members keep their random demand."""
    state, now = draw(gpu_group_states(min_members=2))
    current, challenger = draw(st.permutations([m.name for m in state.members]))[:2]
    target = draw(st.sampled_from(GATES))
    event(f"target gate: {target}")
    anti = attrs.evolve(
        state.anti_thrashing,
        enabled=True,
        request_queue_threshold=3
        if target == "queue below threshold"
        else draw(st.sampled_from((1, 2, 3))),
        hysteresis_window=timedelta(seconds=10),
        minimum_run_duration=timedelta(seconds=30),
        cooldown_after_preemption=timedelta(seconds=60),
    )

    def inside(window: timedelta) -> timedelta:
        return window * draw(_JUST_UNDER)

    def outside(window: timedelta) -> timedelta:
        return window + draw(
            st.sampled_from((timedelta(0), timedelta(seconds=1), timedelta(minutes=5)))
        )

    queued = (
        draw(st.sampled_from((1, 2)))
        if target == "queue below threshold"
        else max(anti.request_queue_threshold, draw(st.sampled_from((3, 5))))
    )
    waited = (
        inside(anti.hysteresis_window)
        if target == "hysteresis"
        else outside(anti.hysteresis_window)
    )
    swapped = (
        inside(anti.minimum_run_duration)
        if target == "minimum run"
        else outside(anti.minimum_run_duration)
    )
    preempted = (
        now - inside(anti.cooldown_after_preemption)
        if target == "cooldown after preemption"
        else draw(st.sampled_from((None, now - outside(anti.cooldown_after_preemption))))
    )
    members = tuple(
        attrs.evolve(
            m,
            exists=True,
            conflict="",
            last_request=now - draw(_RECENT),
            priority=min(m.priority, 999),
        )
        if m.name == current
        else attrs.evolve(
            m,
            exists=True,
            conflict="",
            priority=1000,
            queued=queued,
            oldest_waiting=now - waited,
            reported_at=now,
            preempted_at=preempted,
        )
        if m.name == challenger
        else attrs.evolve(m, priority=min(m.priority, 999))
        for m in state.members
    )
    contested = attrs.evolve(
        state,
        members=members,
        current_model=current,
        last_swap_time=now - swapped,
        anti_thrashing=anti,
    )
    return contested, now


_RECENT = st.sampled_from((timedelta(0), timedelta(seconds=5), timedelta(seconds=19)))


@given(contested_states())
def test_anti_thrashing_never_swaps_while_a_gate_holds(case: Case) -> None:
    state, now = case
    decision = decide_gpu_group(state, now=now)
    state = with_live_demand(state, now)
    # A member in conflict runs in no group (flexinfer_core.membership).
    existing = sorted((m for m in state.members if m.exists and not m.conflict), key=member_order)
    current = state.member(state.current_model) if state.current_model else None
    assert current is not None and current.exists  # contested_states builds them so
    winner = existing[0]
    assert winner.name != current.name and _in_use(state, current, now)
    gate = _gate_holds(state, winner, now)
    event(f"gate: {gate}")
    if gate:
        assert decision.action is not GpuGroupAction.SWAP
        assert decision.active_model == current.name
        assert decision.swap_count == state.swap_count
    else:
        assert decision.action is GpuGroupAction.SWAP
        assert decision.active_model == winner.name


# --- a GPUGroup with spec.vramBudget, as the controller with a device class writes it ------


def _store(group: dict[str, object], status: dict[str, object]) -> dict[str, object]:
    """What the API server keeps after the status merge patch (nulls delete)."""

    def merged(into: object, patch: object) -> object:
        if not isinstance(patch, dict):
            return patch
        out = dict(into) if isinstance(into, dict) else {}
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = merged(out.get(key), value)
        return out

    return {**group, "status": merged(group.get("status"), status)}


def _written(
    group: dict[str, object], state: GpuGroupState, now: datetime
) -> tuple[PackedGpuGroupDecision, dict[str, object]]:
    packed = decide_packed_gpu_group(state, now=now)
    status = gpu_group_status(
        group, packed.decision, now=now, state=state,
        packing=settled_packing(state, packed, now=now),
    )  # fmt: skip
    return packed, status


@given(gpu_group_states(), st.data())
def test_a_packed_gpu_group_status_is_written_once(case: Case, data: st.DataObject) -> None:
    """A budgeted GPUGroup decided with a shared card (any footprints, any members
    seated before): once its status is written and read back (the recorded states are
    the seats, `record_packed_decision`), the next reconcile at the same instant, pods
    as they were, finds the same holders, replicas, Events-free, and a status that does
    not differ from the stored one: it writes nothing."""
    state, now = case
    sizes = st.sampled_from((None, 4 * GIB, 8 * GIB, 16 * GIB))
    state = attrs.evolve(
        state,
        vram_budget=data.draw(st.sampled_from((16 * GIB, 24 * GIB))),
        members=tuple(
            attrs.evolve(m, vram_estimate=data.draw(sizes), seated=data.draw(st.booleans()))
            for m in state.members
        ),
    )
    group: dict[str, object] = {"metadata": {"name": "gg", "namespace": "ns", "generation": 1}}
    first, status = _written(group, state, now)
    stored = _store(group, status)
    again, second = _written(stored, record_packed_decision(state, first), now)
    assert set(again.packing.holders) == set(first.packing.holders)
    assert again.decision.desired_replicas == first.decision.desired_replicas
    assert again.decision.member_events == () and again.decision.group_events == ()
    # Section 3's own words may move once with no news (an idle-out's message turns
    # into "no queued requests"; see test_recording_the_decision_is_a_fixed_point, which
    # leaves them out too): everything the packing writes is compared.
    was = stored["status"]
    assert isinstance(was, dict)
    if status_differs(_packing_fields(was), _packing_fields(second)):
        a, b = _packing_fields(was), _packing_fields(second)
        raise AssertionError({k: (a[k], b[k]) for k in a if a[k] != b[k]})


def _packing_fields(status: dict[str, object]) -> dict[str, object]:
    conditions = status["conditions"]
    assert isinstance(conditions, list)
    return {
        **{k: status.get(k) for k in ("activeModel", "phase", "swapCount", "modelStatuses")},
        "vram": status.get("vram"),
        "conditions": [c for c in conditions if c["type"] == "Packed"],
    }
