"""GPUGroup packing: members that fit hold the card together (docs/election.md 3, "Packing").

The rules of docs/election.md 1.7 read for a GPUGroup: `decide_packed_gpu_group` takes
the decision of section 3 (`decide_gpu_group`, unchanged: its holder is the leader),
then admits other members beside the leader while their footprints
(`spec.models[].vramEstimate`) fit `spec.vramBudget`:

1. the leader, whatever its footprint (unknown, or above the budget: it is alone);
2. the members that hold a seat (`seated`: their recorded state is Active), best
   first (`member_order`), while they fit and are still in use (requests queued, or
   a request or the card's last swap younger than their idle timeout);
3. the members with queued requests, best first, while they fit. One that does not
   fit evicts seated members (never the leader), the lowest-ranked first and only as
   many as it needs, each only when its priority is higher, and never while its own
   cooldown after preemption runs. When even that would not make room, it waits.

The leader is whoever section 3 names, as without a budget: when that is a member
already on the card, the leader's name moves (a swap is recorded) but the set stays,
and the former leader keeps its seat while it fits and is in use, with no eviction.
When section 3 idles the group because the leader idled out while a seated member is
still in use, that member leads instead (no swap is recorded).

Break-before-make by memory: a holder without pods starts only when the footprints of
every member with pods (terminating ones included; unknown: the whole card) and of
the holders started before it, in the order of the set, plus its own fit the budget.
A member evicted from its seat is scaled to 0 at once (Preempted, with a Warning
Event naming who needed the room); its footprint counts until its pods are gone.

With no budget, or a leader whose footprint is unknown or above the budget (it holds
the card alone), the decision is exactly `decide_gpu_group`'s. The controller decides
with this when it has a DRA device class (`--gpu-device-class`), so that the holders'
pods can share the group's one ResourceClaim (`flexinfer_k8s.reconcile_gpugroup`);
without one, a budgeted GPUGroup's members take turns (`decide_gpu_group`) and its
`Packed` condition says why. `settled_packing` is the packing as it reads once the
decision is written: what the GPUGroup's status says of it. `decide_gpu_group_on_card`
is the whole rule as the controller applies it, and `flexinfer explain`, `status` and
`doctor` with it: packed when the card can be shared and the group sets a budget, else
section 3 alone.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import attrs

from flexinfer_core import reasons
from flexinfer_core.gpugroup import (
    GpuGroupAction,
    GpuGroupDecision,
    GpuGroupMember,
    GpuGroupPhase,
    GpuGroupState,
    MemberState,
    _without_stale_demand,
    decide_gpu_group,
    member_order,
    record_gpu_group_decision,
)
from flexinfer_core.group import Event
from flexinfer_core.packing import Seat, _no_room, format_gib


@attrs.frozen
class GpuGroupPacking:
    """The set of holders (leader first, then best first), every member's `Seat` (in
    `member_order`), the members evicted from a seat with who needed the room, the
    holders that wait for memory before they start, and the budget's use by the
    admitted footprints (0 when the leader is alone)."""

    budget: int | None
    holders: tuple[str, ...]
    seats: tuple[Seat, ...]
    evicted: tuple[tuple[str, str], ...] = ()
    waiting: tuple[str, ...] = ()
    used: int = 0

    def seat(self, name: str) -> Seat:
        return next(seat for seat in self.seats if seat.name == name)

    @property
    def packed(self) -> bool:
        return len(self.holders) > 1


@attrs.frozen
class PackedGpuGroupDecision:
    """The section 3 decision as packing revises it, and the packing."""

    decision: GpuGroupDecision
    packing: GpuGroupPacking


def _in_use(state: GpuGroupState, m: GpuGroupMember, *, now: datetime) -> bool:
    if m.queued > 0:
        return True
    times = [m.last_request]
    if _seated(state, m):
        # As for the active model (section 3): the card's last swap counts as activity
        # of every member on it, so one that stays seated through a swap is in use.
        times.append(state.last_swap_time)
    last = max((t for t in times if t is not None), default=None)
    return last is not None and now - last < m.idle_timeout


def _cooling(state: GpuGroupState, m: GpuGroupMember, *, now: datetime) -> bool:
    cooldown = state.anti_thrashing.cooldown_after_preemption
    return m.preempted_at is not None and now - m.preempted_at < cooldown


def _seated(state: GpuGroupState, m: GpuGroupMember) -> bool:
    return m.seated or m.name == state.current_model


def _alone(
    state: GpuGroupState, decision: GpuGroupDecision, why: str, *, budget: int | None
) -> GpuGroupPacking:
    leader = decision.active_model
    seats = tuple(
        Seat(m.name, True, decision.reason, f"holds the card alone: {why}")
        if m.name == leader
        else Seat(m.name, False, reasons.QUEUED, f"not packed: {why}")
        for m in sorted(state.members, key=member_order)
    )
    return GpuGroupPacking(budget, () if leader is None else (leader,), seats)


def pack_gpu_group(
    state: GpuGroupState, decision: GpuGroupDecision, *, now: datetime
) -> GpuGroupPacking:
    """The set of holders beside `decision`'s active model (see the module docstring).
    `state` is the group as observed, stale demand reports read as none."""
    size = state.vram_budget
    leader = state.member(decision.active_model) if decision.active_model else None
    if size is None:
        return _alone(state, decision, "the GPUGroup sets no spec.vramBudget", budget=None)
    if leader is None:
        return _alone(state, decision, "no member holds the GPU", budget=size)
    if leader.vram_estimate is None:
        return _alone(state, decision, f"{leader.name}'s footprint is unknown", budget=size)
    if leader.vram_estimate > size:
        return _alone(state, decision, _no_room(leader, leader.vram_estimate, 0, size), budget=size)
    ranked = sorted((m for m in state.members if m.eligible), key=member_order)
    order = {m.name: i for i, m in enumerate(ranked)}
    admitted = [leader]
    used = leader.vram_estimate
    said = {
        leader.name: Seat(
            leader.name,
            True,
            decision.reason,
            f"leads: {format_gib(leader.vram_estimate)} of {format_gib(size)} GiB",
        )
    }
    evicted: list[tuple[str, str]] = []
    for m in ranked:
        if m is leader or not _seated(state, m) or not _in_use(state, m, now=now):
            continue
        need = m.vram_estimate
        if need is not None and used + need <= size:
            admitted.append(m)
            used += need
            said[m.name] = Seat(m.name, True, reasons.CO_RESIDENT, "")
        else:
            evicted.append((m.name, leader.name))
            said[m.name] = Seat(
                m.name,
                False,
                reasons.EVICTED_FOR_VRAM,
                f"{_no_room(m, need, size - used, size)}; {leader.name} leads",
            )
    for m in ranked:
        if m.name in said or m.queued == 0:
            continue
        need, free = m.vram_estimate, size - used
        if need is None or need > size:
            said[m.name] = Seat(
                m.name, False, reasons.WAITING_FOR_VRAM, _no_room(m, need, free, size)
            )
            continue
        if need > free:
            victims: list[GpuGroupMember] = []
            room = free
            cooling = _cooling(state, m, now=now)
            for seated in sorted(admitted[1:], key=lambda s: order[s.name], reverse=True):
                if room >= need:
                    break
                if not cooling and m.priority > seated.priority:
                    victims.append(seated)
                    room += seated.vram_estimate or 0
            if room < need:
                blocker = (
                    f"{m.name} was preempted less than its cooldown ago"
                    if cooling
                    else f"{m.name} may not evict {', '.join(s.name for s in admitted)}"
                    " (an equal or higher priority)"
                )
                said[m.name] = Seat(
                    m.name,
                    False,
                    reasons.WAITING_FOR_VRAM,
                    f"{_no_room(m, need, free, size)}; {blocker}",
                )
                continue
            for victim in victims:
                admitted.remove(victim)
                used -= victim.vram_estimate or 0
                evicted.append((victim.name, m.name))
                said[victim.name] = Seat(
                    victim.name,
                    False,
                    reasons.EVICTED_FOR_VRAM,
                    f"evicted by {m.name}: it needs {format_gib(need)} GiB, "
                    f"{format_gib(free)} free",
                )
            words = (
                f"evicts {', '.join(v.name for v in victims)}: needs {format_gib(need)} GiB, "
                f"{format_gib(free)} free"
            )
        else:
            words = ""
        admitted.append(m)
        used += need
        said[m.name] = Seat(m.name, True, reasons.CO_RESIDENT, words)
    holders = (leader.name, *sorted((m.name for m in admitted[1:]), key=order.__getitem__))
    fits = f"fits: {format_gib(used)} of {format_gib(size)} GiB used"
    seats = []
    for m in sorted(state.members, key=member_order):
        seat = said.get(m.name) or Seat(
            m.name,
            False,
            reasons.QUEUED,
            f"{m.name} is idle past its idle timeout and gives up its seat"
            if _seated(state, m)
            else f"{m.name} has no queued requests",
        )
        if seat.admitted:
            seat = attrs.evolve(seat, message=f"{seat.message}; {fits}" if seat.message else fits)
        seats.append(seat)
    waiting = _memory_gate(state, holders, size=size)
    return GpuGroupPacking(size, holders, tuple(seats), tuple(evicted), waiting, used)


def _memory_gate(state: GpuGroupState, holders: Iterable[str], *, size: int) -> tuple[str, ...]:
    """The holders whose pods may not start yet: in the order of the set, each starts
    when the footprints of the members with pods and of the holders started before it,
    plus its own, fit (an unknown footprint takes the whole card)."""
    live = {m.name: m.vram_estimate for m in state.members if m.has_pods}
    waiting = []
    for name in holders:
        if name in live:
            continue
        own = next(m.vram_estimate for m in state.members if m.name == name)
        sizes = list(live.values())
        if own is None or None in sizes or sum(s or 0 for s in sizes) + own > size:
            waiting.append(name)
        else:
            live[name] = own
    return tuple(waiting)


def _promoted(
    state: GpuGroupState, decision: GpuGroupDecision, *, now: datetime, budget: int
) -> str | None:
    """When the section 3 decision idles the group (the active model idled out) while
    a seated member of known footprint within the budget is still in use: the best such
    member, which keeps the card."""
    if decision.active_model is not None or decision.phase is GpuGroupPhase.FAILED:
        return None
    in_use = [
        m
        for m in sorted(state.members, key=member_order)
        if m.eligible
        and m.seated
        and m.name != state.current_model
        and m.vram_estimate is not None
        and m.vram_estimate <= budget
        and _in_use(state, m, now=now)
    ]
    return in_use[0].name if in_use else None


def decide_packed_gpu_group(state: GpuGroupState, *, now: datetime) -> PackedGpuGroupDecision:
    """`decide_gpu_group`, then the packing (see the module docstring). With no budget
    the decision is `decide_gpu_group`'s, unchanged."""
    plain = decide_gpu_group(state, now=now)
    if state.vram_budget is None:
        return PackedGpuGroupDecision(
            plain, _alone(state, plain, "the GPUGroup sets no spec.vramBudget", budget=None)
        )
    observed = _without_stale_demand(state, now=now)
    decision = plain
    promoted = _promoted(observed, decision, now=now, budget=state.vram_budget)
    if promoted is not None:
        decision = attrs.evolve(
            decision,
            action=GpuGroupAction.KEEP,
            active_model=promoted,
            reason=reasons.KEEP_CURRENT,
            message=f"{promoted} keeps the GPU: it is still in use",
        )
    packing = pack_gpu_group(observed, decision, now=now)
    if not packing.used:  # the leader is alone: exactly section 3's decision
        return PackedGpuGroupDecision(plain, packing)
    return PackedGpuGroupDecision(_revised(observed, decision, packing, now=now), packing)


def _revised(
    state: GpuGroupState, decision: GpuGroupDecision, packing: GpuGroupPacking, *, now: datetime
) -> GpuGroupDecision:
    """`decision` for a packed set: replicas by the memory gate, every holder Active,
    every evicted member Preempted (with its Event), the phase from the leader."""
    leader = packing.holders[0]
    holders = set(packing.holders)
    evicted = dict(packing.evicted)
    waiting = set(packing.waiting)
    # Members the section 3 decision keeps up while they drain stay up.
    draining = {n for n, r in decision.desired_replicas if r and n != decision.active_model}
    desired = tuple(
        (name, 1 if (name in holders and name not in waiting) or name in draining else 0)
        for name, _ in decision.desired_replicas
    )
    by_name = {m.name: m for m in state.members}
    statuses = []
    for row in decision.member_statuses:
        if row.name == leader:
            row = attrs.evolve(row, state=MemberState.ACTIVE, preempted_at=None, preempted_by="")
        elif row.name in holders:
            # Not preempted by this decision (it keeps its seat), but an earlier
            # preemption's record stays, and with it its cooldown: cleared, the next
            # decision could name it leader at once with no news (a swap of names).
            seated = by_name[row.name]
            row = attrs.evolve(
                row,
                state=MemberState.ACTIVE,
                preempted_at=seated.preempted_at,
                preempted_by=seated.preempted_by,
            )
        elif row.name in evicted:
            # Queued requests outrank the eviction in what it is called, as in section
            # 3 (and so in the next decision): Queued, else Preempted.
            queued = row.state is MemberState.QUEUED
            row = attrs.evolve(
                row,
                state=MemberState.QUEUED if queued else MemberState.PREEMPTED,
                preempted_at=now,
                preempted_by=evicted[row.name],
            )
        statuses.append(row)
    # The Preempted Event of a member that keeps its seat goes, and an evicted member's
    # is the one below, which says who needed the room.
    events = tuple(
        e
        for e in decision.member_events
        if not (e.reason == reasons.PREEMPTED and (e.model in holders or e.model in evicted))
    ) + tuple(
        Event(
            name,
            reasons.PREEMPTED,
            packing.seat(name).message,
            type="Warning",
        )
        for name, by in packing.evicted
    )
    action, reason, message = decision.action, decision.reason, decision.message
    head = by_name[leader]
    if leader in waiting:
        phase = GpuGroupPhase.DRAINING
        if action is not GpuGroupAction.SWAP:
            action, reason = GpuGroupAction.DRAIN, reasons.DRAINING
            message = f"waiting for room on the card before starting {leader}"
    else:
        phase = GpuGroupPhase.ACTIVE if head.ready else GpuGroupPhase.SWAPPING
        if action is GpuGroupAction.DRAIN:
            action, reason = GpuGroupAction.KEEP, reasons.KEEP_CURRENT
            message = f"{leader} holds the GPU"
    return attrs.evolve(
        decision,
        action=action,
        reason=reason,
        message=message,
        desired_replicas=desired,
        phase=phase,
        member_statuses=tuple(statuses),
        member_events=events,
    )


def record_packed_decision(state: GpuGroupState, packed: PackedGpuGroupDecision) -> GpuGroupState:
    """The GPUGroup as observed once the packed decision's status is written: as
    `record_gpu_group_decision`, and every member Active in it holds a seat."""
    recorded = record_gpu_group_decision(state, packed.decision)
    active = {s.name for s in packed.decision.member_statuses if s.state is MemberState.ACTIVE}
    return attrs.evolve(
        recorded,
        members=tuple(attrs.evolve(m, seated=m.name in active) for m in recorded.members),
    )


def settled_packing(
    state: GpuGroupState, packed: PackedGpuGroupDecision, *, now: datetime
) -> GpuGroupPacking:
    """The packing of `packed` as it reads once its status is written (`record_packed_
    decision`): the same holders, each member's words as the next decision with no news
    says them (a newcomer admitted by demand is then seated, a member just evicted is
    then cooling). What the GPUGroup's status says of the packing is read from this, so
    the next reconcile rewrites nothing."""
    recorded = _without_stale_demand(record_packed_decision(state, packed), now=now)
    return pack_gpu_group(recorded, packed.decision, now=now)


@attrs.frozen
class GpuGroupOutcome:
    """A GPUGroup decided as the controller decides it: the decision, its packing as the
    status writes it (`settled_packing`; None: the members take turns) and the members
    that hold the card (the leader alone unless packed)."""

    decision: GpuGroupDecision
    packing: GpuGroupPacking | None
    holders: frozenset[str]


def decide_gpu_group_on_card(
    state: GpuGroupState, *, now: datetime, shared_card: bool
) -> GpuGroupOutcome:
    """The decision for a GPUGroup: with `shared_card` (the controller's
    `--gpu-device-class`: the cluster can put two servers on one card) and a budget,
    `decide_packed_gpu_group`; otherwise `decide_gpu_group`, one member at a time.
    `state`: the group as observed, a member whose pods cannot share the card read with
    an unknown footprint."""
    if not shared_card or state.vram_budget is None:
        decision = decide_gpu_group(state, now=now)
        return GpuGroupOutcome(decision, None, _holder(decision))
    packed = decide_packed_gpu_group(state, now=now)
    holders = frozenset(packed.packing.holders) if packed.packing.used else _holder(packed.decision)
    return GpuGroupOutcome(packed.decision, settled_packing(state, packed, now=now), holders)


def record_gpu_group_outcome(state: GpuGroupState, outcome: GpuGroupOutcome) -> GpuGroupState:
    """The GPUGroup as observed once `outcome`'s status is written: with a packing,
    every member Active in it holds a seat (`record_packed_decision`)."""
    if outcome.packing is None:
        return record_gpu_group_decision(state, outcome.decision)
    return record_packed_decision(state, PackedGpuGroupDecision(outcome.decision, outcome.packing))


def _holder(decision: GpuGroupDecision) -> frozenset[str]:
    return frozenset({decision.active_model} if decision.active_model else ())


__all__ = [
    "GpuGroupOutcome",
    "GpuGroupPacking",
    "PackedGpuGroupDecision",
    "decide_gpu_group_on_card",
    "decide_packed_gpu_group",
    "pack_gpu_group",
    "record_gpu_group_outcome",
    "record_packed_decision",
    "settled_packing",
]
