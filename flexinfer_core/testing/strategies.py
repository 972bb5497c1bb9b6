"""Hypothesis strategies for the election core: the one place inputs are generated.

Everything is built around a fixed epoch so failures replay as readable
datetimes. Ages and durations favour the election's thresholds (the 2m demand
window, the 5m recent window and default cooldown, 60s cold start) and their
one-microsecond neighbours, because that is where a `<` written as `<=` hides.
Priorities come from a small set so that ties (and the election's tie-breaks)
happen often. `group_scenarios_for` draws the observed state of a user's own
members. This module generates; it asserts nothing (`invariants` does).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import attrs

try:
    from hypothesis import strategies as st
except ModuleNotFoundError as error:  # the base install has no hypothesis
    raise ModuleNotFoundError(
        "flexinfer_core.testing needs the `testing` extra (hypothesis is not installed): "
        "pip install 'flexinfer[testing]'",
        name=error.name,
    ) from None

from flexinfer_core import (
    DEFAULT_POLICY,
    AntiThrashing,
    GpuGroupMember,
    GpuGroupState,
    GpuLease,
    LeaseSource,
    ModelState,
    Phase,
    Policy,
    PreemptionPolicy,
    Serverless,
    SharedState,
    apply_decision,
    decide_group,
    reasons,
)
from flexinfer_core.testing import oracle
from flexinfer_core.testing.invariants import GroupScenario

_T = TypeVar("_T")

EPOCH = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NAMESPACE = "team-a"
GROUP = "card-0"
OTHER_GROUP = "card-1"
MEMBER_NAMES = ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta")
PRIORITIES = (0, 50, 100, 100, 500, 1000)

# Seconds at which some rule of the election changes its mind.
_THRESHOLD_SECONDS = (0, 1, 30, 59, 60, 61, 119, 120, 121, 299, 300, 301, 600, 601)
_ONE_US = timedelta(microseconds=1)


def durations(max_seconds: int = 1800) -> st.SearchStrategy[timedelta]:
    """Non-negative durations up to `max_seconds`, dense around the election's thresholds.

    Two draws per value: hypothesis's per-draw cost dominates these tests.
    """
    marks = sorted(
        {
            max(timedelta(0), timedelta(seconds=s) + nudge)
            for s in _THRESHOLD_SECONDS
            if s <= max_seconds
            for nudge in (timedelta(0), _ONE_US, -_ONE_US)
        }
    )
    anywhere = st.integers(min_value=0, max_value=max_seconds * 1_000_000).map(
        lambda us: timedelta(microseconds=us)
    )
    return st.one_of(st.sampled_from(marks), anywhere)


# Built once: constructing strategies inside a draw costs more than the test itself.
AGES = durations(1800)
SHORT_AGES = durations(900)
DEMANDED_AGES = durations(119)  # always younger than the 2m demand window
LONG_AGES = durations(3600)
MAYBE_AGE = st.one_of(st.none(), AGES)


def instants() -> st.SearchStrategy[datetime]:
    """Aware UTC instants within a day after the epoch."""
    return st.integers(min_value=0, max_value=86_400 * 1_000_000).map(
        lambda us: EPOCH + timedelta(microseconds=us)
    )


INSTANTS = instants()


def ago(now: datetime, age: timedelta | None) -> datetime | None:
    return None if age is None else now - age


# serverless and swapCooldown in one draw: they matter less often than the rest, and
# every draw costs hypothesis about 50µs.
_SETTINGS = st.sampled_from(
    [
        (
            cooldown,
            Serverless(
                enabled=enabled,
                min_replicas=min_replicas,
                idle_timeout=timedelta(seconds=idle),
                cold_start_timeout=timedelta(seconds=cold),
            ),
        )
        for cooldown in (
            None,
            timedelta(minutes=5),
            timedelta(0),
            timedelta(seconds=60),
            timedelta(minutes=10),
        )
        for enabled in (True, False)
        for min_replicas in (0, 1)
        for idle in (300, 60, 0, 119, 600)
        for cold in (60, 0, 300, 301, 900)
        if enabled or (idle == 300 and cold == 60)
    ]
)
_PRIORITY = st.sampled_from(PRIORITIES)
# Draining is drawn by `draining_scenarios` only, with the facts a drain reads: the
# other suites keep the inputs (and so the decisions) they had before draining existed.
_PHASE = st.sampled_from(tuple(p for p in Phase if p is not Phase.DRAINING))
_PREEMPTED_AGE = st.one_of(st.none(), st.none(), SHORT_AGES)
# sharedGroup.state, forcePromotion, cache readiness and spec.gpu.default in one draw
# (weighted by repetition); it shrinks to (absent, False, ready, False).
_FLAGS = st.sampled_from(
    [
        (state, force, cache, default)
        for state in (None, SharedState.QUEUED, SharedState.QUEUED, SharedState.ACTIVE)
        for force in (False, False, False, False, False, True)
        for cache in (True, True, True, True, False)
        for default in (False, False, False, True)
    ]
)
_CACHE_READY = st.sampled_from((True, True, True, True, False))


@st.composite
def model_states(draw: st.DrawFn, name: str, *, now: datetime) -> ModelState:
    """One member of the group as observed at `now` (status not yet written by us)."""
    swap_cooldown, serverless = draw(_SETTINGS)
    shared_state, force_promotion, cache_ready, default_member = draw(_FLAGS)
    return ModelState(
        name=name,
        namespace=NAMESPACE,
        group=GROUP,
        priority=draw(_PRIORITY),
        phase=draw(_PHASE),
        last_active=ago(now, draw(MAYBE_AGE)),
        shared_state=shared_state,
        preempted_at=ago(now, draw(_PREEMPTED_AGE)),
        swap_cooldown=swap_cooldown,
        force_promotion=force_promotion,
        serverless=serverless,
        default_member=default_member,
        service_labels=(f"svc-{name}",),
        cache_ready=cache_ready,
    )


@functools.cache
def _member_names(min_size: int, max_size: int) -> st.SearchStrategy[list[str]]:
    return st.lists(
        st.sampled_from(MEMBER_NAMES), min_size=min_size, max_size=max_size, unique=True
    )


@st.composite
def group_members(
    draw: st.DrawFn, *, now: datetime, min_size: int = 0, max_size: int = 5
) -> tuple[ModelState, ...]:
    """Members of one shared group: unique names, in no particular order."""
    names = draw(_member_names(min_size, max_size))
    return tuple(draw(model_states(name, now=now)) for name in names)


_LEASE_EXPIRY = st.one_of(
    st.none(),
    LONG_AGES.filter(lambda d: d > timedelta(0)),  # still ahead of now
    LONG_AGES.map(lambda d: -d),  # already expired, at exactly now too
)
_LEASE_SOURCE = st.sampled_from(tuple(LeaseSource))
_LEASE_OWNER = st.sampled_from(("finetune-a", "finetune-b", ""))


@st.composite
def leases(
    draw: st.DrawFn, *, now: datetime, group: str = GROUP, namespace: str = NAMESPACE
) -> GpuLease:
    """A lease on `group`: without expiry, still active, or already expired (at `now` too)."""
    ahead = draw(_LEASE_EXPIRY)
    source = draw(_LEASE_SOURCE)
    owner = draw(_LEASE_OWNER)
    name = f"gpu-lease-{group}" if source is LeaseSource.CONFIG_MAP else f"{owner or 'x'}-lease"
    return GpuLease(
        name=name,
        group=group,
        namespace=namespace,
        owner=owner,
        node="node-1",
        expires_at=None if ahead is None else now + ahead,
        source=source,
    )


@st.composite
def lease_sets(draw: st.DrawFn, *, now: datetime) -> tuple[GpuLease, ...]:
    """Usually none; otherwise a few, some of them on another group (which must not count)."""
    if not draw(st.booleans()):
        return ()
    ours = [draw(leases(now=now)) for _ in range(draw(st.integers(0, 2)))]
    theirs = [draw(leases(now=now, group=OTHER_GROUP)) for _ in range(draw(st.integers(0, 1)))]
    return (*ours, *theirs)


def active_lease(leases_: Sequence[GpuLease], now: datetime) -> bool:
    """Written out independently of the core: does a lease park GROUP (of NAMESPACE)?"""
    return any(
        lease.group == GROUP
        and lease.namespace == NAMESPACE
        and (lease.expires_at is None or now < lease.expires_at)
        for lease in leases_
    )


_BOOLS = st.booleans()
_UNREADABLE_SOURCES = st.sampled_from(
    (("gpuleases",), ("configmaps",), ("configmaps", "gpuleases"))
)


_RUNNING_PICKS = st.lists(st.integers(0, 6), max_size=2)

_IN_FLIGHT = st.sampled_from((0, 0, 1, 3))
# In-flight report ages around DEMAND_STALE_AFTER (5m), and none.
_REPORT_AGE = st.one_of(
    st.none(), st.sampled_from((0, 1, 30, 299, 300, 301, 900)).map(lambda s: timedelta(seconds=s))
)
_DRAIN_TIMEOUT = st.sampled_from((0, 3, 60, 3600)).map(lambda s: timedelta(seconds=s))
_DRAINING_AGE = st.one_of(
    st.none(), st.sampled_from((0, 1, 2, 3, 4, 59, 60, 61, 600)).map(lambda s: timedelta(seconds=s))
)


@st.composite
def draining_facts(draw: st.DrawFn, model: ModelState, *, now: datetime) -> ModelState:
    """`model` with what a drain reads (docs/election.md 1.6): an in-flight report, a
    drain timeout, and sometimes the `Draining` phase with its `drainingSince`."""
    draining = draw(_BOOLS)
    return attrs.evolve(
        model,
        in_flight=draw(_IN_FLIGHT),
        in_flight_at=ago(now, draw(_REPORT_AGE)),
        drain_timeout=draw(_DRAIN_TIMEOUT),
        phase=Phase.DRAINING if draining else model.phase,
        draining_since=ago(now, draw(_DRAINING_AGE)) if draining else None,
        replicas=draw(st.sampled_from((None, 0, 1, 2))),
    )


@st.composite
def draining_scenarios(draw: st.DrawFn, *, min_size: int = 1) -> GroupScenario:
    """A group whose members may have requests in flight and may be draining."""
    now = draw(INSTANTS)
    models = draw(group_members(now=now, min_size=min_size, max_size=4))
    models = tuple(draw(draining_facts(m, now=now)) for m in models)
    leases_ = draw(lease_sets(now=now))
    return _scenario(draw, models, now=now, leases=leases_, lease_unreadable=False)


@st.composite
def running_sets(draw: st.DrawFn, models: Sequence[ModelState]) -> frozenset[str]:
    """Which members still have pods (any phase, terminating included)."""
    chosen = draw(_RUNNING_PICKS)
    return frozenset(models[i % len(models)].name for i in chosen) if models else frozenset()


@st.composite
def group_scenarios(
    draw: st.DrawFn,
    *,
    min_size: int = 0,
    max_size: int = 5,
    with_leases: bool = True,
    lease_unreadable: bool | None = False,
) -> GroupScenario:
    """A group at `now`; sometimes already settled by a decision taken a little earlier.

    Settling gives members the status a controller would have written (one Active
    holder, Preempted victims with `preemptedAt`, recorded conditions), which is
    what the cluster mostly looks like; the raw draw covers odd observed states.
    """
    now = draw(INSTANTS)
    models = draw(group_members(now=now, min_size=min_size, max_size=max_size))
    leases_ = draw(lease_sets(now=now)) if with_leases else ()
    return _scenario(draw, models, now=now, leases=leases_, lease_unreadable=lease_unreadable)


def _scenario(
    draw: st.DrawFn,
    models: tuple[ModelState, ...],
    *,
    now: datetime,
    leases: tuple[GpuLease, ...],
    lease_unreadable: bool | None,
    policy: Policy = DEFAULT_POLICY,
    settled: bool | None = None,
) -> GroupScenario:
    settle: bool = draw(_BOOLS)  # by a decision taken a little earlier
    if settled is not None:
        settle = settled
    if models and settle:
        earlier = now - draw(SHORT_AGES)
        running = draw(running_sets(models))
        models = apply_decision(
            models, decide_group(models, now=earlier, running=running, policy=policy)
        )
    unreadable = draw(_BOOLS) if lease_unreadable is None else lease_unreadable
    return GroupScenario(
        models=models,
        now=now,
        leases=leases,
        running=draw(running_sets(models)),
        unreadable_lease_sources=draw(_UNREADABLE_SOURCES) if unreadable else (),
        policy=policy,
    )


def group_scenarios_for(
    members: Sequence[ModelState],
    *,
    with_leases: bool = True,
    lease_unreadable: bool | None = False,
    policy: Policy = DEFAULT_POLICY,
    settled: bool | None = None,
) -> st.SearchStrategy[GroupScenario]:
    """Your own group: `members` as you wrote them (name, namespace, group, priority,
    swapCooldown, serverless, forcePromotion, serviceLabels kept), each in a drawn
    observed state (phase, `lastActiveTime`, `sharedGroup.state`, `preemptedAt`, cache
    readiness), sometimes settled by an earlier decision as a controller leaves a group;
    leases on its group, which members still have pods, and `now`.

    `settled`: True draws only groups as a controller leaves them (decided and written
    a little before `now`); False only raw observed states, which include ones the
    controller never leaves behind (a Ready member that does not hold the card, after
    someone scaled it by hand); None (the default) both.
    """
    if not members:
        raise ValueError("group_scenarios_for needs at least one member")
    places = {(m.namespace, m.group) for m in members}
    if len(places) != 1 or not members[0].group:
        raise ValueError(f"members must share one namespace and group, not {sorted(places)}")
    if len({m.name for m in members}) != len(members):
        raise ValueError("members must have unique names")
    return _group_scenarios_for(
        tuple(members),
        with_leases=with_leases,
        lease_unreadable=lease_unreadable,
        policy=policy,
        settled=settled,
    )


@st.composite
def _group_scenarios_for(
    draw: st.DrawFn,
    members: tuple[ModelState, ...],
    *,
    with_leases: bool,
    lease_unreadable: bool | None,
    policy: Policy,
    settled: bool | None,
) -> GroupScenario:
    namespace, group = members[0].namespace, members[0].group
    now = draw(INSTANTS)
    observed = []
    for spec in members:
        shared_state, _, cache_ready, _ = draw(_FLAGS)
        observed.append(
            attrs.evolve(
                spec,
                phase=draw(_PHASE),
                last_active=ago(now, draw(MAYBE_AGE)),
                shared_state=shared_state,
                preempted_at=ago(now, draw(_PREEMPTED_AGE)),
                cache_ready=cache_ready,
            )
        )
    leases_: tuple[GpuLease, ...] = ()
    if with_leases and draw(_BOOLS):
        count = draw(st.integers(1, 2))
        leases_ = tuple(
            draw(leases(now=now, group=group, namespace=namespace)) for _ in range(count)
        )
    return _scenario(
        draw,
        tuple(observed),
        now=now,
        leases=leases_,
        lease_unreadable=lease_unreadable,
        policy=policy,
        settled=settled,
    )


_PLACEMENT = st.tuples(
    st.sampled_from((NAMESPACE, "team-b")), st.sampled_from(("", GROUP, OTHER_GROUP))
)


@st.composite
def cluster_models(draw: st.DrawFn) -> tuple[tuple[ModelState, ...], datetime]:
    """A flat list of Models across namespaces and groups (some sharing no card)."""
    now = draw(INSTANTS)
    models = []
    for name in draw(_member_names(0, 7)):
        for _ in range(draw(st.integers(1, 2))):
            namespace, group = draw(_PLACEMENT)
            model = draw(model_states(name, now=now))
            models.append(attrs.evolve(model, namespace=namespace, group=group))
    unique = {m.key: m for m in models}  # one Model per namespace/name
    return tuple(unique.values()), now


# --- groups shaped for one rule of the election ----------------------------------------


_INDEX = st.integers(min_value=0, max_value=63)
_PARKED_STATE = st.sampled_from((None, SharedState.QUEUED))
_LOADING_PHASE = st.sampled_from((Phase.PENDING, Phase.LOADING))


def _pick(draw: st.DrawFn, choices: Sequence[_T]) -> _T:
    """One of `choices` without building a strategy per draw (shrinks to the first)."""
    return choices[draw(_INDEX) % len(choices)]


@functools.cache
def _scenarios(min_size: int) -> st.SearchStrategy[GroupScenario]:
    return group_scenarios(min_size=min_size, with_leases=True)


def _unleased(sc: GroupScenario) -> tuple[GpuLease, ...]:
    """The scenario's leases minus any that would park the group (keeps expired ones)."""
    return tuple(x for x in sc.leases if not active_lease((x,), sc.now))


@st.composite
def ready_leader_scenarios(draw: st.DrawFn, relation: str) -> tuple[GroupScenario, str, str]:
    """A group whose Ready holder L is the best Ready member, and one demanded challenger C.

    `relation` is C's priority relative to L: "lower", "equal" (L busy) or "higher".
    Preconditions (docs/election.md, the rules in order): no forcePromotion, no default
    (rules 8 and 9), no active lease, L the only Active member (so rule 5 cannot fire and
    rule 4 would keep L). For "higher" no cooldown either; for the others, no member at
    or above L's priority (above for "equal") is demanded, so C is the strongest demand
    there is.
    """
    sc = draw(_scenarios(2))
    names = sorted(m.name for m in sc.models)
    leader_name = _pick(draw, names)
    challenger = _pick(draw, [n for n in names if n != leader_name])
    now = sc.now
    leader_priority = _pick(draw, (50, 100, 500))
    if relation == "lower":
        challenger_priority = _pick(draw, [p for p in PRIORITIES if p < leader_priority])
    elif relation == "equal":
        challenger_priority = leader_priority
    else:
        challenger_priority = _pick(draw, [p for p in PRIORITIES if p > leader_priority])

    models: dict[str, ModelState] = {}
    for m in sc.models:
        m = attrs.evolve(m, force_promotion=False, default_member=False)
        if m.name == leader_name:
            last_active = now - draw(DEMANDED_AGES) if relation == "equal" else m.last_active
            m = attrs.evolve(
                m,
                priority=leader_priority,
                phase=Phase.READY,
                shared_state=SharedState.ACTIVE,
                cache_ready=True,
                last_active=last_active,
            )
        else:
            m = attrs.evolve(m, shared_state=draw(_PARKED_STATE))
        if m.name == challenger:
            m = attrs.evolve(
                m,
                priority=challenger_priority,
                last_active=now - draw(DEMANDED_AGES),
                cache_ready=True,
                phase=Phase.IDLE if m.phase in (Phase.FAILED, Phase.READY) else m.phase,
            )
        models[m.name] = m
    leader = models[leader_name]
    for name, m in models.items():
        if name == leader_name:
            continue
        if m.phase is Phase.READY and oracle.rank(m) < oracle.rank(leader):
            m = attrs.evolve(m, phase=Phase.PREEMPTED)
        stronger = (
            m.priority >= leader_priority if relation == "lower" else m.priority > (leader_priority)
        )
        if (
            relation != "higher"
            and name != challenger
            and stronger
            and oracle.runnable(m)
            and oracle.demanded(m, now)
        ):
            m = attrs.evolve(m, last_active=now - oracle.DEMAND_WINDOW - draw(SHORT_AGES))
        models[name] = m
    members = tuple(models[m.name] for m in sc.models)
    if relation == "higher":
        window = oracle.cooldown(members)
        members = tuple(
            attrs.evolve(m, preempted_at=now - window - draw(SHORT_AGES))
            if m.preempted_at is not None and now - m.preempted_at < window
            else m
            for m in members
        )
    return attrs.evolve(sc, models=members, leases=_unleased(sc)), leader_name, challenger


@st.composite
def loading_holder_scenarios(draw: st.DrawFn, *, challenged: bool) -> tuple[GroupScenario, str]:
    """L is the only Active member, Pending or Loading, demanded within its loading grace.

    No forcePromotion, no default, no active lease and no cooldown (rule 4 would keep L too).
    `challenged`: some runnable member of strictly higher priority is demanded;
    otherwise none is.
    """
    sc = draw(_scenarios(2 if challenged else 1))
    now = sc.now
    names = sorted(m.name for m in sc.models)
    holder_name = _pick(draw, names)
    holder_priority = _pick(draw, (0, 50, 100, 500))
    models = []
    for m in sc.models:
        m = attrs.evolve(m, force_promotion=False, default_member=False)
        if m.name == holder_name:
            grace = max(oracle.RECENT_WINDOW, m.serverless.cold_start_timeout)
            age = draw(AGES)
            if age > grace:  # fold into [0, grace]: the grace is inclusive
                age %= grace + timedelta(microseconds=1)
            m = attrs.evolve(
                m,
                priority=holder_priority,
                phase=draw(_LOADING_PHASE),
                shared_state=SharedState.ACTIVE,
                last_active=now - age,
            )
        else:
            m = attrs.evolve(m, shared_state=draw(_PARKED_STATE))
            if (
                not challenged
                and m.priority > holder_priority
                and oracle.runnable(m)
                and oracle.demanded(m, now)
            ):
                m = attrs.evolve(m, last_active=now - oracle.DEMAND_WINDOW)
        models.append(m)
    if challenged:
        challenger = _pick(draw, [n for n in names if n != holder_name])
        models = [
            attrs.evolve(
                m,
                priority=_pick(draw, [p for p in PRIORITIES if p > holder_priority]),
                last_active=now - draw(DEMANDED_AGES),
                cache_ready=True,
                phase=Phase.IDLE if m.phase is Phase.FAILED else m.phase,
            )
            if m.name == challenger
            else m
            for m in models
        ]
    window = oracle.cooldown(models)
    models = [
        attrs.evolve(m, preempted_at=now - window)
        if m.preempted_at is not None and now - m.preempted_at < window
        else m
        for m in models
    ]
    return attrs.evolve(sc, models=tuple(models), leases=_unleased(sc)), holder_name


def contested_scenarios() -> st.SearchStrategy[GroupScenario]:
    """Any group, or one shaped so that a rule about who displaces whom is in play."""
    return st.one_of(
        group_scenarios(with_leases=True, lease_unreadable=None),
        *(ready_leader_scenarios(r).map(lambda c: c[0]) for r in ("lower", "equal", "higher")),
        loading_holder_scenarios(challenged=False).map(lambda c: c[0]),
        loading_holder_scenarios(challenged=True).map(lambda c: c[0]),
    )


# --- GPUGroup (v1alpha1) -------------------------------------------------------------


_QUEUED = st.sampled_from((0, 0, 1, 2, 3, 5))
# The GPUGroup thresholds: 10s hysteresis, 30s minimum run, 60s cooldown.
_GG_MARKS = tuple(
    timedelta(seconds=s) + nudge
    for s in (10, 30, 60)
    for nudge in (timedelta(0), _ONE_US, -_ONE_US)
)
_WAIT_AGES = st.one_of(st.sampled_from((timedelta(0), *_GG_MARKS)), durations(120))
_GG_IDLE = st.sampled_from((timedelta(seconds=300), timedelta(seconds=20)))
_GG_PREEMPTED_AGE = st.one_of(st.none(), st.sampled_from(_GG_MARKS), durations(180))
_GG_PREEMPTED_BY = st.sampled_from(("", "alpha"))
_EXISTS = st.sampled_from((True, True, True, True, False))
# A member whose GPUGroup membership is in conflict (listed twice, or a wrong ref).
_CONFLICT = st.sampled_from(("", "", "", "", "", reasons.LISTED_BY_MULTIPLE_GPU_GROUPS))
# The proxy's report: undated, fresh, or at either side of the 5-minute staleness mark.
_REPORT_AGE = st.one_of(
    st.none(),
    durations(120),
    st.sampled_from((timedelta(minutes=5), timedelta(minutes=5) + _ONE_US)),
)
_SWAP_AGE = st.one_of(st.none(), st.sampled_from(_GG_MARKS), durations(600))
_ANTI_THRASHING = st.builds(
    AntiThrashing,
    enabled=st.sampled_from((True, True, True, False)),
    hysteresis_window=st.sampled_from((timedelta(seconds=10), timedelta(0))),
    request_queue_threshold=st.sampled_from((1, 3, 3)),
    minimum_run_duration=st.sampled_from((timedelta(seconds=30), timedelta(0))),
    cooldown_after_preemption=st.sampled_from((timedelta(seconds=60), timedelta(0))),
)


@st.composite
def gpu_group_members(draw: st.DrawFn, name: str, *, now: datetime) -> GpuGroupMember:
    queued = draw(_QUEUED)
    return GpuGroupMember(
        name=name,
        priority=draw(_PRIORITY),
        queued=queued,
        oldest_waiting=now - draw(_WAIT_AGES) if queued else None,
        reported_at=ago(now, draw(_REPORT_AGE)),
        last_request=ago(now, draw(_SWAP_AGE)),
        idle_timeout=draw(_GG_IDLE),
        preempted_at=ago(now, draw(_GG_PREEMPTED_AGE)),
        preempted_by=draw(_GG_PREEMPTED_BY),
        exists=draw(_EXISTS),
        conflict=draw(_CONFLICT),
        has_pods=draw(_BOOLS),
        ready=draw(_BOOLS),
    )


@st.composite
def gpu_group_states(draw: st.DrawFn, *, min_members: int = 1) -> tuple[GpuGroupState, datetime]:
    """A GPUGroup with its recorded status and the proxy's demand, and `now`."""
    now = draw(INSTANTS)
    names = draw(
        st.lists(st.sampled_from(MEMBER_NAMES[:5]), min_size=min_members, max_size=4, unique=True)
    )
    members = tuple(draw(gpu_group_members(name, now=now)) for name in names)
    current = draw(st.sampled_from((None, *names)))
    last_swap = ago(now, draw(_SWAP_AGE)) if current is not None else None
    state = GpuGroupState(
        name="gg",
        namespace=NAMESPACE,
        members=members,
        current_model=current,
        last_swap_time=last_swap,
        last_swap_reason="earlier swap" if last_swap else "",
        swap_count=draw(st.integers(min_value=0, max_value=5)),
        preemption_policy=draw(st.sampled_from(tuple(PreemptionPolicy))),
        drain_timeout=draw(st.sampled_from((timedelta(seconds=60), timedelta(0)))),
        anti_thrashing=draw(_ANTI_THRASHING),
    )
    return state, now


# --- the simulated group (test_group_machine) ---------------------------------------


@attrs.frozen
class SimMember:
    """A member of the simulated group: its spec, and how its pods behave."""

    model: ModelState
    load_time: timedelta
    termination_time: timedelta


_LOAD_TIMES = st.sampled_from(tuple(timedelta(seconds=s) for s in (0, 5, 30, 90, 180)))
_TERMINATION_TIMES = st.sampled_from(tuple(timedelta(seconds=s) for s in (0, 1, 30, 90)))


# Below the 1000 maximum, so the liveness rule can raise one member above the rest.
_SIM_PRIORITY = st.sampled_from((0, 50, 100, 100, 500))
_SIM_FORCE = st.sampled_from((False,) * 11 + (True,))


@st.composite
def sim_members(draw: st.DrawFn, name: str) -> SimMember:
    swap_cooldown, serverless = draw(_SETTINGS)
    return SimMember(
        model=ModelState(
            name=name,
            namespace=NAMESPACE,
            group=GROUP,
            priority=draw(_SIM_PRIORITY),
            swap_cooldown=swap_cooldown,
            force_promotion=draw(_SIM_FORCE),
            serverless=serverless,
            service_labels=(f"svc-{name}",),
            cache_ready=draw(_CACHE_READY),
        ),
        load_time=draw(_LOAD_TIMES),
        termination_time=draw(_TERMINATION_TIMES),
    )


@st.composite
def sim_groups(draw: st.DrawFn) -> tuple[SimMember, ...]:
    """Two to four members, idle, with no pods: the group as first created."""
    names = draw(_member_names(2, 4))
    return tuple(draw(sim_members(name)) for name in names)
