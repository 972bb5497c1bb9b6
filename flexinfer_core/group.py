"""One shared group's full decision: election plus what each member should look like.

Spec: spec/election.md 1.3. Given the members as observed, the leases, which
members still have pods and `now`, this module says, per member: the target
`sharedGroup` status, phase change, conditions, desired replicas (with
break-before-make), the `ai.flexinfer/active-services` value and the Events to
emit; and for the group, `next_change_at`. A recorded `lastActiveTime` or
`preemptedAt` after `now` is read as `now` (`read_as_now`); one far ahead is also
said in the member's message and a Warning Event, and its `lastActiveTime` rewritten.
It also says exactly which of those differ from what was observed, so an adapter
writes only those, and applying a decision then deciding again at the same `now`
yields no writes (after such a rewrite, one: the message no longer has it to say).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

import attrs

from flexinfer_core import reasons
from flexinfer_core.election import (
    Election,
    candidate_rank,
    elect_leader,
    group_cooldown,
    loading_grace,
)
from flexinfer_core.leases import governing_lease, lease_holder_label
from flexinfer_core.snapshot import (
    DEFAULT_POLICY,
    Condition,
    GpuLease,
    ModelState,
    Phase,
    Policy,
    SharedState,
)
from flexinfer_core.timestamps import far_ahead, future_note, not_after

CONDITION_ACTIVE = "Active"
CONDITION_READY = "Ready"
_TICK = timedelta(microseconds=1)


@attrs.frozen
class Event:
    """A Kubernetes Event to emit on a member."""

    model: str
    reason: str
    message: str
    type: str = "Normal"


@attrs.frozen
class MemberDecision:
    """The target state of one member."""

    name: str
    state: SharedState
    queue_position: int
    preempted_by: str
    phase: Phase
    preempted_at: datetime | None
    desired_replicas: int
    active_services: str
    reason: str
    message: str
    conditions: tuple[Condition, ...]
    events: tuple[Event, ...] = ()
    # Set when the recorded `lastActiveTime` lay in the future: the value to write
    # instead (`now`), so that it ages from here rather than win until that date.
    rewrite_last_active: datetime | None = None

    @property
    def is_leader(self) -> bool:
        return self.state is SharedState.ACTIVE


@attrs.frozen
class MemberChanges:
    """Which parts of one member differ from what was observed: what an adapter writes.

    `status`: the member's status (phase, message, conditions, `sharedGroup`,
    `observedGeneration`); `replicas`: its Deployment's scale, from `replicas_from`
    (None: no Deployment, nothing to scale) to `replicas_to`; `active_services`: the
    annotation on its Service; `events`: to record once the status is written.
    """

    name: str
    status: bool
    replicas: bool
    active_services: bool
    events: tuple[Event, ...]
    replicas_from: int | None = None
    replicas_to: int = 0

    @property
    def any(self) -> bool:
        return self.status or self.replicas or self.active_services or bool(self.events)

    @property
    def scale_down(self) -> bool:
        return self.replicas_from is not None and self.replicas_to < self.replicas_from

    @property
    def scale_up(self) -> bool:
        return self.replicas_from is not None and self.replicas_to > self.replicas_from


@attrs.frozen
class GroupDecision:
    """The whole decision for one group."""

    namespace: str
    group: str
    election: Election
    members: tuple[MemberDecision, ...]
    next_change_at: datetime | None

    @property
    def leader(self) -> str | None:
        return self.election.leader_name

    @property
    def reason(self) -> str:
        return self.election.reason

    @property
    def message(self) -> str:
        return self.election.message

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(e for m in self.members for e in m.events)

    def member(self, name: str) -> MemberDecision:
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(name)

    def changes(self, models: Iterable[ModelState]) -> tuple[MemberChanges, ...]:
        """What an adapter must write to go from `models` (as observed) to this decision."""
        observed = {m.name: m for m in models}
        out = []
        for target in self.members:
            model = observed[target.name]
            status = status_differs(model, target)
            replicas = model.replicas != target.desired_replicas
            services = model.active_services != target.active_services
            if status or replicas or services or target.events:
                out.append(
                    MemberChanges(
                        name=target.name,
                        status=status,
                        replicas=replicas,
                        active_services=services,
                        events=target.events,
                        replicas_from=model.replicas,
                        replicas_to=target.desired_replicas,
                    )
                )
        return tuple(out)


def status_differs(model: ModelState, target: MemberDecision) -> bool:
    """Whether the member's status as written differs from the decision's."""
    if model.generation is not None and model.observed_generation != model.generation:
        return True
    if target.rewrite_last_active is not None:
        return True
    return (
        model.shared_state,
        model.queue_position,
        model.preempted_by,
        model.phase,
        model.recorded_phase,
        model.recorded_message,
        model.recorded_group or "",
        model.preempted_at,
        frozenset(model.conditions),
    ) != (
        target.state,
        target.queue_position,
        target.preempted_by,
        target.phase,
        target.phase,
        target.message,
        model.group,
        target.preempted_at,
        frozenset(target.conditions),
    )


def desired_replicas(model: ModelState, *, now: datetime) -> int:
    """Replicas for a member that holds the card (spec 1.3); a non-leader wants 0."""
    serverless = model.serverless
    if not serverless.enabled:
        return 1
    if model.phase is Phase.LOADING:
        return 1
    if model.last_active is None:
        return serverless.min_replicas
    if now - model.last_active > serverless.idle_timeout:
        return serverless.min_replicas
    return max(1, serverless.min_replicas)


def group_models(models: Iterable[ModelState]) -> dict[tuple[str, str], tuple[ModelState, ...]]:
    """Group a flat list of Models into shared groups keyed by (namespace, group).

    Models without `spec.gpu.shared` share no card and are left out; see
    `standalone_models`.
    """
    groups: dict[tuple[str, str], list[ModelState]] = {}
    for model in models:
        if model.group:
            groups.setdefault((model.namespace, model.group), []).append(model)
    return {key: tuple(sorted(v, key=lambda m: m.name)) for key, v in sorted(groups.items())}


def standalone_models(models: Iterable[ModelState]) -> tuple[ModelState, ...]:
    """Models that share no card; each is decided as a group of one."""
    return tuple(sorted((m for m in models if not m.group), key=lambda m: m.key))


def decide_group(
    models: Sequence[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    unreadable_lease_sources: Collection[str] = (),
    policy: Policy = DEFAULT_POLICY,
    running: Collection[str] = (),
) -> GroupDecision:
    """Elect, then say what every member of the group should look like.

    `leases` are the leases the adapter could read and `unreadable_lease_sources`
    the carriers it could not (the election fails open; see `elect_leader`).
    `running` names the members that still have pods (any phase, terminating
    included); the leader is not scaled up while another member is in it.
    """
    leases = tuple(leases)
    models, from_the_future = read_as_now(models, now=now)
    election = elect_leader(
        models,
        now=now,
        leases=leases,
        unreadable_lease_sources=unreadable_lease_sources,
        policy=policy,
    )
    namespace = models[0].namespace if models else ""
    group = models[0].group if models else ""
    members = _member_decisions(models, election, now=now, running=running)
    if election.leader is not None:
        # The leader's condition gives the reason it holds the card once this decision
        # is applied. Applying can itself change the live rule (a fresh preemption
        # starts the cooldown; the new holder becomes Active), and a condition written
        # with the pre-apply reason would be rewritten on the next reconcile with no
        # news. The Events keep the reason for the change itself.
        settled = _settled_for_election(models, members)
        if settled is not None:
            again = elect_leader(
                settled,
                now=now,
                leases=leases,
                unreadable_lease_sources=unreadable_lease_sources,
                policy=policy,
            )
            if again.leader_name == election.leader_name:
                members = tuple(
                    _held_because(member, again) if member.is_leader else member
                    for member in members
                )
    if from_the_future:
        members = tuple(
            _from_the_future(member, from_the_future[member.name], now=now)
            if member.name in from_the_future
            else member
            for member in members
        )
    return GroupDecision(
        namespace=namespace,
        group=group,
        election=election,
        members=members,
        next_change_at=next_change_at(models, now=now, leases=leases, policy=policy),
    )


@attrs.frozen
class FutureInstants:
    """A member's recorded instants that lay beyond `FUTURE_TOLERANCE` ahead of `now`."""

    last_active: datetime | None = None
    preempted_at: datetime | None = None

    def notes(self) -> list[str]:
        return [
            future_note(field, value)
            for field, value in (
                ("status.lastActiveTime", self.last_active),
                ("status.sharedGroup.preemptedAt", self.preempted_at),
            )
            if value is not None
        ]


def read_as_now(
    models: Sequence[ModelState], *, now: datetime
) -> tuple[list[ModelState], dict[str, FutureInstants]]:
    """The members with every `lastActiveTime` and `preemptedAt` after `now` read as
    `now`, and those that lay more than `FUTURE_TOLERANCE` ahead, by member.

    Read as recorded, a far-future `lastActiveTime` would keep its member demanded (and
    a `preemptedAt` its group in cooldown) until that date.
    """
    out: list[ModelState] = []
    future: dict[str, FutureInstants] = {}
    for model in models:
        last_active = not_after(model.last_active, now)
        preempted_at = not_after(model.preempted_at, now)
        if (last_active, preempted_at) == (model.last_active, model.preempted_at):
            out.append(model)
            continue
        far = FutureInstants(
            last_active=model.last_active if far_ahead(model.last_active, now) else None,
            preempted_at=model.preempted_at if far_ahead(model.preempted_at, now) else None,
        )
        if far.notes():
            future[model.name] = far
        out.append(attrs.evolve(model, last_active=last_active, preempted_at=preempted_at))
    return out, future


def _from_the_future(
    member: MemberDecision, instants: FutureInstants, *, now: datetime
) -> MemberDecision:
    """The member's decision saying that its recorded instants lay in the future and are
    read as now, with a Warning Event; its `lastActiveTime` is rewritten (its
    `preemptedAt` is already the decision's to write)."""
    note = "; ".join(instants.notes())
    message = f"{member.message}; {note}"
    return attrs.evolve(
        member,
        message=message,
        conditions=tuple(
            attrs.evolve(c, message=message) if c.type == CONDITION_ACTIVE else c
            for c in member.conditions
        ),
        events=(
            *member.events,
            Event(member.name, reasons.TIMESTAMP_IN_FUTURE, f"{member.name}: {note}", "Warning"),
        ),
        rewrite_last_active=now if instants.last_active is not None else None,
    )


def _settled_for_election(
    models: Sequence[ModelState], members: Sequence[MemberDecision]
) -> list[ModelState] | None:
    """The members as the election will read them after `members` is applied, or None
    when applying changes nothing the election reads (the steady state: no rework)."""
    targets = {m.name: m for m in members}
    settled = []
    changed = False
    for model in models:
        target = targets[model.name]
        if (model.shared_state, model.phase, model.preempted_at) == (
            target.state,
            target.phase,
            target.preempted_at,
        ):
            settled.append(model)
            continue
        changed = True
        settled.append(
            attrs.evolve(
                model,
                shared_state=target.state,
                phase=target.phase,
                preempted_at=target.preempted_at,
            )
        )
    return settled if changed else None


def _held_because(leader: MemberDecision, holding: Election) -> MemberDecision:
    """The leader's decision with its hold explained by `holding` (unless it waits: for
    the card to be free, or for its cache)."""
    if leader.reason in (reasons.WAITING_FOR_GPU, reasons.CACHE_NOT_READY):
        return leader
    active = Condition(CONDITION_ACTIVE, True, holding.reason, holding.message)
    return attrs.evolve(
        leader,
        reason=holding.reason,
        message=holding.message,
        conditions=(active, *(c for c in leader.conditions if c.type != CONDITION_ACTIVE)),
    )


def _member_decisions(
    models: Sequence[ModelState],
    election: Election,
    *,
    now: datetime,
    running: Collection[str],
) -> tuple[MemberDecision, ...]:
    """Per-member targets as `election` decides them."""
    leader = election.leader
    lease = election.lease
    others = sorted(
        (m for m in models if leader is None or m.name != leader.name),
        key=lambda m: (-m.priority, m.name),
    )
    positions = {m.name: i + 1 for i, m in enumerate(others)}
    if lease is not None:
        holder_label = lease_holder_label(lease)
    else:
        holder_label = leader.name if leader is not None else ""
    leader_services = ",".join(leader.service_labels) if leader is not None else ""
    occupied = sorted(n for n in running if leader is None or n != leader.name)

    members = []
    for model in sorted(models, key=lambda m: m.name):
        if leader is not None and model.name == leader.name:
            members.append(
                _leader_decision(
                    model,
                    election,
                    occupied=occupied,
                    now=now,
                    services=leader_services,
                    has_pods=model.name in running,
                )
            )
        else:
            members.append(
                _parked_decision(
                    model,
                    election,
                    position=positions[model.name],
                    holder_label=holder_label,
                    under_lease=lease is not None,
                    now=now,
                )
            )
    return tuple(members)


def _leader_decision(
    model: ModelState,
    election: Election,
    *,
    occupied: Sequence[str],
    now: datetime,
    services: str,
    has_pods: bool,
) -> MemberDecision:
    want = desired_replicas(model, now=now)
    reason, message = election.reason, election.message
    if want > 0 and not model.cache_ready:
        # Elected as the best of no runnable member (rule 10): it holds the card, but a
        # pod would mount a copy that is not complete. Nothing runs until it is.
        want = 0
        reason = reasons.CACHE_NOT_READY
        message = (
            f"{model.name} holds the GPU but its ModelCache is not ready; it starts once "
            "the copy is complete"
        )
    elif want > 0 and occupied and not has_pods:
        want = 0
        reason = reasons.WAITING_FOR_GPU
        message = (
            f"{model.name} holds the GPU and waits for the pods of "
            f"{', '.join(occupied)} to be gone before scaling up"
        )
    # Preemption ended: a member that is Ready again no longer carries its stamp.
    preempted_at = None if model.phase is Phase.READY else model.preempted_at
    events: tuple[Event, ...] = ()
    if model.shared_state is not SharedState.ACTIVE:
        events = (
            Event(model.name, reasons.PROMOTED, f"{model.name} holds the GPU: {election.message}"),
        )
    return MemberDecision(
        name=model.name,
        state=SharedState.ACTIVE,
        queue_position=0,
        preempted_by="",
        phase=model.phase,
        preempted_at=preempted_at,
        desired_replicas=want,
        active_services=services,
        reason=reason,
        message=message,
        conditions=(
            Condition(CONDITION_ACTIVE, True, reason, message),
            # A holder kept from starting says why in Ready too (kubectl's REASON column).
            _not_ready_because(reason, message)
            if reason in _HOLDER_WAITS and model.phase is not Phase.READY
            else _ready_condition(model.phase, model.name, preempt_reason=reasons.PREEMPTED),
        ),
        events=events,
    )


def _parked_decision(
    model: ModelState,
    election: Election,
    *,
    position: int,
    holder_label: str,
    under_lease: bool,
    now: datetime,
) -> MemberDecision:
    evict_reason = reasons.GPU_LEASE_HELD if under_lease else reasons.PREEMPTED
    phase = model.phase
    preempted_at = model.preempted_at
    events: tuple[Event, ...] = ()
    if model.phase is Phase.READY:
        phase = Phase.PREEMPTED
        preempted_at = now
        events = (
            Event(
                model.name,
                evict_reason,
                f"{model.name} was preempted by {holder_label}: {election.message}",
                type="Warning",
            ),
        )
    if under_lease:
        reason = reasons.GPU_LEASE_HELD
        message = f"parked: {election.message}"
    elif phase is Phase.PREEMPTED:
        reason = reasons.PREEMPTED
        message = f"preempted; {holder_label} holds the GPU (queue position {position})"
    else:
        reason = reasons.QUEUED
        message = (
            f"queued behind {holder_label} (queue position {position})"
            if holder_label
            else f"queued (position {position}); no member holds the GPU"
        )
    return MemberDecision(
        name=model.name,
        state=SharedState.QUEUED,
        queue_position=position,
        preempted_by=holder_label,
        phase=phase,
        preempted_at=preempted_at,
        desired_replicas=0,
        active_services="",
        reason=reason,
        message=message,
        conditions=(
            _parked_condition(reason, message),
            # Not serving because parked: Ready says why (Queued behind whom, or the lease),
            # so kubectl's REASON column never shows a bare Queued state. A preemption and
            # a failure keep their own reason.
            _ready_condition(phase, model.name, preempt_reason=evict_reason)
            if phase in _KEEPS_OWN_READY
            else _not_ready_because(reason, message),
        ),
        events=events,
    )


@functools.lru_cache(maxsize=16384)
def _parked_condition(reason: str, message: str) -> Condition:
    return Condition(CONDITION_ACTIVE, False, reason, message)


_HOLDER_WAITS = frozenset({reasons.WAITING_FOR_GPU, reasons.CACHE_NOT_READY})
_KEEPS_OWN_READY = frozenset({Phase.PREEMPTED, Phase.FAILED})


@functools.lru_cache(maxsize=16384)
def _not_ready_because(reason: str, message: str) -> Condition:
    return Condition(CONDITION_READY, False, reason, message)


@functools.lru_cache(maxsize=16384)
def _ready_condition(phase: Phase, name: str, *, preempt_reason: str) -> Condition:
    # Cached: the same few (phase, member) pairs recur at every reconcile, and the
    # condition is an immutable value.
    if phase is Phase.READY:
        return Condition(CONDITION_READY, True, "Ready", f"{name} is serving")
    if phase is Phase.PREEMPTED:
        why = "a GPU lease" if preempt_reason == reasons.GPU_LEASE_HELD else "another model"
        return Condition(CONDITION_READY, False, preempt_reason, f"{name} gave the GPU to {why}")
    return Condition(CONDITION_READY, False, phase.value, f"{name} is {phase.value.lower()}")


class Threshold(enum.StrEnum):
    """What crosses a boundary at a `next_change_at` instant (for `flexinfer explain`)."""

    LEASE_EXPIRY = "lease expiry"
    DEMAND_WINDOW = "demand window"
    IDLE = "idle past the demand window"
    RECENT_WINDOW = "recent window"
    LOAD_GRACE = "load grace"
    IDLE_TIMEOUT = "idle timeout"
    SWAP_COOLDOWN = "swap cooldown"


def next_change_at(
    models: Iterable[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    policy: Policy = DEFAULT_POLICY,
) -> datetime | None:
    """The earliest instant after `now` at which the decision could change unaided.

    Every threshold the decision reads is listed (`_instants`): demand and recent
    windows, the start of idleness (one tick past the demand window), the loading
    grace and idle timeout (both inclusive, so they lapse one tick later), the
    cooldown and lease expiry. The decision is constant between consecutive
    thresholds, so nothing changes before the earliest future one. Unreadable lease
    sources add no threshold: only the leases that were read can expire.
    """
    future = [at for at in _instants(models, now=now, leases=leases, policy=policy) if at > now]
    return min(future, default=None)


def thresholds(
    models: Iterable[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    policy: Policy = DEFAULT_POLICY,
) -> list[tuple[datetime, Threshold, str]]:
    """Every instant the decision reads a boundary at, with what crosses it and whose
    (a member's or a lease's name); past ones included, unordered. The same list as
    `next_change_at` reads, labelled (for `flexinfer explain`)."""
    labels: list[tuple[Threshold, str]] = []
    instants = _instants(models, now=now, leases=leases, policy=policy, labels=labels)
    return [(at, kind, name) for at, (kind, name) in zip(instants, labels, strict=True)]


def _instants(
    models: Iterable[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease],
    policy: Policy,
    labels: list[tuple[Threshold, str]] | None = None,
) -> list[datetime]:
    """The thresholds; `labels`, when given, gets what crosses at each, in step (the
    controller's hot path asks for none, so it builds no labels)."""
    members = list(models)
    leases = tuple(leases)
    if not members:
        return []
    namespace, group = members[0].namespace, members[0].group
    ours = [
        lease
        for lease in leases
        if lease.expires_at is not None and lease.group == group and lease.namespace == namespace
    ]
    candidates = [lease.expires_at for lease in ours if lease.expires_at is not None]
    if labels is not None:
        labels += [(Threshold.LEASE_EXPIRY, lease.name) for lease in ours]
    if group and governing_lease(leases, namespace=namespace, group=group, now=now):
        # Under a lease only the leases themselves can change the decision.
        return candidates
    cooldown = group_cooldown(members, policy)
    for model in members:
        if model.last_active is not None:
            candidates += [
                model.last_active + policy.demand_window,
                # A member is idle only once strictly older than the window.
                model.last_active + policy.demand_window + _TICK,
                model.last_active + policy.recent_window,
                model.last_active + loading_grace(model, policy) + _TICK,
                model.last_active + model.serverless.idle_timeout + _TICK,
            ]
            if labels is not None:
                labels += [
                    (Threshold.DEMAND_WINDOW, model.name),
                    (Threshold.IDLE, model.name),
                    (Threshold.RECENT_WINDOW, model.name),
                    (Threshold.LOAD_GRACE, model.name),
                    (Threshold.IDLE_TIMEOUT, model.name),
                ]
        if model.preempted_at is not None:
            candidates.append(model.preempted_at + cooldown)
            if labels is not None:
                labels.append((Threshold.SWAP_COOLDOWN, model.name))
    return candidates


def apply_decision(models: Iterable[ModelState], decision: GroupDecision) -> tuple[ModelState, ...]:
    """The models as they would be observed once the decision is written (status, replicas,
    annotation)."""
    out = []
    for model in models:
        target = decision.member(model.name)
        out.append(
            attrs.evolve(
                model,
                shared_state=target.state,
                queue_position=target.queue_position,
                preempted_by=target.preempted_by,
                phase=target.phase,
                preempted_at=target.preempted_at,
                last_active=target.rewrite_last_active or model.last_active,
                conditions=target.conditions,
                replicas=target.desired_replicas,
                active_services=target.active_services,
                recorded_phase=target.phase,
                recorded_message=target.message,
                recorded_group=model.group,
                observed_generation=model.generation,
            )
        )
    return tuple(out)


def leader_order(models: Iterable[ModelState]) -> list[str]:
    """Members best-first by the election's total order (for `flexinfer explain`)."""
    return [m.name for m in sorted(models, key=candidate_rank)]


def running_from_pods(pod_counts: Mapping[str, int]) -> frozenset[str]:
    """Members with at least one pod, from a member → pod count map."""
    return frozenset(name for name, count in pod_counts.items() if count > 0)
