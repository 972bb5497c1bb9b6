"""VRAM co-residency: which members hold the card together, and why.

docs/election.md 1.7. With a budget (`ModelState.vram_budget`, the same on every
member), the election's leader (`flexinfer_core.election`, unchanged) is joined by
other members while their footprints (`ModelState.vram_estimate`) fit: first the
members already seated, best first, while still in use; then the demanded ones, best
first. A demanded newcomer that does not fit evicts seated members, never the leader,
the lowest-ranked first and only as many as it needs, each only when it could preempt
it as a leader (higher priority, or equal priority and the seated member idle), and
never while a swap cooldown runs. With no budget, a disagreement on it, a leader
whose footprint is unknown, or no leader at all (a lease parks everyone), the set is
the leader alone: exactly today's decision.

`PACKING` is a stage of the decision with the `Rule` shape (as `flexinfer_core.drain.
DRAIN`): it never elects; what it says is each member's place in the set. Its
thresholds are the ones the chain and the leader's replicas already list (demand
windows, idle timeouts, cooldowns), so it adds no crossing. `memory_gate` is break-
before-make by memory: whether a member's pods may start beside the live ones.

Pure: no I/O, no clock (`now` is the ballot's).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Final, Protocol

import attrs

from flexinfer_core import reasons
from flexinfer_core.election import (
    Ballot,
    Election,
    Rule,
    cooling,
    elect,
    idle_past_timeout,
)
from flexinfer_core.snapshot import ModelState, SharedState

GIB: Final = 2**30
_ACTIVE = SharedState.ACTIVE


def format_gib(size: int) -> str:
    """Bytes as GiB with at most one decimal: 9.5, 24, 0.3."""
    text = f"{size / GIB:.1f}"
    return text[:-2] if text.endswith(".0") else text


@attrs.frozen
class Budget:
    """The group's budget as its members give it (docs/election.md 1.7).

    `size` is None when no member sets one, or when they disagree; `conflict` then says
    who gives what ("" when they agree).
    """

    size: int | None
    conflict: str = ""


def group_budget(members: Iterable[ModelState]) -> Budget:
    """The budget every member gives; None with a `conflict` when they differ (a member
    that leaves it out while another sets it differs too)."""
    given = {m.name: m.vram_budget for m in members}
    values = set(given.values())
    if values == {None} or not values:
        return Budget(None)
    if len(values) == 1:
        return Budget(values.pop())
    said = ", ".join(
        f"{name}: {'unset' if size is None else format_gib(size) + ' GiB'}"
        for name, size in sorted(given.items())
    )
    return Budget(None, f"members disagree on spec.gpu.vramBudget ({said})")


@attrs.frozen
class Seat:
    """One member's place in the packing: admitted or not, why, in one sentence."""

    name: str
    admitted: bool
    reason: str
    message: str


@attrs.frozen
class Packing:
    """The set of holders of one group (leader first, then best first), every member's
    `Seat` (in the ballot's order, best first), the members evicted from a seat, and
    the budget's use by the admitted footprints."""

    budget: Budget
    holders: tuple[str, ...]
    seats: tuple[Seat, ...]
    evicted: tuple[str, ...] = ()
    used: int = 0

    def seat(self, name: str) -> Seat:
        return next(seat for seat in self.seats if seat.name == name)

    @property
    def packed(self) -> bool:
        """More than one holder."""
        return len(self.holders) > 1


def _alone(ballot: Ballot, election: Election, budget: Budget, why: str) -> Packing:
    leader = election.leader
    holders = () if leader is None else (leader.name,)
    seats = tuple(
        Seat(m.name, True, election.reason, f"holds the card alone: {why}")
        if m is leader
        else Seat(m.name, False, reasons.QUEUED, f"not packed: {why}")
        for m in ballot.members
    )
    return Packing(budget, holders, seats)


def _may_preempt(ballot: Ballot, newcomer: ModelState, seated: ModelState) -> bool:
    """The rule 7 test (docs/election.md 1.2) between two members."""
    if newcomer.priority > seated.priority:
        return True
    return newcomer.priority == seated.priority and ballot.is_idle(seated)


def pack(ballot: Ballot, election: Election) -> Packing:
    """The set of holders for `election` on `ballot` (docs/election.md 1.7)."""
    budget = group_budget(ballot.members)
    leader = election.leader
    if leader is None:
        why = "a GPU lease parks the group" if election.lease is not None else "no leader"
        return _alone(ballot, election, budget, why)
    if budget.conflict:
        return _alone(ballot, election, budget, budget.conflict)
    size = budget.size
    if size is None:
        return _alone(ballot, election, budget, "the group sets no VRAM budget")
    if leader.vram_estimate is None:
        return _alone(ballot, election, budget, f"{leader.name}'s footprint is unknown")
    if leader.vram_estimate > size:
        return _alone(
            ballot,
            election,
            budget,
            f"{leader.name} needs {format_gib(leader.vram_estimate)} GiB, more than "
            f"the {format_gib(size)} GiB budget",
        )
    now = ballot.now
    admitted: list[ModelState] = [leader]
    used = leader.vram_estimate
    said: dict[str, Seat] = {
        leader.name: Seat(
            leader.name,
            True,
            election.reason,
            f"leader: {format_gib(leader.vram_estimate)} of {format_gib(size)} GiB",
        )
    }
    evicted: list[str] = []
    others = [m for m in ballot.runnable if m is not leader]
    # Seated members that are still in use keep their seats before any newcomer is
    # looked at: a newcomer only takes a seat through the eviction rule below.
    seated = [m for m in others if m.shared_state is _ACTIVE and not idle_past_timeout(m, now)]
    for m in seated:
        need = m.vram_estimate
        if need is not None and used + need <= size:
            admitted.append(m)
            used += need
            said[m.name] = Seat(m.name, True, reasons.CO_RESIDENT, "")
        else:
            evicted.append(m.name)
            said[m.name] = Seat(
                m.name,
                False,
                reasons.EVICTED_FOR_VRAM,
                _no_room(m, need, size - used, size) + f"; {leader.name} leads",
            )
    cooldown = bool(cooling(ballot))
    order = {m.name: i for i, m in enumerate(ballot.members)}
    for m in others:
        if m.name in said or not ballot.is_demanded(m):
            continue
        need = m.vram_estimate
        free = size - used
        if need is None or need > size:
            said[m.name] = Seat(
                m.name, False, reasons.WAITING_FOR_VRAM, _no_room(m, need, free, size)
            )
            continue
        if need <= free:
            admitted.append(m)
            used += need
            said[m.name] = Seat(m.name, True, reasons.CO_RESIDENT, "")
            continue
        # Lowest-ranked seated first (the leader never), only as many as needed.
        victims: list[ModelState] = []
        room = free
        for seated_member in sorted(admitted[1:], key=lambda s: order[s.name], reverse=True):
            if room >= need:
                break
            if not cooldown and _may_preempt(ballot, m, seated_member):
                victims.append(seated_member)
                room += seated_member.vram_estimate or 0
        if room < need:
            blocker = "a swap cooldown runs" if cooldown else _outranked_by(ballot, m, admitted)
            said[m.name] = Seat(
                m.name,
                False,
                reasons.WAITING_FOR_VRAM,
                _no_room(m, need, free, size) + f"; {blocker}",
            )
            continue
        for victim in victims:
            admitted.remove(victim)
            used -= victim.vram_estimate or 0
            evicted.append(victim.name)
            said[victim.name] = Seat(
                victim.name,
                False,
                reasons.EVICTED_FOR_VRAM,
                f"evicted by {m.name}: it needs {format_gib(need)} GiB, {format_gib(free)} free",
            )
        admitted.append(m)
        used += need
        said[m.name] = Seat(
            m.name,
            True,
            reasons.CO_RESIDENT,
            "evicts " + ", ".join(v.name for v in victims) + f": needs {format_gib(need)} GiB, "
            f"{format_gib(free)} free",
        )
    holders = (leader.name, *sorted((m.name for m in admitted[1:]), key=order.__getitem__))
    fits = f"fits: {format_gib(used)} of {format_gib(size)} GiB used"
    seats = []
    for m in ballot.members:
        seat = said.get(m.name)
        if seat is None:
            seat = Seat(m.name, False, reasons.QUEUED, _why_not_wanted(ballot, m))
        elif seat.name == leader.name:
            # The leader's words say the whole card's use too (docs/election.md 1.7).
            seat = attrs.evolve(seat, message=f"leads; {fits}")
        elif seat.admitted:
            seat = attrs.evolve(seat, message=f"{seat.message}; {fits}" if seat.message else fits)
        seats.append(seat)
    return Packing(budget, holders, tuple(seats), tuple(evicted), used)


class Named(Protocol):
    """A member of either kind of group (a Model's `ModelState`, a GPUGroup's member)."""

    @property
    def name(self) -> str: ...


def _no_room(m: Named, need: int | None, free: int, size: int) -> str:
    if need is None:
        return f"{m.name}'s footprint is unknown: it needs the whole card"
    if need > size:
        return f"{m.name} needs {format_gib(need)} GiB, more than the {format_gib(size)} GiB budget"
    return f"{m.name} needs {format_gib(need)} GiB, {format_gib(free)} free"


def _outranked_by(ballot: Ballot, m: ModelState, admitted: list[ModelState]) -> str:
    """Why a newcomer that does not fit evicts nobody: the seated members it may not
    evict (1.2 rule 7), the leader (never evicted), or too little room even so."""
    leader, seated = admitted[0], admitted[1:]
    kept = [s.name for s in seated if not _may_preempt(ballot, m, s)]
    if kept:
        return (
            f"{m.name} may not evict {', '.join(kept)} (docs/election.md 1.2 rule 7) "
            f"nor the leader {leader.name}"
        )
    if seated:
        return f"evicting every other holder would not make room beside the leader {leader.name}"
    return f"the leader {leader.name} is never evicted"


def _why_not_wanted(ballot: Ballot, m: ModelState) -> str:
    if not m.runnable:
        return f"{m.name} is not runnable"
    if m.shared_state is _ACTIVE:
        return f"{m.name} is idle past its idle timeout and gives up its seat"
    return f"{m.name} is not demanded"


def packing_of(ballot: Ballot) -> Packing:
    """The election on `ballot`, then its packing."""
    return pack(ballot, elect(ballot))


def _says_seats(ballot: Ballot) -> Callable[[], str]:
    return lambda: "; ".join(
        f"{seat.name}: {seat.message}" for seat in packing_of(ballot).seats if seat.message
    )


# Not a rule of the election: which members sit beside the leader (docs/election.md
# 1.7). It reads only thresholds the chain and the replicas already list.
PACKING: Final = Rule("packing", _says_seats)


def memory_gate(
    name: str,
    *,
    members: Iterable[ModelState],
    running: Collection[str],
    budget: int | None,
) -> tuple[bool, str]:
    """Break-before-make by memory (docs/election.md 1.7): may `name`'s pods start now?

    Without a budget, only when no other member has pods (today's rule). With one,
    when the footprints of every other member with pods (terminating included,
    admitted or not; unknown = the whole card) plus its own fit. Returns (may start,
    why not or "").
    """
    by_name: Mapping[str, ModelState] = {m.name: m for m in members}
    others = sorted(n for n in running if n != name)
    if not others:
        return True, ""
    own = by_name[name].vram_estimate
    if budget is None or own is None:
        return False, f"waits for the pods of {', '.join(others)} to be gone"
    live = [by_name[n].vram_estimate if n in by_name else None for n in others]
    if any(size is None for n, size in zip(others, live, strict=True)):
        unknown = [n for n, size in zip(others, live, strict=True) if size is None]
        return False, (f"waits for the pods of {', '.join(unknown)} to be gone (footprint unknown)")
    held = sum(size or 0 for size in live)
    if held + own <= budget:
        return True, ""
    return False, (
        f"waits for {format_gib(own)} GiB: {format_gib(held)} of {format_gib(budget)} GiB "
        f"held by the pods of {', '.join(others)}"
    )
