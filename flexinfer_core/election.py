"""The shared-group election: who holds the card, and why.

Spec: spec/election.md 1.1–1.2, rule by rule and in that order. Each rule is a
pure check over the snapshot that either names the leader with a reason and a
message or passes to the next. `better` is a total order, so the result never
depends on the order of the input.

Leases fail open here too (spec section 2): the adapter passes the leases it could
read and the names of the sources it could not. A readable active lease parks the
group whatever else is unreadable; with none, an unreadable source means the
election proceeds as unleased and its message says which sources and why.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta

import attrs

from flexinfer_core import reasons
from flexinfer_core.durations import format_duration
from flexinfer_core.errors import InconsistentGroupError
from flexinfer_core.leases import governing_lease, lease_holder_label
from flexinfer_core.snapshot import (
    DEFAULT_POLICY,
    GpuLease,
    ModelState,
    Phase,
    Policy,
    SharedState,
)

_OLDEST = float("-inf")


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
    # these sources could not be read.
    unreadable_lease_sources: tuple[str, ...] = ()

    @property
    def leader_name(self) -> str | None:
        return None if self.leader is None else self.leader.name

    @property
    def lease_unreadable(self) -> bool:
        """The election proceeded as unleased because leases could not be read."""
        return bool(self.unreadable_lease_sources)


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
    (e.g. "gpuleases", "configmaps"); see the module docstring for what they change.
    """
    key = check_one_group(models)
    election = _elect(models, key, now=now, leases=leases, policy=policy)
    if election.lease is None and key is not None and key[1] and unreadable_lease_sources:
        sources = tuple(sorted(set(unreadable_lease_sources)))
        return attrs.evolve(
            election,
            unreadable_lease_sources=sources,
            message=f"GPU leases could not be read ({', '.join(sources)}); proceeding as "
            f"unleased (fail open): {election.message}",
        )
    return election


def _elect(
    models: Sequence[ModelState],
    key: tuple[str, str] | None,
    *,
    now: datetime,
    leases: Iterable[GpuLease],
    policy: Policy,
) -> Election:
    # 1. Empty group.
    if key is None:
        return Election(None, reasons.EMPTY_GROUP, "the group has no members")
    namespace, group = key
    # One sort by the total order; "the best member such that ..." is then the first
    # one that qualifies (the same as `best` over the filtered members, cheaper).
    models = sorted(models, key=candidate_rank)

    # 2. A GPU lease parks everyone; it beats forcePromotion.
    if group:
        lease = governing_lease(leases, namespace=namespace, group=group, now=now)
        if lease is not None:
            # No expiry in the text: a refreshed lease must not rewrite every status.
            return Election(
                None,
                reasons.GPU_LEASE_HELD,
                f"GPU lease {lease.name} held by {lease_holder_label(lease)}; "
                "every member is parked",
                lease=lease,
            )

    # 3. forcePromotion.
    forced = next((m for m in models if m.force_promotion), None)
    if forced is not None:
        return Election(forced, reasons.FORCE_PROMOTED, f"{forced.name} has forcePromotion set")

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
        return Election(
            holder,
            reasons.SWAP_COOLDOWN,
            f"{holder.name} keeps the card: {victim.name} was preempted at "
            f"{victim.preempted_at.isoformat()}, inside the {_fmt(cooldown)} swap cooldown",
        )

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
            return Election(
                loading,
                reasons.LOADING_HOLDER,
                f"{loading.name} is {loading.phase.value.lower()} and keeps the card until "
                "its load finishes; no higher-priority model is demanded",
            )

    # 6. Classify the runnable members.
    runnable = [m for m in models if m.runnable]
    ready = next((m for m in runnable if m.phase is Phase.READY), None)
    recent = next((m for m in runnable if is_recent(m, now, policy=policy)), None)
    demanded = next((m for m in runnable if is_demanded(m, now, policy=policy)), None)

    # 7. Demand preemption.
    if demanded is not None and ready is not None and demanded.name != ready.name:
        if demanded.priority > ready.priority:
            return Election(
                demanded,
                reasons.DEMAND_PREEMPTION,
                f"{demanded.name} (priority {demanded.priority}) is demanded and outranks the "
                f"ready leader {ready.name} (priority {ready.priority})",
            )
        if not is_demanded(ready, now, policy=policy) and demanded.priority >= ready.priority:
            return Election(
                demanded,
                reasons.DEMAND_PREEMPTION,
                f"{demanded.name} is demanded and the ready leader {ready.name} is idle at equal "
                f"priority ({ready.priority})",
            )

    # 8–9. The ready member, else the most recently wanted one.
    if ready is not None:
        return Election(ready, reasons.READY_LEADER, f"{ready.name} is ready and keeps the card")
    if recent is not None:
        return Election(
            recent,
            reasons.RECENT_DEMAND,
            f"{recent.name} was wanted within the last {_fmt(policy.recent_window)}",
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
    return Election(chosen, reasons.FALLBACK, f"{chosen.name} is {why}")


def _ts(value: datetime | None) -> float:
    return _OLDEST if value is None else value.timestamp()


def _fmt(value: timedelta) -> str:
    return format_duration(value)
