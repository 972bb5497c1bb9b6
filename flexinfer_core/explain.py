"""What `flexinfer explain` says about a group: the rules, the decision, what next.

Built only from the functions the controller itself calls (`decide_group`,
`explain_election`, `apply_decision`, `next_change_at`), on the snapshot it is
given, so what it prints is what the controller decides on that snapshot. The
next change is found by applying the decision (as the controller would), then
deciding again at each threshold ahead until the leader, its reason or some
member's replicas differ; the thresholds crossing at that instant say why. Members
demanded now are assumed to stay demanded (the question is "when does my model get
the card?"), and the answer says so. Pure:
`now` is a parameter, nothing is read or written.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime

import attrs

from flexinfer_core.drain import DRAIN
from flexinfer_core.election import Ballot, RuleCheck, explain_election, is_demanded
from flexinfer_core.gpugroup import (
    GpuGroupDecision,
    GpuGroupState,
    explain_gpu_group,
)
from flexinfer_core.gpugroup_packing import (
    GpuGroupOutcome,
    GpuGroupPacking,
    decide_gpu_group_on_card,
    decide_packed_gpu_group,
    record_gpu_group_outcome,
)
from flexinfer_core.group import (
    NO_SHARED_CARD_CONDITION,
    GroupDecision,
    apply_decision,
    decide_group,
    describe_threshold,
    next_change_at,
    thresholds,
)
from flexinfer_core.packing import PACKING
from flexinfer_core.snapshot import DEFAULT_POLICY, GpuLease, ModelState, Phase, Policy

# How many thresholds to look past for the changes ahead (each is one decision).
MAX_LOOKAHEAD = 64


@attrs.frozen
class NextChange:
    """The first instant ahead at which the decision changes with no new event.

    `what` says what happens ("coder takes the card"), `when` what crosses a
    boundary then ("the 5m swap cooldown after chat's preemption ends").
    """

    at: datetime
    what: str
    when: str
    leader: str | None
    reason: str
    message: str
    # Members demanded now, assumed to stay demanded (their requests keep coming).
    assumes_demand: tuple[str, ...] = ()


@attrs.frozen
class GroupExplanation:
    decision: GroupDecision
    rules: tuple[RuleCheck, ...]
    # The changes ahead, earliest first: up to `limit`, ending at the first new holder.
    upcoming: tuple[NextChange, ...]
    # The drain stage's words once the decision is written (docs/election.md 1.6):
    # who drains, how many requests are in flight and until when; None: nobody drains.
    drain: str | None = None
    # The packing stage's words (docs/election.md 1.7): each member's seat beside the
    # leader ("embed: fits: 9.5 of 24 GiB used"); None: no member sets a VRAM budget.
    packing: str | None = None

    @property
    def next_change(self) -> NextChange | None:
        return self.upcoming[0] if self.upcoming else None


def explain_group(
    models: Sequence[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    unreadable_lease_sources: Collection[str] = (),
    policy: Policy = DEFAULT_POLICY,
    running: Collection[str] = (),
    limit: int = 3,
    shared_card: bool = True,
) -> GroupExplanation:
    """The controller's decision for one group, each election rule, and the next change
    (`shared_card`: as `decide_group`'s)."""
    leases = tuple(leases)
    decision = decide_group(
        models,
        now=now,
        leases=leases,
        unreadable_lease_sources=unreadable_lease_sources,
        policy=policy,
        running=running,
        shared_card=shared_card,
    )
    trace = explain_election(
        models,
        now=now,
        leases=leases,
        unreadable_lease_sources=unreadable_lease_sources,
        policy=policy,
    )
    return GroupExplanation(
        decision=decision,
        rules=trace.rules,
        drain=_drain(models, decision, now=now, policy=policy),
        packing=_packing(models, now=now, leases=leases, policy=policy, shared_card=shared_card),
        upcoming=_upcoming(
            models,
            decision,
            now=now,
            leases=leases,
            unreadable_lease_sources=tuple(unreadable_lease_sources),
            policy=policy,
            limit=limit,
            shared_card=shared_card,
        ),
    )


def _packing(
    models: Sequence[ModelState],
    *,
    now: datetime,
    leases: Sequence[GpuLease],
    policy: Policy,
    shared_card: bool = True,
) -> str | None:
    if not any(m.vram_budget for m in models):
        return None
    if not shared_card:
        return NO_SHARED_CARD_CONDITION.message
    said = PACKING.decide(Ballot.of(models, now=now, leases=leases, policy=policy))
    return said() if callable(said) else None


def _drain(
    models: Sequence[ModelState], decision: GroupDecision, *, now: datetime, policy: Policy
) -> str | None:
    if not any(m.phase is Phase.DRAINING for m in decision.members):
        return None
    written = apply_decision(models, decision)
    return DRAIN.decide(Ballot.of(written, now=now, policy=policy, check=False))()  # type: ignore[operator]


def _upcoming(
    models: Sequence[ModelState],
    decision: GroupDecision,
    *,
    now: datetime,
    leases: tuple[GpuLease, ...],
    unreadable_lease_sources: tuple[str, ...],
    policy: Policy,
    limit: int,
    shared_card: bool = True,
) -> tuple[NextChange, ...]:
    if not models:
        return ()
    # Requests keep coming for the members demanded now: their activity moves along
    # with time (keeping its order), so only what demand alone cannot change is found.
    demanded = tuple(sorted(m.name for m in models if is_demanded(m, now, policy=policy)))
    origin = {m.name: m.last_active for m in models}

    def at_time(members: Sequence[ModelState], at: datetime) -> tuple[ModelState, ...]:
        out = []
        for m in members:
            last = origin[m.name]
            if m.name in demanded and last is not None:
                m = attrs.evolve(m, last_active=last + (at - now))
            out.append(m)
        return tuple(out)

    def decide(members: Sequence[ModelState], at: datetime) -> GroupDecision:
        # Once applied, only the members the decision scales up hold pods.
        running = frozenset(m.name for m in members if (m.replicas or 0) > 0)
        return decide_group(
            at_time(members, at),
            now=at,
            leases=leases,
            unreadable_lease_sources=unreadable_lease_sources,
            policy=policy,
            running=running,
            shared_card=shared_card,
        )

    state = apply_decision(models, decision)
    base = decide(state, now)
    instant = now
    found: list[NextChange] = []
    for _ in range(MAX_LOOKAHEAD):
        ahead = next_change_at(at_time(state, instant), now=instant, leases=leases, policy=policy)
        if ahead is None:
            break
        instant = ahead
        later = decide(state, instant)
        if not _differs(base, later):
            continue
        here = at_time(state, instant)
        crossing = sorted(
            c
            for c in thresholds(here, now=instant, leases=leases, policy=policy)
            if c.at == instant
        )
        said = (describe_threshold(here, c, now=instant, policy=policy) for c in crossing)
        found.append(
            NextChange(
                at=instant,
                what=_what_changes(base, later),
                when=" and ".join(phrase for phrase in said if phrase),
                leader=later.leader,
                reason=later.reason,
                message=later.message,
                assumes_demand=demanded,
            )
        )
        # Past a new holder the future depends on how long its load takes: stop there.
        if later.leader != base.leader or len(found) >= limit:
            break
        state = apply_decision(at_time(state, instant), later)
        base = decide(state, instant)
    return tuple(found)


def _differs(before: GroupDecision, after: GroupDecision) -> bool:
    return (before.leader, before.reason) != (after.leader, after.reason) or [
        m.desired_replicas for m in before.members
    ] != [m.desired_replicas for m in after.members]


def _what_changes(before: GroupDecision, after: GroupDecision) -> str:
    if after.leader != before.leader:
        if after.leader is None:
            return f"every member is parked ({after.reason})"
        return f"{after.leader} can take the card"
    scaled = [
        f"{b.name} scales from {b.desired_replicas} to {a.desired_replicas}"
        for b, a in zip(before.members, after.members, strict=True)
        if b.desired_replicas != a.desired_replicas
    ]
    if scaled:
        return "; ".join(scaled)
    return f"{after.leader} keeps the card as {after.reason}"


@attrs.frozen
class GpuGroupExplanation:
    decision: GpuGroupDecision
    rules: tuple[RuleCheck, ...]
    # The changes ahead with no new request, earliest first (up to `limit`).
    upcoming: tuple[NextChange, ...]
    # A packed group's packing as its status writes it (docs/election.md 3, "Packing"):
    # each member's seat and why; None when its members take turns.
    packing: GpuGroupPacking | None = None
    # The members that hold the card: the leader, and beside it the co-residents.
    holders: frozenset[str] = frozenset()


def explain_gpu_group_ahead(
    state: GpuGroupState, *, now: datetime, limit: int = 3, shared_card: bool = False
) -> GpuGroupExplanation:
    """The controller's decision (`decide_gpu_group_on_card`: packed with `shared_card`
    and a budget), section 3's steps (`explain_gpu_group`), and what changes next: the
    decision recorded (as the controller writes it) and decided again at each
    `next_change_at` ahead."""

    def decide(observed: GpuGroupState, at: datetime) -> GpuGroupOutcome:
        return decide_gpu_group_on_card(observed, now=at, shared_card=shared_card)

    trace = explain_gpu_group(state, now=now)
    outcome = decide(state, now)
    recorded = record_gpu_group_outcome(state, outcome)
    base = probe = decide(recorded, now)  # probe: the last looked at; its timer is next
    found: list[NextChange] = []
    for _ in range(MAX_LOOKAHEAD):
        instant = probe.decision.next_change_at
        if instant is None:
            break
        later = probe = decide(recorded, instant)
        if _gpu_key(later) == _gpu_key(base):
            continue
        now_leader, was_leader = later.decision.active_model, base.decision.active_model
        when = later.decision.message
        if now_leader != was_leader:
            what = f"{now_leader} takes the GPU" if now_leader else "the group scales to zero"
        elif later.holders != base.holders:
            joins, leaves = (
                sorted(later.holders - base.holders),
                sorted(base.holders - later.holders),
            )
            what = "; ".join(
                [f"{name} joins the card" for name in joins]
                + [f"{name} leaves the card" for name in leaves]
            )
            # Each one's seat as this decision says it (before it is written).
            seats = decide_packed_gpu_group(recorded, now=instant).packing
            when = "; ".join(seats.seat(name).message for name in (*joins, *leaves))
        else:
            what = f"{now_leader or 'nobody'} holds as {later.decision.reason}"
        found.append(
            NextChange(
                at=instant,
                what=what,
                when=when,
                leader=now_leader,
                reason=later.decision.reason,
                message=later.decision.message,
            )
        )
        if now_leader != was_leader or len(found) >= limit:
            break
        recorded = record_gpu_group_outcome(recorded, later)
        base = probe = decide(recorded, instant)
    return GpuGroupExplanation(
        outcome.decision, trace.rules, tuple(found), outcome.packing, outcome.holders
    )


def _gpu_key(outcome: GpuGroupOutcome) -> tuple[object, ...]:
    decision = outcome.decision
    return (decision.active_model, decision.reason, decision.desired_replicas, outcome.holders)
