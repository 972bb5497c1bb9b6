"""One shared group's full decision: election plus what each member should look like.

Rules: docs/election.md 1.3. Given the members as observed, the leases, which
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

import functools
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime, timedelta
from typing import Final

import attrs

from flexinfer_core import reasons
from flexinfer_core.drain import DRAIN, drain_note, in_flight, keeps_draining, starts_draining
from flexinfer_core.durations import format_duration
from flexinfer_core.election import (
    Ballot,
    Crossing,
    Election,
    Instant,
    Rule,
    Threshold,
    candidate_rank,
    crossings,
    describe_crossing,
    elect,
    next_instant,
)
from flexinfer_core.leases import lease_holder_label
from flexinfer_core.packing import Packing, group_budget, memory_gate, pack
from flexinfer_core.snapshot import (
    DEFAULT_POLICY,
    Condition,
    GpuLease,
    ModelState,
    Phase,
    Policy,
    ServerFailure,
    SharedState,
    VramUse,
    with_written_status,
)
from flexinfer_core.timestamps import far_ahead, future_note, not_after

CONDITION_ACTIVE = "Active"
CONDITION_READY = "Ready"
# Whether the member holds the card beside others, and why (docs/election.md 1.7):
# written only in a group whose members set a VRAM budget (or once did).
CONDITION_PACKED = "Packed"
_TICK = timedelta(microseconds=1)
# Enum members as module constants: on Python 3.11 reading one off its class goes
# through the metaclass's attribute hook, some twenty times slower than a global, and
# every member's decision reads several (flexinfer_core.election does the same).
_ACTIVE, _QUEUED = SharedState.ACTIVE, SharedState.QUEUED
_READY, _FAILED, _PREEMPTED, _LOADING = Phase.READY, Phase.FAILED, Phase.PREEMPTED, Phase.LOADING
_DRAINING = Phase.DRAINING
_IDLE_TIMEOUT = Threshold.IDLE_TIMEOUT


# The decision's values are built for every member at every reconcile and dropped
# with the decision: frozen classes with a __dict__ (slots=False) are built about
# twice as fast as slotted frozen ones (attrs writes the dict instead of calling
# object.__setattr__ per field). The snapshots, which live long and are many, keep
# their slots.
@attrs.frozen(slots=False)
class Event:
    """A Kubernetes Event to emit on a member."""

    model: str
    reason: str
    message: str
    type: str = "Normal"


@attrs.frozen(slots=False)
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
    # `status.sharedGroup.drainingSince` to write: set while the member drains
    # (docs/election.md 1.6), kept from the status once it started.
    draining_since: datetime | None = None

    @property
    def is_leader(self) -> bool:
        return self.state is _ACTIVE


@attrs.frozen
class MemberChanges:
    """Which parts of one member differ from what was observed: what an adapter writes.

    `status`: the member's status (phase, message, conditions, `sharedGroup`,
    `observedGeneration`); `replicas`: its Deployment's scale, from `replicas_from`
    (None: no Deployment, nothing to scale) to `replicas_to`; `active_services`: the
    annotation on its Service; `events`: to record once the status is written.
    `progress`: the status differs only in how far a holder has come on its way to
    serving, taking the card included (`progress_only`), which an adapter may
    coalesce with what follows.
    """

    name: str
    status: bool
    replicas: bool
    active_services: bool
    events: tuple[Event, ...]
    replicas_from: int | None = None
    replicas_to: int = 0
    progress: bool = False

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
class PackedStatus:
    """What a member of a budgeted group is told of the packing (docs/election.md 1.7):
    its `Packed` condition and its `status.vram`. Apart from its members' decisions,
    which are exactly those of a group without packing whenever the group is not
    packed."""

    name: str
    condition: Condition
    vram: VramUse | None


@attrs.frozen(slots=False)
class GroupDecision:
    """The whole decision for one group."""

    namespace: str
    group: str
    election: Election
    members: tuple[MemberDecision, ...]
    next_change_at: datetime | None
    # Every member's packing words, by name order; empty when no member sets a VRAM
    # budget and none was told of one before.
    packed: tuple[PackedStatus, ...] = ()

    def packed_status(self, name: str) -> PackedStatus | None:
        return next((p for p in self.packed if p.name == name), None)

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
        # The members an eviction names: a parked member keeps `preemptedBy` while it
        # is Preempted (or Draining), and only such a member's status names a holder.
        handed = {
            m.preempted_by
            for m in self.members
            if m.preempted_by and (m.phase is _PREEMPTED or m.phase is _DRAINING)
        }
        out = []
        packed = {p.name: p for p in self.packed} if self.packed else None
        for target in self.members:
            model = observed[target.name]
            status = status_differs(model, target) or (
                packed is not None and _packed_differs(model, packed.get(target.name))
            )
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
                        progress=status
                        and progress_only(model, target, named_by_eviction=target.name in handed),
                    )
                )
        return tuple(out)


def _packed_differs(model: ModelState, packed: PackedStatus | None) -> bool:
    if packed is None:
        return False
    return (model.recorded_packed, model.recorded_vram) != (packed.condition, packed.vram)


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
        model.draining_since,
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
        target.draining_since,
        frozenset(target.conditions),
    )


# The phases of a holder on its way to serving: waiting for the card to be free (its
# own phase still Idle or Preempted), its pod being made (Pending), its server loading.
_STARTING = frozenset({Phase.IDLE, Phase.PREEMPTED, Phase.PENDING, Phase.LOADING})


def progress_only(
    model: ModelState, target: MemberDecision, *, named_by_eviction: bool = False
) -> bool:
    """Whether the member's written status differs from the decision's only in a
    holder's progress toward serving, which an adapter may hold back briefly and let
    the next write carry (docs/controller.md). Two cases, both short of Ready (and not
    Failed), with no Event to record and nothing else to correct:

    - it held the card when its status was last written and still does, and only its
      phase among Idle, Preempted, Pending and Loading and the reason and message that
      go with it move: nobody acts on that but people (the election reads phases from
      the pods, the proxy waits for Ready);
    - it takes the card (`takes_over`) from a member that was serving and is evicted
      (`Preempted`, or `Draining`) naming it in `preemptedBy` (`named_by_eviction`):
      that member's status, written at once, is the handover's record, so this
      member's own `Active` may follow with its `Ready`. Meanwhile the election reads
      the holder from the evicted member's status (`handed_over`), as the proxy does.
    """
    if (
        target.state is not SharedState.ACTIVE
        or target.phase not in _STARTING
        or target.events
        or target.rewrite_last_active is not None
        or (model.generation is not None and model.observed_generation != model.generation)
        or (model.recorded_group or "") != model.group
    ):
        return False
    if model.shared_state is not SharedState.ACTIVE:
        return named_by_eviction and takes_over(model, target)
    return (
        model.recorded_phase in _STARTING
        and model.queue_position == target.queue_position
        and model.preempted_by == target.preempted_by
        and model.preempted_at == target.preempted_at
    )


def shown_on_its_way(model: ModelState) -> bool:
    """Whether the member's status as written already says it holds the card and is on
    its way to serving: `Active`, and `Pending` or `Loading`, or still `Idle` or
    `Preempted` with a Ready condition saying why it waits (`WaitingForGPU`,
    `CacheNotReady`). A reader then knows who holds the card and that it does not serve
    yet, so a later step of that way (its pod made, loading) is detail an adapter may
    hold back longer than the first step (docs/controller.md). An `Idle` holder that
    says no more (a Model alone, scaled from zero) is not: its first step is news."""
    if model.shared_state is not SharedState.ACTIVE:
        return False
    if model.recorded_phase in (Phase.PENDING, Phase.LOADING):
        return True
    return model.recorded_phase in (Phase.IDLE, Phase.PREEMPTED) and any(
        c.type == CONDITION_READY and not c.status and c.reason in _HOLDER_WAITS
        for c in model.conditions
    )


def takes_over(model: ModelState, target: MemberDecision) -> bool:
    """Whether `target` hands the card to a member whose status does not say it holds
    it, with no Event of its own: the handover's one Event is on the member it evicts
    (docs/election.md 1.3)."""
    return (
        model.shared_state is not SharedState.ACTIVE
        and target.state is SharedState.ACTIVE
        and not target.events
    )


def loading_is_wanted(model: ModelState, *, now: datetime) -> bool:
    """Whether a loading member is still asked for: its last demand is at most
    max(idle timeout, coldStartTimeout) old (docs/election.md 1.3). A load whose every
    waiting client left (the proxy withdrew its demand) is not finished for nobody."""
    if model.last_active is None:
        return False
    serverless = model.serverless
    return now - model.last_active <= max(serverless.idle_timeout, serverless.cold_start_timeout)


def desired_replicas(model: ModelState, *, now: datetime, warm: bool = False) -> int:
    """Replicas for a member that holds the card (spec 1.3); a non-leader wants 0.

    `warm`: the member is its group's default (docs/election.md 1.5), which never goes
    below one replica while it holds the card, whatever its idle timeout.
    """
    serverless = model.serverless
    if not serverless.enabled:
        return 1
    if model.phase is _LOADING and loading_is_wanted(model, now=now):
        return 1
    if warm:
        return max(1, serverless.min_replicas)
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
    shared_card: bool = True,
) -> GroupDecision:
    """Elect, then say what every member of the group should look like.

    `leases` are the leases the adapter could read and `unreadable_lease_sources`
    the carriers it could not (the election fails open; see `elect_leader`).
    `running` names the members that still have pods (any phase, terminating
    included); the leader is not scaled up while another member is in it.
    `shared_card`: the members' pods can share one card (the cluster has a Dynamic
    Resource Allocation driver for its GPUs); False, a group with a VRAM budget
    decides exactly as without one and its members are told why (docs/election.md 1.7).
    """
    models, from_the_future = read_as_now(models, now=now)
    handover = handed_over(models)
    if handover is not None:
        # The holder whose own status is not written yet holds the card all the same.
        holder = handover[0]
        models = [
            with_written_status(m, shared_state=_ACTIVE, phase=m.phase, preempted_at=m.preempted_at)
            if m.name == holder
            else m
            for m in models
        ]
    ballot = Ballot.of(
        models,
        now=now,
        leases=leases,
        unreadable_lease_sources=unreadable_lease_sources,
        policy=policy,
    )
    election = elect(ballot)
    default = ballot.default.name if ballot.default is not None else None
    # docs/election.md 1.7: only a group whose members set a VRAM budget is packed; any
    # other decides exactly as before packing existed.
    budgeted = any(m.vram_budget for m in models)
    packing = pack(ballot, election) if budgeted and shared_card else None
    members = _member_decisions(
        models, election, now=now, running=running, default=default, packing=packing
    )
    if election.leader is not None:
        # The leader's condition gives the reason it holds the card once this decision
        # is applied. Applying can itself change the live rule (a fresh preemption
        # starts the cooldown; the new holder becomes Active), and a condition written
        # with the pre-apply reason would be rewritten on the next reconcile with no
        # news. The Events keep the reason for the change itself.
        settled = ballot.settled(members)
        if settled is not None:
            again = elect(settled)
            if (
                packing is not None
                and packing.used
                and again.leader is not None
                and again.leader_name != election.leader_name
                and again.leader_name in packing.holders
            ):
                # A packed group: once written, another of the same holders leads
                # (several are Active; a loading one leads by rule 5). Name it leader
                # now, so the next reconcile finds nothing to rewrite; the set is the
                # same.
                election = again
                packing = pack(ballot, election)
                members = _member_decisions(
                    models, election, now=now, running=running, default=default, packing=packing
                )
                # Naming it leader can itself change what the written decision makes
                # of the rules (a member it replaces is preempted now, which starts the
                # cooldown): settle once more, so its condition gives the reason it
                # holds the card once this decision is applied.
                resettled = ballot.settled(members)
                again = elect(resettled) if resettled is not None else election
            if again.leader_name == election.leader_name:
                members = tuple(
                    _held_because(member, again) if member.name == election.leader_name else member
                    for member in members
                )
    if ballot.ignored_defaults:
        members = tuple(
            _default_ignored(member, default or "")
            if member.name in ballot.ignored_defaults
            else member
            for member in members
        )
    failures = {m.name: m.failure for m in models if m.phase is Phase.FAILED and m.failure}
    if failures:
        members = tuple(
            _with_failure(member, failures[member.name])
            if member.name in failures and member.phase is Phase.FAILED
            else member
            for member in members
        )
    # What the members are told of the packing: only in a shared group (a Model alone
    # has nobody to share its card with, whatever its budget says).
    packed = (
        _packed_statuses(models, ballot, members, shared_card=shared_card)
        if ballot.group and (budgeted or _any_was_packed(models))
        else ()
    )
    if from_the_future:
        members = tuple(
            _from_the_future(member, from_the_future[member.name], now=now)
            if member.name in from_the_future
            else member
            for member in members
        )
    return GroupDecision(
        namespace=ballot.namespace,
        group=ballot.group,
        election=election,
        members=members,
        next_change_at=_next_change(ballot),
        packed=packed,
    )


NO_SHARED_CARD_CONDITION = Condition(
    CONDITION_PACKED,
    False,
    reasons.NO_SHARED_CARD,
    "the cluster cannot put two servers on one card (the controller has no "
    "--gpu-device-class: no Dynamic Resource Allocation driver for its GPUs): the group "
    "runs one member at a time",
)


def _any_was_packed(models: Sequence[ModelState]) -> bool:
    """Whether a member's status says its group had a VRAM budget (so that its words say
    there is none now rather than stay as written). One comprehension: this runs for
    every group at every decision."""
    return bool([m for m in models if m.recorded_vram is not None or m.recorded_packed is not None])


def _packed_statuses(
    models: Sequence[ModelState],
    ballot: Ballot,
    members: tuple[MemberDecision, ...],
    *,
    shared_card: bool = True,
) -> tuple[PackedStatus, ...]:
    """Each member's `Packed` condition and `status.vram` (docs/election.md 1.7), as the
    packing reads once the decision is written: what they say is then not rewritten on
    the next reconcile with no news. Without a shared card, nobody is packed."""
    budget = group_budget(models)
    final: Packing | None = None
    if budget.size is not None and shared_card:
        settled = ballot.settled(members) or ballot
        final = pack(settled, elect(settled))
    out = []
    for model in sorted(models, key=_NAME):
        used = (final.used or None) if final is not None else None
        vram: VramUse | None = VramUse(model.vram_estimate, budget.size, used)
        if budget.conflict:
            condition = Condition(
                CONDITION_PACKED,
                False,
                reasons.VRAM_BUDGET_CONFLICT,
                f"{budget.conflict}: the group runs one member at a time",
            )
        elif budget.size is None:
            vram = None
            condition = Condition(
                CONDITION_PACKED,
                False,
                reasons.NO_VRAM_BUDGET,
                "the group sets no VRAM budget: it runs one member at a time",
            )
        elif final is None:  # no shared card
            condition = NO_SHARED_CARD_CONDITION
        else:
            seat = final.seat(model.name)
            condition = Condition(CONDITION_PACKED, seat.admitted, seat.reason, seat.message)
        out.append(PackedStatus(model.name, condition, vram))
    return tuple(out)


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


def handed_over(models: Iterable[ModelState]) -> tuple[str, datetime] | None:
    """While no member's status says `Active`: the member the latest eviction names,
    and when it was evicted (docs/election.md 1.3). An adapter may write a new holder's
    status after the status of the member it evicted (`progress_only`); until then
    the evicted member's `preemptedBy` is the record of who holds the card. An
    eviction is a recorded `Preempted` phase stamped `preemptedAt`, or a `Draining`
    one stamped `drainingSince`; the latest wins, and names nobody unless its
    `preemptedBy` is a member (a lease's label, a deleted member). None while some
    member says `Active`, or no eviction names a member."""
    members = list(models)
    if any(m.shared_state is _ACTIVE for m in members):
        return None
    evictions = []
    for m in members:
        if m.recorded_phase is _PREEMPTED:
            at = m.preempted_at
        elif m.recorded_phase is _DRAINING:
            at = m.draining_since
        else:
            continue
        if at is not None:
            evictions.append((at, m.preempted_by or ""))
    return latest_eviction(evictions, {m.name for m in members})


def latest_eviction(
    evictions: Iterable[tuple[datetime, str]], members: AbstractSet[str]
) -> tuple[str, datetime] | None:
    """Of (when evicted, `preemptedBy`) pairs: the member the latest eviction names, and
    when (a tie goes to the greater name, so every reader agrees); None when there is
    none or it names no member (a lease's label, a deleted member). The one rule of
    `handed_over` and of the readers of stored statuses (`flexinfer_kube.recorded_status`)."""
    latest = max(evictions, default=None)
    if latest is None or latest[1] not in members:
        return None
    return latest[1], latest[0]


def read_as_now(
    models: Sequence[ModelState], *, now: datetime
) -> tuple[list[ModelState], dict[str, FutureInstants]]:
    """The members with every `lastActiveTime` and `preemptedAt` after `now` read as
    `now`, and those that lay more than `FUTURE_TOLERANCE` ahead, by member.

    Read as recorded, a far-future `lastActiveTime` would keep its member demanded (and
    a `preemptedAt` its group in cooldown) until that date.
    """
    # The usual case, checked by one comprehension: nothing lies after `now`.
    if not [
        m
        for m in models
        if (m.last_active is not None and m.last_active > now)
        or (m.preempted_at is not None and m.preempted_at > now)
    ]:
        return list(models), {}
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
    return attrs.evolve(
        _with_note(member, note),
        events=(
            *member.events,
            Event(member.name, reasons.TIMESTAMP_IN_FUTURE, f"{member.name}: {note}", "Warning"),
        ),
        rewrite_last_active=now if instants.last_active is not None else None,
    )


def _default_ignored(member: MemberDecision, default: str) -> MemberDecision:
    """The decision of a member whose `spec.gpu.default` is ignored because another
    member of its group is the default (docs/election.md 1.5), saying so."""
    note = (
        f"spec.gpu.default ignored: {default} is the group's default (higher priority, then name)"
    )
    message = f"{member.message}; {note}"
    return attrs.evolve(
        member,
        message=message,
        conditions=tuple(
            attrs.evolve(c, message=message) if c.message == member.message else c
            for c in member.conditions
        ),
    )


def _held_because(leader: MemberDecision, holding: Election) -> MemberDecision:
    """The leader's decision with its hold explained by `holding` (unless it waits: for
    the card to be free, or for its cache)."""
    if leader.reason in (reasons.WAITING_FOR_GPU, reasons.CACHE_NOT_READY):
        return leader
    active = Condition(CONDITION_ACTIVE, True, holding.reason, holding.message)
    # attrs.evolve reads every field through the class's field list; this runs for most
    # groups whose decision changes anything, and a MemberDecision's fields are its dict.
    return MemberDecision(
        **{
            **leader.__dict__,
            "reason": holding.reason,
            "message": holding.message,
            "conditions": (
                active,
                *[c for c in leader.conditions if c.type != CONDITION_ACTIVE],
            ),
        }
    )


def _member_decisions(
    models: Sequence[ModelState],
    election: Election,
    *,
    now: datetime,
    running: Collection[str],
    default: str | None,
    packing: Packing | None = None,
) -> tuple[MemberDecision, ...]:
    """Per-member targets as `election` decides them (`default`: the group's default
    member, which stays warm while it leads; `packing`: the members that hold the card
    beside the leader, docs/election.md 1.7)."""
    leader = election.leader
    lease = election.lease
    leader_name = leader.name if leader is not None else None
    by_name = sorted(models, key=_NAME)
    # Queue positions: priority first, then name (a stable sort of the name order).
    others = sorted((m for m in by_name if m.name != leader_name), key=_PRIORITY, reverse=True)
    beside = set(packing.holders[1:]) if packing is not None else set()
    positions = {m.name: i for i, m in enumerate(others, start=1)}
    holder_label = lease_holder_label(lease) if lease is not None else leader_name or ""
    parked = _Parked(election, holder_label=holder_label, now=now)
    # One Event a handover: the member that loses the card while serving gets
    # `Preempted` naming the new holder; `Promoted` only when nobody is evicted.
    evicting = lease is None and any(m.phase is _READY and m.name not in beside for m in others)
    # The members that lose (or lost) the card and drain their requests in flight
    # first (docs/election.md 1.6): the leader says it waits for them.
    draining = [
        m
        for m in others
        if m.name not in beside
        and (starts_draining(m, now) or (m.phase is _DRAINING and keeps_draining(m, now)))
    ]
    # Only a leader of known footprint within the budget is packed (`Packing.used`);
    # any other holds the card alone exactly as without a budget.
    if packing is not None and packing.used and leader is not None:
        return _packed_decisions(
            models,
            election,
            packing,
            now=now,
            running=running,
            parked=parked,
            positions=positions,
            announce=not evicting,
            default=default,
            draining=draining,
        )
    members = []
    for model in by_name:
        if model.name == leader_name:
            members.append(
                _leader_decision(
                    model,
                    election,
                    occupied=sorted(n for n in running if n != leader_name),
                    now=now,
                    services=",".join(model.service_labels),
                    has_pods=model.name in running,
                    announce=not evicting,
                    warm=model.name == default,
                    draining=draining,
                )
            )
        else:
            members.append(parked.decision(model, positions[model.name]))
    return tuple(members)


_NAME = operator.attrgetter("name")
_PRIORITY = operator.attrgetter("priority")


def _packed_decisions(
    models: Sequence[ModelState],
    election: Election,
    packing: Packing,
    *,
    now: datetime,
    running: Collection[str],
    parked: _Parked,
    positions: Mapping[str, int],
    announce: bool,
    default: str | None,
    draining: Sequence[ModelState],
) -> tuple[MemberDecision, ...]:
    """The targets of a budgeted group (docs/election.md 1.7): every holder is sized as
    the leader is, and starts only when `memory_gate` lets it, in the order of the set
    (leader first), each start counted before the next is gated."""
    by_name = {m.name: m for m in models}
    live = set(running)
    size = packing.budget.size
    decided: dict[str, MemberDecision] = {}
    for name in packing.holders:
        model = by_name[name]
        seat = packing.seat(name)
        held = (
            election
            if name == election.leader_name
            else attrs.evolve(
                election,
                leader=model,
                reason=reasons.CO_RESIDENT,
                message=f"{name} shares the card with {election.leader_name}: {seat.message}",
            )
        )
        may_start, why = memory_gate(name, members=models, running=live, budget=size)
        decision = _leader_decision(
            model,
            held,
            occupied=() if may_start else sorted(n for n in live if n != name),
            memory_wait=why,
            now=now,
            services=",".join(model.service_labels),
            has_pods=name in running,
            announce=announce,
            warm=name == default,
            draining=draining,
        )
        if decision.desired_replicas > 0:
            live.add(name)
        decided[name] = decision
    for model in models:
        if model.name in decided:
            continue
        seat = packing.seat(model.name)
        if model.name in packing.evicted:
            # Its eviction says why: who needed how much room.
            words = attrs.evolve(election, message=seat.message)
            evicting = _Parked(words, holder_label=parked.holder_label, now=now)
            decided[model.name] = evicting.decision(model, positions[model.name])
        elif model.shared_state is _ACTIVE and model.phase is _READY:
            # It gives its seat up because it idled out: no preemption, no cooldown.
            idle = attrs.evolve(model, phase=Phase.IDLE)
            decided[model.name] = parked.decision(idle, positions[model.name])
        else:
            decided[model.name] = parked.decision(model, positions[model.name])
    return tuple(decided[m.name] for m in sorted(models, key=_NAME))


def _leader_decision(
    model: ModelState,
    election: Election,
    *,
    occupied: Sequence[str],
    now: datetime,
    services: str,
    has_pods: bool,
    announce: bool = True,
    warm: bool = False,
    draining: Sequence[ModelState] = (),
    memory_wait: str = "",
) -> MemberDecision:
    # A member that drained and is elected again simply goes on serving.
    phase = _READY if model.phase is _DRAINING else model.phase
    want = desired_replicas(model, now=now, warm=warm)
    reason, message = election.reason, election.message
    if want > 0 and not model.cache_ready:
        # Elected as the best of no runnable member (rule 12): it holds the card, but a
        # pod would mount a copy that is not complete. Nothing runs until it is.
        want = 0
        reason = reasons.CACHE_NOT_READY
        message = (
            f"{model.name} holds the GPU but its ModelCache is not ready; it starts once "
            "the copy is complete"
        )
    elif want > 0 and draining and not has_pods:
        want = 0
        reason = reasons.WAITING_FOR_GPU
        message = f"{model.name} holds the GPU and is waiting for " + ", ".join(
            drain_note(m, now) for m in draining
        )
    elif want > 0 and occupied and not has_pods:
        want = 0
        reason = reasons.WAITING_FOR_GPU
        message = (
            f"{model.name} holds the GPU and {memory_wait}"
            if memory_wait
            else f"{model.name} holds the GPU and waits for the pods of "
            f"{', '.join(occupied)} to be gone before scaling up"
        )
    # Preemption ended: a member that is Ready again no longer carries its stamp.
    preempted_at = None if phase is _READY else model.preempted_at
    events: tuple[Event, ...] = ()
    if announce and model.shared_state is not _ACTIVE:
        events = (
            Event(model.name, reasons.PROMOTED, f"{model.name} holds the GPU: {election.message}"),
        )
    return MemberDecision(
        name=model.name,
        state=_ACTIVE,
        queue_position=0,
        preempted_by="",
        phase=phase,
        preempted_at=preempted_at,
        desired_replicas=want,
        active_services=services,
        reason=reason,
        message=message,
        conditions=(
            Condition(CONDITION_ACTIVE, True, reason, message),
            # A holder kept from starting says why in Ready too (kubectl's REASON column).
            _not_ready_because(reason, message)
            if reason in _HOLDER_WAITS and phase is not _READY
            else _ready_condition(phase, model.name, model.failure),
        ),
        events=events,
    )


class _Parked:
    """The decisions of one group's parked members: what they share (the holder, the
    lease, the election's message) is worked out once per group, not once per member."""

    def __init__(self, election: Election, *, holder_label: str, now: datetime) -> None:
        self.election = election
        self.holder_label = holder_label
        self.now = now
        self.under_lease = election.lease is not None
        self.evict_reason = reasons.GPU_LEASE_HELD if self.under_lease else reasons.PREEMPTED
        self.lease_message = f"parked: {election.message}"

    def decision(self, model: ModelState, position: int) -> MemberDecision:
        holder_label = self.holder_label
        name = model.name
        phase = model.phase
        preempted_at = model.preempted_at
        events: tuple[Event, ...] = ()
        # Who took the card from it, as it happened: a queued member's status never
        # names the current holder, so a handover between two others writes nothing on
        # it (the holder is the member whose state is Active; `flexinfer status` shows
        # the queue).
        preempted_by = ""
        replicas = 0
        draining_since: datetime | None = None
        if phase is _READY:
            preempted_by = holder_label
            now = self.now
            said = f"{name} was preempted by {holder_label}: {self.election.message}"
            if starts_draining(model, now):
                # docs/election.md 1.6: it keeps its pods until its requests in flight
                # are answered or its drain timeout ends. The handover's one Event is
                # said now; the eviction (and its cooldown) comes when the drain ends.
                phase, draining_since = _DRAINING, now
                replicas = 1 if model.replicas is None else model.replicas
                said += (
                    f"; it drains its {in_flight(model, now)} request(s) in flight first "
                    f"(drain timeout {format_duration(model.drain_timeout)})"
                )
            else:
                phase = _PREEMPTED
                preempted_at = now
            events = (Event(name, self.evict_reason, said, type="Warning"),)
        elif phase is _DRAINING:
            # Under a lease a parked member names the lease, as below.
            preempted_by = (
                holder_label if self.under_lease else (model.preempted_by or holder_label)
            )
            if keeps_draining(model, self.now):
                draining_since = model.draining_since
                replicas = 1 if model.replicas is None else model.replicas
            else:  # drained, or its deadline passed: now it is evicted
                phase = _PREEMPTED
                preempted_at = self.now
        elif self.under_lease:
            preempted_by = holder_label
        elif phase is _PREEMPTED:
            preempted_by = model.preempted_by or ""
        if phase is _DRAINING:
            reason = reasons.DRAINING
            by = f" by {preempted_by}" if preempted_by else ""
            deadline = (draining_since or self.now) + model.drain_timeout
            message = (
                f"preempted{by}: draining its requests in flight until "
                f"{deadline.strftime('%H:%M:%S')} (queue position {position})"
            )
        elif self.under_lease:
            reason = reasons.GPU_LEASE_HELD
            message = self.lease_message
        elif phase is _PREEMPTED:
            reason = reasons.PREEMPTED
            by = f" by {preempted_by}" if preempted_by else ""
            message = f"preempted{by} (queue position {position})"
        else:
            reason = reasons.QUEUED
            message = f"queued for the GPU (queue position {position})"
        # Positional, in the field order of MemberDecision (name, state, queue_position,
        # preempted_by, phase, preempted_at, desired_replicas, active_services, reason,
        # message, conditions, events): built for every parked member at every decision.
        return MemberDecision(
            name,
            _QUEUED,
            position,
            preempted_by,
            phase,
            preempted_at,
            replicas,
            "",
            reason,
            message,
            _parked_conditions((reason, message, name, phase, self.evict_reason, model.failure)),
            events,
            draining_since=draining_since,
        )


@functools.lru_cache(maxsize=16384)
def _parked_conditions(
    facts: tuple[str, str, str, Phase, str, ServerFailure | None],
) -> tuple[Condition, Condition]:
    """A parked member's Active and Ready conditions, from its (reason, message, name,
    phase, eviction reason, server failure); cached: the same members are parked the same
    way at every reconcile, and conditions are immutable values."""
    reason, message, name, phase, evict_reason, failure = facts
    return (
        Condition(CONDITION_ACTIVE, False, reason, message),
        # Not serving because parked: Ready says why (Queued behind whom, or the lease),
        # so kubectl's REASON column never shows a bare Queued state. A preemption and a
        # failure keep their own reason.
        _preempted_condition(name, evict_reason)
        if phase is _PREEMPTED
        else _ready_condition(phase, name, failure)
        if phase is _FAILED
        else _not_ready_because(reason, message),
    )


_HOLDER_WAITS = frozenset({reasons.WAITING_FOR_GPU, reasons.CACHE_NOT_READY})


@functools.lru_cache(maxsize=16384)
def _not_ready_because(reason: str, message: str) -> Condition:
    return Condition(CONDITION_READY, False, reason, message)


@functools.lru_cache(maxsize=16384)
def _ready_condition(phase: Phase, name: str, failure: ServerFailure | None = None) -> Condition:
    # Cached: the same few (phase, member) pairs recur at every reconcile, and the
    # condition is an immutable value.
    if phase is _READY:
        return Condition(CONDITION_READY, True, "Ready", f"{name} is serving")
    if phase is _PREEMPTED:
        return _preempted_condition(name, reasons.PREEMPTED)
    if phase is _FAILED and failure is not None:
        reason = reasons.CRASH_LOOP_BACK_OFF if failure.restarts else phase.value
        return Condition(CONDITION_READY, False, reason, f"{name} is failing: {failure.describe()}")
    return Condition(CONDITION_READY, False, phase.value, f"{name} is {phase.value.lower()}")


@functools.lru_cache(maxsize=16384)
def _preempted_condition(name: str, reason: str) -> Condition:
    why = "a GPU lease" if reason == reasons.GPU_LEASE_HELD else "another model"
    return Condition(CONDITION_READY, False, reason, f"{name} gave the GPU to {why}")


def _with_failure(member: MemberDecision, failure: ServerFailure) -> MemberDecision:
    """A Failed member's decision whose message (and Active condition) also says why its
    server fails, as its Ready condition does."""
    return _with_note(member, f"{member.name} is failing: {failure.describe()}")


def _with_note(member: MemberDecision, note: str) -> MemberDecision:
    """The member's decision with `note` added to its message and its Active condition."""
    message = f"{member.message}; {note}"
    return attrs.evolve(
        member,
        message=message,
        conditions=tuple(
            attrs.evolve(c, message=message) if c.type == CONDITION_ACTIVE else c
            for c in member.conditions
        ),
    )


def _idle_timeout_crossings(ballot: Ballot, after: datetime | None) -> list[Instant]:
    # The leader scales to minReplicas once idle strictly longer than its idle timeout;
    # a loading one once its last demand is older than max(idle, coldStartTimeout).
    activity = ballot.activity
    longest = max(
        [max(m.serverless.idle_timeout, m.serverless.cold_start_timeout) for _, m in activity],
        default=_TICK,
    )
    out = []
    for last, m in ballot.active_since(after, longest):
        ends = [last + m.serverless.idle_timeout]
        if m.phase is _LOADING and m.serverless.cold_start_timeout > m.serverless.idle_timeout:
            ends.append(last + m.serverless.cold_start_timeout)
        for end in ends:
            if after is None or end >= after:  # end + a tick > after
                out.append((end + _TICK, _IDLE_TIMEOUT, m.name))
    return out


def _idle_timeout_says(ballot: Ballot, crossing: Crossing) -> str | None:
    model = ballot.member(crossing.subject)
    if crossing.kind is not _IDLE_TIMEOUT or model is None:
        return None
    serverless = model.serverless
    idle = format_duration(serverless.idle_timeout)
    last = model.last_active
    cold_end = last is not None and crossing.at == last + serverless.cold_start_timeout + _TICK
    idle_end = last is not None and crossing.at == last + serverless.idle_timeout + _TICK
    if cold_end and not idle_end:
        cold = format_duration(serverless.cold_start_timeout)
        return f"{crossing.subject}'s load is no longer asked for ({cold} cold start timeout)"
    return f"{crossing.subject}'s {idle} idle timeout ends"


def _never_decides(ballot: Ballot) -> Callable[[], str]:
    return lambda: "sizes the holder, never elects"


# Not a rule of the election: what the leader's desired replicas read (docs/election.md
# 1.3). Its crossings belong to the same timer.
REPLICAS: Final = Rule(
    "desired replicas",
    _never_decides,
    crossings=_idle_timeout_crossings,
    says=_idle_timeout_says,
)

# The stages after the election whose thresholds the timer reads too: the leader's
# replicas, and the drain of a member that lost the card (docs/election.md 1.6).
STAGES: Final = (REPLICAS, DRAIN)


def next_change_at(
    models: Iterable[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    policy: Policy = DEFAULT_POLICY,
) -> datetime | None:
    """The earliest instant after `now` at which the decision could change unaided.

    Every threshold the decision reads is listed by the rule that reads it
    (`flexinfer_core.election.crossings`, plus the leader's idle timeout): demand and
    recent windows, the start of idleness (one tick past the demand window), the
    loading grace and idle timeout (both inclusive, so they lapse one tick later), the
    cooldown and lease expiry. The decision is constant between consecutive
    thresholds, so nothing changes before the earliest future one. Unreadable lease
    sources add no threshold: only the leases that were read can expire.
    """
    return _next_change(_timer_ballot(models, now=now, leases=leases, policy=policy))


def _next_change(ballot: Ballot) -> datetime | None:
    return next_instant(ballot, after=ballot.now, extra=STAGES)


def thresholds(
    models: Iterable[ModelState],
    *,
    now: datetime,
    leases: Iterable[GpuLease] = (),
    policy: Policy = DEFAULT_POLICY,
) -> list[Crossing]:
    """Every instant the decision reads a boundary at, with what crosses it and whose
    (a member's or a lease's name); past ones included, unordered. The same list as
    `next_change_at` reads, labelled (for `flexinfer explain`)."""
    ballot = _timer_ballot(models, now=now, leases=leases, policy=policy)
    return crossings(ballot, extra=STAGES)


def describe_threshold(
    models: Iterable[ModelState],
    crossing: Crossing,
    *,
    now: datetime,
    policy: Policy = DEFAULT_POLICY,
) -> str | None:
    """What `crossing` means, in the words of the rule that reads it (None: nothing
    worth saying, e.g. a load grace of a member that is not loading)."""
    ballot = _timer_ballot(models, now=now, leases=(), policy=policy)
    return describe_crossing(ballot, crossing, extra=STAGES)


def _timer_ballot(
    models: Iterable[ModelState], *, now: datetime, leases: Iterable[GpuLease], policy: Policy
) -> Ballot:
    # The timer reads a group as given (no membership check), as it always has.
    return Ballot.of(list(models), now=now, leases=leases, policy=policy, check=False)


def apply_decision(models: Iterable[ModelState], decision: GroupDecision) -> tuple[ModelState, ...]:
    """The models as they would be observed once the decision is written (status, replicas,
    annotation)."""
    out = []
    for model in models:
        target = decision.member(model.name)
        packed = decision.packed_status(model.name) if decision.packed else None
        out.append(
            attrs.evolve(
                model,
                recorded_packed=packed.condition if packed is not None else model.recorded_packed,
                recorded_vram=packed.vram if packed is not None else model.recorded_vram,
                shared_state=target.state,
                queue_position=target.queue_position,
                preempted_by=target.preempted_by,
                phase=target.phase,
                preempted_at=target.preempted_at,
                draining_since=target.draining_since,
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
