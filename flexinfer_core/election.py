"""The shared-group election: who holds the card, and why.

docs/election.md 1.1–1.2. The election is a chain of named rules (`CHAIN`), in the
order of docs/election.md 1.2. A rule is a function of one `Ballot` (the group's
members best-first, the instant, the policy, the leases) that either decides (returns
the `Election`) or passes, saying why it does not decide (a `Passed`: a thunk, only
called for `flexinfer explain`, so the controller's election formats nothing it does
not keep). The first rule that decides wins; `better` is a total order, so the result
never depends on the order of the input.

Each rule also lists the instants at which something it reads crosses a boundary
(its `crossings`) and says what each crossing means. So the controller's election
(`elect_leader`), `explain_election`, the timer (`flexinfer_core.group.next_change_at`),
what `flexinfer explain` says will happen next and `flexinfer status`'s cooldown end
all walk this one chain: a rule, its thresholds and their wording exist once.

A decision is explained as of after it is written (docs/election.md 1.3) by electing
again on the ballot with the facts a written decision changes settled
(`Ballot.settled`): whether each member is Active, its phase, its `preemptedAt`.

Leases fail open here too (docs/election.md 2): the adapter passes the leases it could
read and the names of the sources it could not; a lease whose fields could not be
read carries its `problem`. A readable active lease parks the group whatever else is
unreadable; with none, an unreadable source or lease means the election proceeds as
unleased and its message says which and why.

The group's default member (docs/election.md 1.5) is two rules of the chain: the
default yields once it runs only to stay warm (rule 8), and takes the card back once
nobody else is demanded and the holder has idled out (rule 9); `Ballot.default` names
it.

Adding a rule (a set of holders packed into a VRAM budget) is adding a `Rule` to
`CHAIN` where docs/election.md puts it, with its own crossings and wording; nothing
else walks the members. A holder that drains before it is preempted is a stage of the
same shape after the election (`flexinfer_core.drain.DRAIN`); the election only counts
a Draining member as ready.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Final, NamedTuple, Protocol

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
    with_written_status,
)

_OLDEST = float("-inf")
_FIRST = operator.itemgetter(0)
_TICK = timedelta(microseconds=1)
_LOADING = (Phase.PENDING, Phase.LOADING)

# Enum members as module constants: on Python 3.11 reading one off its class goes
# through the metaclass's attribute hook, some twenty times slower than reading a
# global, and the election reads them for every member of every group.
_ACTIVE = SharedState.ACTIVE
_READY, _FAILED, _DRAINING = Phase.READY, Phase.FAILED, Phase.DRAINING


def candidate_rank(model: ModelState) -> tuple[int, float, str]:
    """Sort key: smaller is better (higher priority, more recent activity, smaller name)."""
    active = model.last_active.timestamp() if model.last_active is not None else _OLDEST
    return (-model.priority, -active, model.name)


def ranked(models: Iterable[ModelState]) -> tuple[ModelState, ...]:
    """The members best first, by `candidate_rank`.

    One sort by the total order, so that "the best member such that ..." is the first
    one that qualifies. Done as three stable sorts with keys Python need not call
    (name, then activity, then priority; each later sort keeps the order of the
    earlier ones among its ties): the same order as sorting by `candidate_rank`, in
    about half the time, on the hot path of every election.
    """
    out = sorted(models, key=_NAME)
    out.sort(key=_activity, reverse=True)
    out.sort(key=_PRIORITY, reverse=True)
    return tuple(out)


_NAME = operator.attrgetter("name")
_PRIORITY = operator.attrgetter("priority")
_NEVER = datetime.min.replace(tzinfo=UTC)


def _activity(model: ModelState) -> datetime:
    return model.last_active or _NEVER  # absent counts as oldest


def best(models: Iterable[ModelState]) -> ModelState | None:
    """The best member by `better` (docs/election.md 1.1), or None for no members."""
    return min(models, key=candidate_rank, default=None)


def better(a: ModelState, b: ModelState) -> bool:
    """True when `a` ranks strictly before `b`."""
    return candidate_rank(a) < candidate_rank(b)


def group_cooldown(models: Iterable[ModelState], policy: Policy = DEFAULT_POLICY) -> timedelta:
    """The largest `swapCooldown` in the group; a member without one counts the default."""
    return max(
        [
            m.swap_cooldown if m.swap_cooldown is not None else policy.default_swap_cooldown
            for m in models
        ]
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


@attrs.frozen(slots=False)  # built once or twice per group and reconcile: see group.Event
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
    """The election and every rule's outcome, in the chain's order."""

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
    if (
        len({(m.namespace, m.group) for m in models}) == 1
        and len({m.name for m in models}) == len(models)
        and (group or len(models) == 1)
    ):
        return namespace, group  # the usual case, checked in one pass
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


# --- what the rules read ---------------------------------------------------------------


class Threshold(StrEnum):
    """What crosses a boundary at a `next_change_at` instant (for `flexinfer explain`)."""

    LEASE_EXPIRY = "lease expiry"
    DEMAND_WINDOW = "demand window"
    IDLE = "idle past the demand window"
    RECENT_WINDOW = "recent window"
    LOAD_GRACE = "load grace"
    IDLE_TIMEOUT = "idle timeout"
    SWAP_COOLDOWN = "swap cooldown"
    DEFAULT_YIELD = "default idle past its idle timeout"
    DEFAULT_RETURN = "holder idle past its idle timeout"
    DRAIN_DEADLINE = "drain timeout"
    IN_FLIGHT_STALE = "in-flight report stale"


# As the members of Phase and SharedState above: read for every member.
_LEASE_EXPIRY, _SWAP_COOLDOWN = Threshold.LEASE_EXPIRY, Threshold.SWAP_COOLDOWN
_LOAD_GRACE, _IDLE = Threshold.LOAD_GRACE, Threshold.IDLE
_DEMAND_WINDOW, _RECENT_WINDOW = Threshold.DEMAND_WINDOW, Threshold.RECENT_WINDOW
_DEFAULT_YIELD, _DEFAULT_RETURN = Threshold.DEFAULT_YIELD, Threshold.DEFAULT_RETURN


class Crossing(NamedTuple):
    """An instant at which something a rule reads crosses a boundary, and whose."""

    at: datetime
    kind: Threshold
    subject: str  # a member's or a lease's name


Instant = tuple[datetime, Threshold, str]
"""A `Crossing` as a rule lists it: a plain tuple, as the timer builds them for every
member at every decision."""


class WrittenStatus(Protocol):
    """What a decision writes of one member that the election reads (a
    `flexinfer_core.group.MemberDecision` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def state(self) -> SharedState | None: ...
    @property
    def phase(self) -> Phase: ...
    @property
    def preempted_at(self) -> datetime | None: ...


def is_loading(model: ModelState) -> bool:
    """Pending or Loading: its pod is on its way."""
    return model.phase in _LOADING


def idle_past_timeout(model: ModelState, now: datetime) -> bool:
    """No `lastActiveTime`, or one strictly older than the member's own `idleTimeout`
    (when a leader would scale to `minReplicas`; docs/election.md 1.3)."""
    last = model.last_active
    return last is None or now - last > model.serverless.idle_timeout


def scales_to_zero(model: ModelState) -> bool:
    """A leader that goes to 0 replicas by itself once idle past its idle timeout."""
    serverless = model.serverless
    return serverless.enabled and serverless.min_replicas == 0


def _default_rank(model: ModelState) -> tuple[int, str]:
    return (-model.priority, model.name)


def group_default(members: Iterable[ModelState]) -> tuple[ModelState | None, tuple[str, ...]]:
    """The group's default (docs/election.md 1.5): of the members with `spec.gpu.default`,
    the highest priority, then the smaller name; and the names of the other marked
    members, whose flag is ignored."""
    marked = [m for m in members if m.default_member]
    if not marked:  # the usual case, on the election's hot path
        return None, ()
    marked.sort(key=_default_rank)
    return marked[0], tuple(sorted(m.name for m in marked[1:]))


class Ballot:
    """What every rule reads: one group's members best-first, the instant, the policy,
    the leases that were read and the lease sources that could not be.

    Built once per election. The values several rules share are read off in one pass
    over the members when it is built: the holder (the best Active member), the
    governing lease, rule 6's classification of the runnable members (the best
    Ready, recent and demanded one), and the members whose `lastActiveTime` or
    `preemptedAt` a threshold is counted from.
    """

    def __init__(
        self,
        members: tuple[ModelState, ...],
        *,
        namespace: str,
        group: str,
        now: datetime,
        policy: Policy,
        leases: tuple[GpuLease, ...],
        unreadable: tuple[str, ...],
    ) -> None:
        self.members = members
        self.namespace = namespace
        self.group = group
        self.now = now
        self.policy = policy
        self.leases = leases
        self.unreadable = unreadable
        self.lease: GpuLease | None = (
            governing_lease(leases, namespace=namespace, group=group, now=now)
            if leases and group
            else None
        )
        """The active lease that parks the group (shared groups only)."""
        self._cooldown: timedelta | None = None
        self._activity: tuple[tuple[datetime, ModelState], ...] | None = None
        self._stamped: tuple[ModelState, ...] | None = None
        # Comprehensions rather than one loop: this is the election's hot path, and
        # CPython runs them with fewer instructions.
        active, ready_phase = _ACTIVE, _READY
        self.holder: ModelState | None = next(
            (m for m in members if m.shared_state is active), None
        )
        """The best Active member."""
        runnable = [m for m in members if m.phase is not _FAILED and m.cache_ready]
        self.runnable: list[ModelState] = runnable
        """The members that are not Failed and whose cache is ready, best first."""
        draining = _DRAINING
        self.ready: ModelState | None = next(
            (m for m in runnable if m.phase is ready_phase or m.phase is draining), None
        )
        """Rule 6: the best runnable Ready member. A Draining one counts (its server is
        up, docs/election.md 1.6): if the election wants it back, it simply stays."""
        # `is_recent` and `is_demanded`: younger than the window, i.e. later than now
        # minus the window.
        recent_since, demand_since = now - policy.recent_window, now - policy.demand_window
        self.recent: ModelState | None = next(
            (m for m in runnable if m.last_active is not None and m.last_active > recent_since),
            None,
        )
        """Rule 6: the best runnable member wanted within the recent window."""
        self.demanded: ModelState | None = next(
            (m for m in runnable if m.last_active is not None and m.last_active > demand_since),
            None,
        )
        """Rule 6: the best runnable member demanded within the demand window."""
        self.default: ModelState | None = None
        """The group's default member (docs/election.md 1.5); shared groups only."""
        self.ignored_defaults: tuple[str, ...] = ()
        """The other members with `spec.gpu.default`, whose flag is ignored."""
        if group:
            self.default, self.ignored_defaults = group_default(members)

    @property
    def activity(self) -> tuple[tuple[datetime, ModelState], ...]:
        """The members with a `lastActiveTime`, with it, the most recent first (what the
        timer counts from: a rule can stop at the first one whose threshold is past)."""
        if self._activity is None:
            self._activity = tuple(
                sorted(
                    [(last, m) for m in self.members if (last := m.last_active) is not None],
                    key=_FIRST,
                    reverse=True,
                )
            )
        return self._activity

    def active_since(
        self, after: datetime | None, longest: timedelta
    ) -> Iterator[tuple[datetime, ModelState]]:
        """`activity`, or with `after` only the members whose `lastActiveTime + longest`
        lies after it (those whose thresholds, at most `longest` after their activity,
        can still be ahead)."""
        if after is None:
            yield from self.activity
            return
        cutoff = after - longest
        for last, m in self.activity:
            if last < cutoff:
                return  # the rest are older still
            yield last, m

    @property
    def stamped(self) -> tuple[ModelState, ...]:
        """The members with a `preemptedAt`."""
        if self._stamped is None:
            self._stamped = tuple([m for m in self.members if m.preempted_at is not None])
        return self._stamped

    @classmethod
    def of(
        cls,
        models: Sequence[ModelState],
        *,
        now: datetime,
        leases: Iterable[GpuLease] = (),
        unreadable_lease_sources: Collection[str] = (),
        policy: Policy = DEFAULT_POLICY,
        check: bool = True,
    ) -> Ballot:
        """The ballot of one group; with `check`, raise unless `models` form one group."""
        if check:
            key = check_one_group(models) or ("", "")
        else:
            key = (models[0].namespace, models[0].group) if models else ("", "")
        return cls(
            ranked(models),
            namespace=key[0],
            group=key[1],
            now=now,
            policy=policy,
            leases=tuple(leases),
            unreadable=tuple(sorted(set(unreadable_lease_sources)))
            if unreadable_lease_sources
            else (),
        )

    def settled(self, written: Iterable[WrittenStatus]) -> Ballot | None:
        """The ballot once a decision is written: `written` has each member's
        `sharedGroup.state`, phase and `preemptedAt` as the decision writes them. None
        when nothing the election reads changes (then there is no need to elect
        again). The election reads of the state only whether it is Active, so a member
        going from no state to Queued is not copied."""
        active = _ACTIVE
        by_name = {w.name: w for w in written}
        out = []
        changed = False
        for m in self.members:
            w = by_name[m.name]
            if (
                (w.state is active) is (m.shared_state is active)
                and w.phase is m.phase
                and w.preempted_at == m.preempted_at
            ):
                out.append(m)
            else:
                changed = True
                out.append(
                    with_written_status(
                        m, shared_state=w.state, phase=w.phase, preempted_at=w.preempted_at
                    )
                )
        if not changed:
            return None
        settled = Ballot(
            tuple(out),
            namespace=self.namespace,
            group=self.group,
            now=self.now,
            policy=self.policy,
            leases=self.leases,
            unreadable=self.unreadable,
        )
        settled._cooldown = self._cooldown  # the members' swapCooldowns are the same
        return settled

    @property
    def cooldown(self) -> timedelta:
        """The group's swap cooldown (`group_cooldown`)."""
        if self._cooldown is None:
            self._cooldown = group_cooldown(self.members, self.policy)
        return self._cooldown

    def is_demanded(self, model: ModelState) -> bool:
        return is_demanded(model, self.now, policy=self.policy)

    def is_idle(self, model: ModelState) -> bool:
        return is_idle(model, self.now, policy=self.policy)

    def member(self, name: str) -> ModelState | None:
        return next((m for m in self.members if m.name == name), None)

    def after_activity(
        self, offset: timedelta, kind: Threshold, *, after: datetime | None
    ) -> list[Instant]:
        """`lastActiveTime + offset` of every member that has one (after `after`)."""
        if after is None:
            return [(last + offset, kind, m.name) for last, m in self.activity]
        cutoff = after - offset  # last + offset > after, without adding for each member
        out = []
        for last, m in self.activity:
            if last <= cutoff:
                break  # the rest are older still
            out.append((last + offset, kind, m.name))
        return out


# --- the rules ---------------------------------------------------------------------------

Passed = Callable[[], str]
"""A rule that does not decide: says why, when asked (explain only)."""

Verdict = Election | Passed


def _says_nothing(ballot: Ballot, crossing: Crossing) -> str | None:
    return None


@attrs.frozen
class Rule:
    """One named rule of the chain.

    `decide` returns the `Election` when the rule decides, else a `Passed` saying why
    not. `crossings(ballot, after)` lists the instants (strictly after `after`; all
    for None) at which what the rule reads crosses a boundary (its part of
    `next_change_at`), and `says` words one of them for `flexinfer explain` (None:
    not worth saying, or not this rule's). While a rule with `stops_the_clock`
    decides, nothing but its own crossings (and those of the rules before it) can
    change the decision: under a GPU lease no window or timeout matters. A stage
    outside the election whose crossings do not depend on it (a drain's deadline)
    sets `ticks_always`: they count even then.
    """

    name: str
    decide: Callable[[Ballot], Verdict]
    crossings: Callable[[Ballot, datetime | None], list[Instant]] | None = attrs.field(
        default=None, kw_only=True
    )
    says: Callable[[Ballot, Crossing], str | None] = attrs.field(
        default=_says_nothing, kw_only=True
    )
    stops_the_clock: bool = attrs.field(default=False, kw_only=True)
    ticks_always: bool = attrs.field(default=False, kw_only=True)


def _empty_group(ballot: Ballot) -> Verdict:
    if not ballot.members:
        return Election(None, reasons.EMPTY_GROUP, "the group has no members")
    count = len(ballot.members)
    return lambda: f"{count} member(s)"


def _gpu_lease(ballot: Ballot) -> Verdict:
    """A GPU lease parks everyone; it beats forcePromotion."""
    lease = ballot.lease
    if lease is not None:
        # No expiry in the text: a refreshed lease must not rewrite every status.
        return Election(
            None,
            reasons.GPU_LEASE_HELD,
            f"GPU lease {lease.name} held by {lease_holder_label(lease)}; every member is parked",
            lease=lease,
        )
    return lambda: _why_no_lease(ballot)


def _lease_crossings(ballot: Ballot, after: datetime | None) -> list[Instant]:
    return [
        (lease.expires_at, _LEASE_EXPIRY, lease.name)
        for lease in ballot.leases
        if lease.expires_at is not None
        and (after is None or lease.expires_at > after)
        and lease.group == ballot.group
        and lease.namespace == ballot.namespace
    ]


def _lease_says(ballot: Ballot, crossing: Crossing) -> str | None:
    if crossing.kind is _LEASE_EXPIRY:
        return f"GPU lease {crossing.subject} expires"
    return None


def _force_promotion(ballot: Ballot) -> Verdict:
    forced_ones = [m for m in ballot.members if m.force_promotion]
    if forced_ones:
        forced = forced_ones[0]
        return Election(forced, reasons.FORCE_PROMOTED, f"{forced.name} has forcePromotion set")
    return lambda: "no member has forcePromotion set"


def cooling(ballot: Ballot) -> list[ModelState]:
    """Rule 4's members: preempted less than the group's cooldown ago and not Ready again.

    A member that is Ready again has its stamp cleared by this very decision
    (docs/election.md 1.3); counting it would hold the card now and release it on the
    next reconcile with no news. Nor does an `Active` member observed draining: kept,
    it goes on serving (its phase Ready again) and its stamp goes with it; evicted, it
    is stamped anew.
    """
    if not ballot.stamped:
        return []
    now, cooldown = ballot.now, ballot.cooldown
    return [
        m
        for m in ballot.stamped
        if m.phase is not _READY
        and not (m.phase is _DRAINING and m.shared_state is _ACTIVE)
        and m.preempted_at is not None
        and now - m.preempted_at < cooldown
    ]


def _swap_cooldown(ballot: Ballot) -> Verdict:
    """Anti-thrashing: after a real eviction the Active holder keeps the card."""
    recently_preempted = cooling(ballot)
    holder = ballot.holder
    if recently_preempted and holder is not None:
        victim = min(recently_preempted, key=lambda m: (-_ts(m.preempted_at), m.name))
        assert victim.preempted_at is not None
        return Election(
            holder,
            reasons.SWAP_COOLDOWN,
            f"{holder.name} keeps the card: {victim.name} was preempted at "
            f"{victim.preempted_at.isoformat()}, inside the {_fmt(ballot.cooldown)} swap cooldown",
        )
    return lambda: _why_no_cooldown(ballot, recently_preempted)


def _cooldown_crossings(ballot: Ballot, after: datetime | None) -> list[Instant]:
    if not ballot.stamped:
        return []
    cooldown = ballot.cooldown
    out = []
    for m in ballot.stamped:
        if m.preempted_at is not None:
            at = m.preempted_at + cooldown
            if after is None or at > after:
                out.append((at, _SWAP_COOLDOWN, m.name))
    return out


def _cooldown_says(ballot: Ballot, crossing: Crossing) -> str | None:
    if crossing.kind is _SWAP_COOLDOWN:
        return (
            f"the {_fmt(ballot.cooldown)} swap cooldown after {crossing.subject}'s preemption ends"
        )
    return None


def cooldown_ends_at(ballot: Ballot) -> datetime | None:
    """When the running swap cooldown ends (the latest of rule 4's members), if one runs."""
    ends = [m.preempted_at + ballot.cooldown for m in cooling(ballot) if m.preempted_at]
    return max(ends, default=None)


def _within_load_grace(ballot: Ballot, model: ModelState) -> bool:
    last = model.last_active
    return last is not None and ballot.now - last <= loading_grace(model, ballot.policy)


def _loading_holder(ballot: Ballot) -> Verdict:
    """A holder in the middle of its load is not torn down for anything less."""
    active = _ACTIVE
    loading = next(
        (
            m
            for m in ballot.members
            if m.shared_state is active and is_loading(m) and _within_load_grace(ballot, m)
        ),
        None,
    )
    if loading is None:
        return lambda: "no holder is pending or loading within its load grace"
    challenger = next(
        (m for m in ballot.runnable if m.priority > loading.priority and ballot.is_demanded(m)),
        None,
    )
    if challenger is None:
        return Election(
            loading,
            reasons.LOADING_HOLDER,
            f"{loading.name} is {loading.phase.value.lower()} and keeps the card until "
            "its load finishes; no higher-priority model is demanded",
        )
    return lambda: (
        f"{loading.name} is {loading.phase.value.lower()}, but {challenger.name} "
        f"(priority {challenger.priority}) is demanded and outranks it "
        f"(priority {loading.priority})"
    )


def _load_grace_crossings(ballot: Ballot, after: datetime | None) -> list[Instant]:
    # `loading_grace` (max(recent window, coldStartTimeout)), inlined: every member with
    # activity is counted at every decision. Inclusive, so it lapses a tick later.
    recent = ballot.policy.recent_window
    activity = ballot.activity
    longest = max([recent, *[m.serverless.cold_start_timeout for _, m in activity]])
    out = []
    for last, m in ballot.active_since(after, longest):
        cold = m.serverless.cold_start_timeout
        end = last + (cold if cold > recent else recent)
        if after is None or end >= after:  # end + a tick > after
            out.append((end + _TICK, _LOAD_GRACE, m.name))
    return out


def _load_grace_says(ballot: Ballot, crossing: Crossing) -> str | None:
    if crossing.kind is not _LOAD_GRACE:
        return None
    model = ballot.member(crossing.subject)
    # The load grace only protects a holder that is still loading.
    if model is None or not (model.shared_state is _ACTIVE and is_loading(model)):
        return None
    grace = _fmt(loading_grace(model, ballot.policy))
    return f"{crossing.subject}'s {grace} load grace ends"


def _classify(ballot: Ballot) -> Verdict:
    """Never decides: names the best ready, recent and demanded runnable members."""
    return lambda: _classification(ballot)


def _window_crossings(ballot: Ballot, after: datetime | None) -> list[Instant]:
    policy = ballot.policy
    return [
        *ballot.after_activity(policy.demand_window, _DEMAND_WINDOW, after=after),
        *ballot.after_activity(policy.recent_window, _RECENT_WINDOW, after=after),
    ]


def _window_says(ballot: Ballot, crossing: Crossing) -> str | None:
    if crossing.kind is _DEMAND_WINDOW:
        window = _fmt(ballot.policy.demand_window)
        return f"{crossing.subject}'s last demand leaves the {window} demand window"
    if crossing.kind is _RECENT_WINDOW:
        window = _fmt(ballot.policy.recent_window)
        return f"{crossing.subject}'s last demand leaves the {window} recent window"
    return None


def _demand_preemption(ballot: Ballot) -> Verdict:
    demanded, ready = ballot.demanded, ballot.ready
    if demanded is not None and ready is not None and demanded is not ready:
        if demanded.priority > ready.priority:
            return Election(
                demanded,
                reasons.DEMAND_PREEMPTION,
                f"{demanded.name} (priority {demanded.priority}) is demanded and outranks "
                f"the ready leader {ready.name} (priority {ready.priority})",
            )
        if ballot.is_idle(ready) and demanded.priority >= ready.priority:
            return Election(
                demanded,
                reasons.DEMAND_PREEMPTION,
                f"{demanded.name} is demanded and the ready leader {ready.name} is idle at "
                f"equal priority ({ready.priority})",
            )
    return lambda: _why_no_preemption(ballot)


def _idle_crossings(ballot: Ballot, after: datetime | None) -> list[Instant]:
    # A member is idle only once strictly older than the window.
    return ballot.after_activity(ballot.policy.demand_window + _TICK, _IDLE, after=after)


def _default_yields(ballot: Ballot) -> Verdict:
    """A default that only stays warm gives the card to whoever is demanded."""
    default, ready, demanded = ballot.default, ballot.ready, ballot.demanded
    if default is None:
        return lambda: "the group names no default (spec.gpu.default)"
    if ready is not default:
        return lambda: f"the default {default.name} is not the ready member"
    idle = _fmt(default.serverless.idle_timeout)
    if ballot.is_demanded(default):
        return lambda: f"the default {default.name} is demanded itself"
    if not idle_past_timeout(default, ballot.now):
        return lambda: f"the default {default.name} is in use (inside its {idle} idle timeout)"
    if demanded is None:
        return lambda: f"the default {default.name} stays warm: nobody else is demanded"
    return Election(
        demanded,
        reasons.DEFAULT_YIELDS,
        f"{demanded.name} is demanded and the default {default.name} is idle past its "
        f"{idle} idle timeout (it only stays warm)",
    )


def _default_yield_crossings(ballot: Ballot, after: datetime | None) -> list[Instant]:
    default = ballot.default
    if default is None or default.last_active is None:
        return []
    at = default.last_active + default.serverless.idle_timeout + _TICK
    return [(at, _DEFAULT_YIELD, default.name)] if after is None or at > after else []


def _default_yield_says(ballot: Ballot, crossing: Crossing) -> str | None:
    default = ballot.default
    if (
        crossing.kind is not _DEFAULT_YIELD
        or default is None
        or default.shared_state is not _ACTIVE
    ):
        return None
    # The idle timeout's end itself is said by the leader's replicas rule at the same
    # instant: this says what it means for the default.
    return f"the default {default.name} yields to any demanded member"


def _return_to_default(ballot: Ballot) -> Verdict:
    """The card goes back to the default once nobody else needs it."""
    default = ballot.default
    if default is None:
        return lambda: "the group names no default (spec.gpu.default)"
    name = default.name
    if not default.runnable:
        return lambda: f"the default {name} is not runnable ({_not_runnable(default)})"
    now, window = ballot.now, ballot.policy.demand_window
    other = next(
        (
            m
            for m in ballot.runnable
            if m is not default and m.last_active is not None and now - m.last_active < window
        ),
        None,
    )
    if other is not None:
        return lambda: f"{other.name} is demanded: the default {name} waits"
    holder = ballot.holder
    if holder is None:
        why = "nobody holds the card and nobody else is demanded"
    elif holder is default:
        return Election(
            default,
            reasons.RETURN_TO_DEFAULT,
            f"{name} is the group's default and keeps the card: nobody else is demanded",
        )
    elif not holder.runnable:
        why = f"nobody else is demanded and the holder {holder.name} is {_not_runnable(holder)}"
    else:
        idle = _fmt(holder.serverless.idle_timeout)
        if not idle_past_timeout(holder, now):
            age = _fmt(idle_for(holder, now) or timedelta(0))
            return lambda: (
                f"{holder.name} is in use: idle {age} of its {idle} idle timeout; "
                f"the default {name} returns after it"
            )
        if holder.phase is _READY and scales_to_zero(holder):
            return lambda: (
                f"{holder.name} is idle past its {idle} idle timeout but still Ready: it "
                f"scales itself to zero first, then the default {name} returns"
            )
        why = f"nobody else is demanded and {holder.name} is idle past its {idle} idle timeout"
    return Election(
        default,
        reasons.RETURN_TO_DEFAULT,
        f"{name} is the group's default and takes the card back: {why}",
    )


def _default_return_crossings(ballot: Ballot, after: datetime | None) -> list[Instant]:
    # Every other member's idle timeout, not only the holder's: the timer is read off the
    # ballot before the decision is written, and the decision may change the holder.
    default = ballot.default
    if default is None:
        return []
    activity = ballot.activity
    longest = max([m.serverless.idle_timeout for _, m in activity], default=_TICK)
    out = []
    for last, m in ballot.active_since(after, longest):
        if m is default:
            continue
        end = last + m.serverless.idle_timeout
        if after is None or end >= after:  # end + a tick > after
            out.append((end + _TICK, _DEFAULT_RETURN, m.name))
    return out


def _default_return_says(ballot: Ballot, crossing: Crossing) -> str | None:
    default = ballot.default
    if crossing.kind is not _DEFAULT_RETURN or default is None:
        return None
    holder = ballot.member(crossing.subject)
    # Worth saying only of the member that holds the card.
    if holder is None or holder.shared_state is not _ACTIVE:
        return None
    # The idle timeout's end itself is said by the leader's replicas rule at the same
    # instant ("chat's 5m idle timeout ends"): this says what it means for the default.
    return f"the default {default.name} may take the card back"


def _ready_member(ballot: Ballot) -> Verdict:
    ready = ballot.ready
    if ready is not None:
        return Election(ready, reasons.READY_LEADER, f"{ready.name} is ready and keeps the card")
    return lambda: "no runnable member is Ready"


def _recent_demand(ballot: Ballot) -> Verdict:
    recent = ballot.recent
    window = ballot.policy.recent_window
    if recent is not None:
        return Election(
            recent,
            reasons.RECENT_DEMAND,
            f"{recent.name} was wanted within the last {_fmt(window)}",
        )
    return lambda: f"no runnable member was wanted within the last {_fmt(window)}"


def _fallback(ballot: Ballot) -> Verdict:
    """Always decides: the best member that would run, else the best runnable, else the best."""
    runnable = ballot.runnable
    would_run = next(
        (m for m in runnable if m.serverless.min_replicas >= 1 or not m.serverless.enabled),
        None,
    )
    if would_run is not None:
        chosen, why = would_run, "the best runnable member that runs without demand"
    elif runnable:
        chosen, why = runnable[0], "the best runnable member; nobody is demanded"
    else:
        chosen, why = ballot.members[0], "the best member; no member is runnable"
    return Election(chosen, reasons.FALLBACK, f"{chosen.name} is {why}")


# docs/election.md 1.2, in order; a rule's number is its place here.
CHAIN: Final = (
    Rule("empty group", _empty_group),
    Rule(
        "GPU lease",
        _gpu_lease,
        crossings=_lease_crossings,
        says=_lease_says,
        stops_the_clock=True,
    ),
    Rule("forcePromotion", _force_promotion),
    Rule("swap cooldown", _swap_cooldown, crossings=_cooldown_crossings, says=_cooldown_says),
    Rule(
        "loading holder",
        _loading_holder,
        crossings=_load_grace_crossings,
        says=_load_grace_says,
    ),
    Rule("classify", _classify, crossings=_window_crossings, says=_window_says),
    Rule("demand preemption", _demand_preemption, crossings=_idle_crossings),
    Rule(
        "default yields",
        _default_yields,
        crossings=_default_yield_crossings,
        says=_default_yield_says,
    ),
    Rule(
        "return to default",
        _return_to_default,
        crossings=_default_return_crossings,
        says=_default_return_says,
    ),
    Rule("ready member", _ready_member),
    Rule("recent demand", _recent_demand),
    Rule("fallback", _fallback),
)

# (number, name) of each rule, as `flexinfer explain` numbers them.
RULES: Final = tuple((number, rule.name) for number, rule in enumerate(CHAIN, start=1))


def run_chain(ballot: Ballot) -> tuple[int, Election]:
    """The first rule that decides: its number and its election."""
    for number, rule in enumerate(CHAIN, start=1):
        verdict = rule.decide(ballot)
        if isinstance(verdict, Election):
            return number, verdict
    raise AssertionError("the fallback rule always decides")


def elect(ballot: Ballot) -> Election:
    """The chain's election on `ballot`, failing open on unreadable leases."""
    return _failed_open(run_chain(ballot)[1], ballot)


def elect_leader(
    models: Sequence[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    unreadable_lease_sources: Collection[str] = (),
    policy: Policy = DEFAULT_POLICY,
) -> Election:
    """Apply docs/election.md 1.2 in order and return the first rule that decides.

    `unreadable_lease_sources` names the lease carriers the adapter could not read
    (e.g. "gpuleases", "configmaps"), and a lease with a `problem` (its `expiresAt`
    does not parse) could not be read either; see the module docstring for what they
    change.
    """
    return elect(
        Ballot.of(
            models,
            now=now,
            leases=leases,
            unreadable_lease_sources=unreadable_lease_sources,
            policy=policy,
        )
    )


def explain_election(
    models: Sequence[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    unreadable_lease_sources: Collection[str] = (),
    policy: Policy = DEFAULT_POLICY,
) -> ElectionTrace:
    """`elect_leader`, plus each rule's outcome in order (for `flexinfer explain`)."""
    ballot = Ballot.of(
        models,
        now=now,
        leases=leases,
        unreadable_lease_sources=unreadable_lease_sources,
        policy=policy,
    )
    checks: list[RuleCheck] = []
    decided: Election | None = None
    deciding = 0
    for number, rule in enumerate(CHAIN, start=1):
        if decided is not None:
            checks.append(
                RuleCheck(number, rule.name, False, f"not reached: rule {deciding} decided")
            )
            continue
        verdict = rule.decide(ballot)
        if isinstance(verdict, Election):
            decided, deciding = verdict, number
            checks.append(RuleCheck(number, rule.name, True, verdict.message))
        else:
            checks.append(RuleCheck(number, rule.name, False, verdict()))
    assert decided is not None, "the fallback rule always decides"
    return ElectionTrace(_failed_open(decided, ballot), tuple(checks))


def instants(
    ballot: Ballot, *, after: datetime | None = None, extra: Iterable[Rule] = ()
) -> list[Instant]:
    """Every instant (strictly after `after`; all for None; unordered) at which
    something the chain (and `extra`) reads crosses a boundary. While a rule that
    `stops_the_clock` decides, only its instants and those of the rules before it."""
    out: list[Instant] = []
    for rule in CHAIN:
        if rule.crossings is not None:
            out += rule.crossings(ballot, after)
            if rule.stops_the_clock and isinstance(rule.decide(ballot), Election):
                for stage in extra:
                    if stage.ticks_always and stage.crossings is not None:
                        out += stage.crossings(ballot, after)
                return out
    for rule in extra:
        if rule.crossings is not None:
            out += rule.crossings(ballot, after)
    return out


def crossings(
    ballot: Ballot, *, after: datetime | None = None, extra: Iterable[Rule] = ()
) -> list[Crossing]:
    """`instants`, labelled (for `flexinfer explain`)."""
    return [Crossing(*instant) for instant in instants(ballot, after=after, extra=extra)]


def next_instant(ballot: Ballot, *, after: datetime, extra: Iterable[Rule] = ()) -> datetime | None:
    """The earliest of `instants` strictly after `after`: the controller's timer."""
    ahead = instants(ballot, after=after, extra=extra)
    return min(instant[0] for instant in ahead) if ahead else None


def describe_crossing(
    ballot: Ballot, crossing: Crossing, *, extra: Iterable[Rule] = ()
) -> str | None:
    """The owning rule's words for `crossing` (None when it says nothing of it)."""
    for rule in (*CHAIN, *extra):
        said = rule.says(ballot, crossing)
        if said is not None:
            return said
    return None


def _failed_open(election: Election, ballot: Ballot) -> Election:
    if (
        not (ballot.unreadable or ballot.leases)
        or election.lease is not None
        or not ballot.members
        or not ballot.group
    ):
        return election
    sources = ballot.unreadable
    broken = unreadable_leases(ballot.leases, namespace=ballot.namespace, group=ballot.group)
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


# --- why a rule did not decide (only computed for `explain_election`) ------------------


def _why_no_lease(ballot: Ballot) -> str:
    namespace, group, unreadable = ballot.namespace, ballot.group, ballot.unreadable
    if not group:
        return "not a shared group: GPU leases park shared groups only"
    if unreadable:
        return (
            f"no readable lease parks the group, and {', '.join(unreadable)} could not be "
            "read: proceeding as unleased (fail open)"
        )
    ours = sorted(
        (lease for lease in ballot.leases if lease.namespace == namespace and lease.group == group),
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
        if lease.expires_at is not None and lease.expires_at <= ballot.now
    )
    return f"no active GPU lease on group {group} ({expired})"


def _why_no_cooldown(ballot: Ballot, recently_preempted: Sequence[ModelState]) -> str:
    cooldown = ballot.cooldown
    if recently_preempted:
        names = ", ".join(m.name for m in recently_preempted)
        return (
            f"{names} preempted inside the {_fmt(cooldown)} swap cooldown, but no member "
            "holds the card to keep it"
        )
    stamped = ballot.stamped
    if not stamped:
        return f"no member was preempted within the {_fmt(cooldown)} swap cooldown"
    last = max(stamped, key=lambda m: (_ts(m.preempted_at), m.name))
    assert last.preempted_at is not None
    if last.phase is _READY:
        return f"{last.name} is Ready again, so its preemption no longer holds the group"
    return (
        f"the {_fmt(cooldown)} swap cooldown after {last.name}'s preemption ended at "
        f"{(last.preempted_at + cooldown).isoformat()}"
    )


def _classification(ballot: Ballot) -> str:
    policy = ballot.policy
    parts = [
        f"ready: {_name(ballot.ready)}",
        f"wanted within {_fmt(policy.recent_window)}: {_name(ballot.recent)}",
        f"demanded within {_fmt(policy.demand_window)}: {_name(ballot.demanded)}",
    ]
    blocked = [f"{m.name} ({_not_runnable(m)})" for m in ballot.members if not m.runnable]
    if blocked:
        parts.append(f"not runnable: {', '.join(blocked)}")
    if ballot.default is not None:
        parts.append(f"default: {ballot.default.name}")
    if ballot.ignored_defaults:
        parts.append(f"spec.gpu.default ignored on: {', '.join(ballot.ignored_defaults)}")
    return "; ".join(parts)


def _not_runnable(model: ModelState) -> str:
    return "failed" if model.phase is _FAILED else "cache not ready"


def _why_no_preemption(ballot: Ballot) -> str:
    ready, demanded = ballot.ready, ballot.demanded
    window = _fmt(ballot.policy.demand_window)
    if demanded is None:
        return f"no runnable member was demanded within the last {window}"
    if ready is None:
        return f"{demanded.name} is demanded, but no member is Ready to be preempted"
    if demanded is ready:
        return f"the best demanded member, {demanded.name}, is the ready one"
    asker, holder = demanded.priority, ready.priority
    if ballot.is_demanded(ready):
        return (
            f"{demanded.name} (priority {asker}) does not outrank the ready "
            f"{ready.name} (priority {holder}), which is busy (demanded within {window})"
        )
    if not ballot.is_idle(ready):
        return (
            f"{demanded.name} (priority {asker}) does not outrank the ready "
            f"{ready.name} (priority {holder}), last demanded exactly {window} ago: "
            "neither busy nor yet idle"
        )
    return (
        f"{demanded.name} (priority {asker}) ranks below the idle ready "
        f"{ready.name} (priority {holder})"
    )


def _name(model: ModelState | None) -> str:
    return "-" if model is None else model.name


def _ts(value: datetime | None) -> float:
    return _OLDEST if value is None else value.timestamp()


def _fmt(value: timedelta) -> str:
    return format_duration(value)
