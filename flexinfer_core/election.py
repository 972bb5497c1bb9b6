"""The shared-group election: who holds the card, and why.

Spec: spec/election.md 1.1–1.2, rule by rule and in that order. Each rule is a
pure check over the snapshot that either names the leader with a reason and a
message or passes to the next. `better` is a total order, so the result never
depends on the order of the input.

Leases fail open here too (spec section 2): the adapter passes the leases it could
read and the names of the sources it could not; a lease whose fields could not be
read carries its `problem`. A readable active lease parks the group whatever else is
unreadable; with none, an unreadable source or lease means the election proceeds as
unleased and its message says which and why.

`explain_election` runs the very same rules and also records, for each one, whether
it decided and why (or why not): what `flexinfer explain` prints. The notes are
written only when asked for, so the controller's election pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Final

import attrs

from flexinfer_core import reasons
from flexinfer_core.durations import format_duration
from flexinfer_core.errors import InconsistentGroupError
from flexinfer_core.leases import governing_lease, lease_holder_label, unreadable_leases
from flexinfer_core.snapshot import (
    DEFAULT_POLICY,
    GpuLease,
    ModelState,
    Phase,
    Policy,
    SharedState,
)

_OLDEST = float("-inf")

# The rules of spec/election.md 1.2, numbered as there.
RULES: Final = (
    (1, "empty group"),
    (2, "GPU lease"),
    (3, "forcePromotion"),
    (4, "swap cooldown"),
    (5, "loading holder"),
    (6, "classify"),
    (7, "demand preemption"),
    (8, "ready member"),
    (9, "recent demand"),
    (10, "fallback"),
)
_RULE_NAMES: Final = dict(RULES)


def candidate_rank(model: ModelState) -> tuple[int, float, str]:
    """Sort key: smaller is better (higher priority, more recent activity, smaller name)."""
    active = model.last_active.timestamp() if model.last_active is not None else _OLDEST
    return (-model.priority, -active, model.name)


def best(models: Iterable[ModelState]) -> ModelState | None:
    """The best member by `better` (spec 1.1), or None for no members."""
    return min(models, key=candidate_rank, default=None)


def better(a: ModelState, b: ModelState) -> bool:
    """True when `a` ranks strictly before `b`."""
    return candidate_rank(a) < candidate_rank(b)


def group_cooldown(models: Iterable[ModelState], policy: Policy = DEFAULT_POLICY) -> timedelta:
    """The largest `swapCooldown` in the group; a member without one counts the default."""
    return max(
        (m.swap_cooldown if m.swap_cooldown is not None else policy.default_swap_cooldown)
        for m in models
    )


def idle_for(model: ModelState, now: datetime) -> timedelta | None:
    return None if model.last_active is None else now - model.last_active


def is_demanded(model: ModelState, now: datetime, *, policy: Policy = DEFAULT_POLICY) -> bool:
    age = idle_for(model, now)
    return age is not None and age < policy.demand_window


def is_idle(model: ModelState, now: datetime, *, policy: Policy = DEFAULT_POLICY) -> bool:
    """Never demanded, or last demanded strictly longer ago than the demand window.

    "Demanded" and "idle" are both strict ("younger than", "older than"), so at exactly
    the window a member is neither: an equal-priority challenger waits one tick more.
    """
    age = idle_for(model, now)
    return age is None or age > policy.demand_window


def is_recent(model: ModelState, now: datetime, *, policy: Policy = DEFAULT_POLICY) -> bool:
    age = idle_for(model, now)
    return age is not None and age < policy.recent_window


def loading_grace(model: ModelState, policy: Policy = DEFAULT_POLICY) -> timedelta:
    """How long after its last demand a loading holder is protected (rule 5)."""
    return max(policy.recent_window, model.serverless.cold_start_timeout)


def in_cooldown(model: ModelState, now: datetime, *, cooldown: timedelta) -> bool:
    return model.preempted_at is not None and now - model.preempted_at < cooldown


@attrs.frozen
class Election:
    """The leader of one group (None under a lease or for an empty group) and why."""

    leader: ModelState | None
    reason: str
    message: str
    lease: GpuLease | None = None
    # Set only when the election failed open: no readable lease parks the group and
    # these sources could not be read, or these leases of the group could not be.
    unreadable_lease_sources: tuple[str, ...] = ()
    unreadable_leases: tuple[GpuLease, ...] = ()

    @property
    def leader_name(self) -> str | None:
        return None if self.leader is None else self.leader.name

    @property
    def lease_unreadable(self) -> bool:
        """The election proceeded as unleased because leases could not be read."""
        return bool(self.unreadable_lease_sources or self.unreadable_leases)


@attrs.frozen
class RuleCheck:
    """One rule of the election as evaluated: did it decide, and why (or why not).

    Rule 6 (classify) never decides; its note says how the members were classified.
    Rules after the deciding one are not evaluated and say so.
    """

    number: int
    name: str
    applied: bool
    why: str


@attrs.frozen
class ElectionTrace:
    """The election and every rule's outcome, in spec order (all ten)."""

    election: Election
    rules: tuple[RuleCheck, ...]

    @property
    def deciding_rule(self) -> RuleCheck:
        return next(rule for rule in self.rules if rule.applied)


def check_one_group(models: Sequence[ModelState]) -> tuple[str, str] | None:
    """Raise unless the models form one group; return its (namespace, group) key."""
    if not models:
        return None
    namespace, group = models[0].namespace, models[0].group
    seen: set[str] = set()
    for model in models:
        if (model.namespace, model.group) != (namespace, group):
            raise InconsistentGroupError(
                f"models: {model.namespace}/{model.name} is in group "
                f"{model.namespace}/{model.group!r}, not {namespace}/{group!r}"
            )
        if model.name in seen:
            raise InconsistentGroupError(f"models: {namespace}/{model.name} appears twice")
        seen.add(model.name)
    if not group and len(models) > 1:
        raise InconsistentGroupError(
            f"models: {len(models)} models without spec.gpu.shared are not one group"
        )
    return namespace, group


def elect_leader(
    models: Sequence[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    unreadable_lease_sources: Collection[str] = (),
    policy: Policy = DEFAULT_POLICY,
) -> Election:
    """Apply spec/election.md 1.2 in order and return the first rule that decides.

    `unreadable_lease_sources` names the lease carriers the adapter could not read
    (e.g. "gpuleases", "configmaps"), and a lease with a `problem` (its `expiresAt`
    does not parse) could not be read either; see the module docstring for what they
    change.
    """
    leases = tuple(leases)
    key = check_one_group(models)
    election = _elect(models, key, now=now, leases=leases, policy=policy)
    return _failed_open(election, key, leases, unreadable_lease_sources)


def explain_election(
    models: Sequence[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    unreadable_lease_sources: Collection[str] = (),
    policy: Policy = DEFAULT_POLICY,
) -> ElectionTrace:
    """`elect_leader`, plus each rule's outcome in order (for `flexinfer explain`)."""
    leases = tuple(leases)
    key = check_one_group(models)
    notes: list[RuleCheck] = []
    election = _elect(
        models,
        key,
        now=now,
        leases=leases,
        policy=policy,
        notes=notes,
        unreadable=tuple(sorted(set(unreadable_lease_sources))),
    )
    election = _failed_open(election, key, leases, unreadable_lease_sources)
    decided = next(rule.number for rule in notes if rule.applied)
    skipped = tuple(
        RuleCheck(number, name, False, f"not reached: rule {decided} decided")
        for number, name in RULES
        if number > decided
    )
    return ElectionTrace(election, (*notes, *skipped))


def _failed_open(
    election: Election,
    key: tuple[str, str] | None,
    leases: Sequence[GpuLease],
    unreadable_lease_sources: Collection[str],
) -> Election:
    if election.lease is not None or key is None or not key[1]:
        return election
    sources = tuple(sorted(set(unreadable_lease_sources)))
    broken = unreadable_leases(leases, namespace=key[0], group=key[1])
    if not sources and not broken:
        return election
    why = [f"GPU leases could not be read ({', '.join(sources)})"] if sources else []
    why += [
        f"GPU lease {lease.source.value} {lease.name} cannot be read ({lease.problem})"
        for lease in broken
    ]
    return attrs.evolve(
        election,
        unreadable_lease_sources=sources,
        unreadable_leases=broken,
        message=f"{'; '.join(why)}; proceeding as unleased (fail open): {election.message}",
    )


def _note(notes: list[RuleCheck] | None, number: int, applied: bool, why: str) -> None:
    if notes is not None:
        notes.append(RuleCheck(number, _RULE_NAMES[number], applied, why))


def _elect(
    models: Sequence[ModelState],
    key: tuple[str, str] | None,
    *,
    now: datetime,
    leases: Iterable[GpuLease],
    policy: Policy,
    notes: list[RuleCheck] | None = None,
    unreadable: tuple[str, ...] = (),
) -> Election:
    # Each rule either decides (`_decided`) or, when notes are asked for, says why not.
    # 1. Empty group.
    if key is None:
        return _decided(notes, 1, Election(None, reasons.EMPTY_GROUP, "the group has no members"))
    if notes is not None:
        _note(notes, 1, False, f"{len(models)} member(s)")
    namespace, group = key
    # One sort by the total order; "the best member such that ..." is then the first
    # one that qualifies (the same as `best` over the filtered members, cheaper).
    models = sorted(models, key=candidate_rank)

    # 2. A GPU lease parks everyone; it beats forcePromotion.
    if group:
        lease = governing_lease(leases, namespace=namespace, group=group, now=now)
        if lease is not None:
            # No expiry in the text: a refreshed lease must not rewrite every status.
            return _decided(
                notes,
                2,
                Election(
                    None,
                    reasons.GPU_LEASE_HELD,
                    f"GPU lease {lease.name} held by {lease_holder_label(lease)}; "
                    "every member is parked",
                    lease=lease,
                ),
            )
    if notes is not None:
        _note(notes, 2, False, _why_no_lease(leases, key, now=now, unreadable=unreadable))

    # 3. forcePromotion.
    forced = next((m for m in models if m.force_promotion), None)
    if forced is not None:
        return _decided(
            notes,
            3,
            Election(forced, reasons.FORCE_PROMOTED, f"{forced.name} has forcePromotion set"),
        )
    if notes is not None:
        _note(notes, 3, False, "no member has forcePromotion set")

    # 4. Anti-thrashing cooldown.
    cooldown = group_cooldown(models, policy)
    # A member that is Ready again has its stamp cleared by this very decision
    # (spec 1.3); counting it would hold the card now and release it on the next
    # reconcile with no news.
    recently_preempted = [
        m for m in models if m.phase is not Phase.READY and in_cooldown(m, now, cooldown=cooldown)
    ]
    holder = next((m for m in models if m.shared_state is SharedState.ACTIVE), None)
    if recently_preempted and holder is not None:
        victim = min(recently_preempted, key=lambda m: (-_ts(m.preempted_at), m.name))
        assert victim.preempted_at is not None
        return _decided(
            notes,
            4,
            Election(
                holder,
                reasons.SWAP_COOLDOWN,
                f"{holder.name} keeps the card: {victim.name} was preempted at "
                f"{victim.preempted_at.isoformat()}, inside the {_fmt(cooldown)} swap cooldown",
            ),
        )
    if notes is not None:
        _note(notes, 4, False, _why_no_cooldown(models, cooldown, recently_preempted, now=now))

    # 5. A holder in the middle of its load is not torn down for anything less.
    loading = best(
        m
        for m in models
        if m.shared_state is SharedState.ACTIVE
        and m.phase in (Phase.PENDING, Phase.LOADING)
        and m.last_active is not None
        and now - m.last_active <= loading_grace(m, policy)
    )
    if loading is not None:
        challenger = best(
            m
            for m in models
            if m.runnable and m.priority > loading.priority and is_demanded(m, now, policy=policy)
        )
        if challenger is None:
            return _decided(
                notes,
                5,
                Election(
                    loading,
                    reasons.LOADING_HOLDER,
                    f"{loading.name} is {loading.phase.value.lower()} and keeps the card until "
                    "its load finishes; no higher-priority model is demanded",
                ),
            )
        if notes is not None:
            _note(
                notes,
                5,
                False,
                f"{loading.name} is {loading.phase.value.lower()}, but {challenger.name} "
                f"(priority {challenger.priority}) is demanded and outranks it "
                f"(priority {loading.priority})",
            )
    elif notes is not None:
        _note(notes, 5, False, "no holder is pending or loading within its load grace")

    # 6. Classify the runnable members.
    runnable = [m for m in models if m.runnable]
    ready = next((m for m in runnable if m.phase is Phase.READY), None)
    recent = next((m for m in runnable if is_recent(m, now, policy=policy)), None)
    demanded = next((m for m in runnable if is_demanded(m, now, policy=policy)), None)
    if notes is not None:
        _note(notes, 6, False, _classification(models, ready, recent, demanded, policy))

    # 7. Demand preemption.
    if demanded is not None and ready is not None and demanded.name != ready.name:
        if demanded.priority > ready.priority:
            return _decided(
                notes,
                7,
                Election(
                    demanded,
                    reasons.DEMAND_PREEMPTION,
                    f"{demanded.name} (priority {demanded.priority}) is demanded and outranks "
                    f"the ready leader {ready.name} (priority {ready.priority})",
                ),
            )
        if is_idle(ready, now, policy=policy) and demanded.priority >= ready.priority:
            return _decided(
                notes,
                7,
                Election(
                    demanded,
                    reasons.DEMAND_PREEMPTION,
                    f"{demanded.name} is demanded and the ready leader {ready.name} is idle at "
                    f"equal priority ({ready.priority})",
                ),
            )
    if notes is not None:
        _note(notes, 7, False, _why_no_preemption(ready, demanded, now=now, policy=policy))

    # 8–9. The ready member, else the most recently wanted one.
    if ready is not None:
        return _decided(
            notes,
            8,
            Election(ready, reasons.READY_LEADER, f"{ready.name} is ready and keeps the card"),
        )
    if notes is not None:
        _note(notes, 8, False, "no runnable member is Ready")
    if recent is not None:
        return _decided(
            notes,
            9,
            Election(
                recent,
                reasons.RECENT_DEMAND,
                f"{recent.name} was wanted within the last {_fmt(policy.recent_window)}",
            ),
        )
    if notes is not None:
        _note(
            notes,
            9,
            False,
            f"no runnable member was wanted within the last {_fmt(policy.recent_window)}",
        )

    # 10. Fallback.
    would_run = best(
        m for m in runnable if m.serverless.min_replicas >= 1 or not m.serverless.enabled
    )
    chosen = would_run or best(runnable) or best(models)
    assert chosen is not None
    if would_run is not None:
        why = "the best runnable member that runs without demand"
    elif runnable:
        why = "the best runnable member; nobody is demanded"
    else:
        why = "the best member; no member is runnable"
    return _decided(notes, 10, Election(chosen, reasons.FALLBACK, f"{chosen.name} is {why}"))


def _decided(notes: list[RuleCheck] | None, number: int, election: Election) -> Election:
    _note(notes, number, True, election.message)
    return election


# --- why a rule did not decide (only computed for `explain_election`) ------------------


def _why_no_lease(
    leases: Iterable[GpuLease],
    key: tuple[str, str],
    *,
    now: datetime,
    unreadable: tuple[str, ...],
) -> str:
    namespace, group = key
    if not group:
        return "not a shared group: GPU leases park shared groups only"
    if unreadable:
        return (
            f"no readable lease parks the group, and {', '.join(unreadable)} could not be "
            "read: proceeding as unleased (fail open)"
        )
    ours = sorted(
        (lease for lease in leases if lease.namespace == namespace and lease.group == group),
        key=lambda lease: lease.name,
    )
    if not ours:
        return f"no GPU lease names group {group}"
    broken = [lease for lease in ours if lease.problem]
    if broken:
        return "; ".join(
            f"GPU lease {lease.name} cannot be read ({lease.problem}) and parks nothing (fail open)"
            for lease in broken
        )
    expired = ", ".join(
        f"{lease.name} expired at {lease.expires_at.isoformat()}"
        for lease in ours
        if lease.expires_at is not None and lease.expires_at <= now
    )
    return f"no active GPU lease on group {group} ({expired})"


def _why_no_cooldown(
    models: Sequence[ModelState],
    cooldown: timedelta,
    recently_preempted: Sequence[ModelState],
    *,
    now: datetime,
) -> str:
    if recently_preempted:
        names = ", ".join(m.name for m in recently_preempted)
        return (
            f"{names} preempted inside the {_fmt(cooldown)} swap cooldown, but no member "
            "holds the card to keep it"
        )
    stamped = [m for m in models if m.preempted_at is not None]
    if not stamped:
        return f"no member was preempted within the {_fmt(cooldown)} swap cooldown"
    last = max(stamped, key=lambda m: (_ts(m.preempted_at), m.name))
    assert last.preempted_at is not None
    if last.phase is Phase.READY:
        return f"{last.name} is Ready again, so its preemption no longer holds the group"
    return (
        f"the {_fmt(cooldown)} swap cooldown after {last.name}'s preemption ended at "
        f"{(last.preempted_at + cooldown).isoformat()}"
    )


def _classification(
    models: Sequence[ModelState],
    ready: ModelState | None,
    recent: ModelState | None,
    demanded: ModelState | None,
    policy: Policy,
) -> str:
    parts = [
        f"ready: {_name(ready)}",
        f"wanted within {_fmt(policy.recent_window)}: {_name(recent)}",
        f"demanded within {_fmt(policy.demand_window)}: {_name(demanded)}",
    ]
    blocked = [
        f"{m.name} ({'failed' if m.phase is Phase.FAILED else 'cache not ready'})"
        for m in models
        if not m.runnable
    ]
    if blocked:
        parts.append(f"not runnable: {', '.join(blocked)}")
    return "; ".join(parts)


def _why_no_preemption(
    ready: ModelState | None, demanded: ModelState | None, *, now: datetime, policy: Policy
) -> str:
    window = _fmt(policy.demand_window)
    if demanded is None:
        return f"no runnable member was demanded within the last {window}"
    if ready is None:
        return f"{demanded.name} is demanded, but no member is Ready to be preempted"
    if demanded.name == ready.name:
        return f"the best demanded member, {demanded.name}, is the ready one"
    if is_demanded(ready, now, policy=policy):
        return (
            f"{demanded.name} (priority {demanded.priority}) does not outrank the ready "
            f"{ready.name} (priority {ready.priority}), which is busy (demanded within {window})"
        )
    if not is_idle(ready, now, policy=policy):
        return (
            f"{demanded.name} (priority {demanded.priority}) does not outrank the ready "
            f"{ready.name} (priority {ready.priority}), last demanded exactly {window} ago: "
            "neither busy nor yet idle"
        )
    return (
        f"{demanded.name} (priority {demanded.priority}) ranks below the idle ready "
        f"{ready.name} (priority {ready.priority})"
    )


def _name(model: ModelState | None) -> str:
    return "-" if model is None else model.name


def _ts(value: datetime | None) -> float:
    return _OLDEST if value is None else value.timestamp()


def _fmt(value: timedelta) -> str:
    return format_duration(value)
