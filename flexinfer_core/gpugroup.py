"""The v1alpha1 GPUGroup decision: keep, swap, drain or idle, with the blocking reason.

Rules: docs/election.md section 3. Demand is real queued requests, reported by the
proxy per member (queue depth, the arrival of the oldest waiting request and when
it reported); a report older than `DEMAND_STALE_AFTER` counts as no demand, and
`next_change_at` includes the instant the next live report goes stale. The
decision is level-based: a swap is recorded at once (`activeModel`,
`lastSwapTime`, `swapCount`), and every later decision derives the drain from
that record plus which members still have pods, so deciding again after applying
changes nothing. The decision that records a swap also carries its Events (`Swap`
or `Start` on the GPUGroup, `Preempted` on the member it displaces), to be recorded
once its status is written.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final

import attrs

from flexinfer_core import reasons
from flexinfer_core.annotations import DEMAND_STALE_AFTER, demand_is_stale
from flexinfer_core.durations import format_duration
from flexinfer_core.election import RuleCheck
from flexinfer_core.group import Event
from flexinfer_core.snapshot import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    Policy,
    aware_or_none,
    int_between,
    non_empty_name,
    non_negative_duration,
    positive_bytes_or_none,
)
from flexinfer_core.timestamps import far_ahead, future_note, not_after


class PreemptionPolicy(enum.StrEnum):
    GRACEFUL = "Graceful"
    IMMEDIATE = "Immediate"


class GpuGroupPhase(enum.StrEnum):
    PENDING = "Pending"
    IDLE = "Idle"
    ACTIVE = "Active"
    DRAINING = "Draining"
    SWAPPING = "Swapping"
    FAILED = "Failed"


class MemberState(enum.StrEnum):
    ACTIVE = "Active"
    QUEUED = "Queued"
    PREEMPTED = "Preempted"
    IDLE = "Idle"


class GpuGroupAction(enum.StrEnum):
    KEEP = "Keep"
    SWAP = "Swap"
    DRAIN = "Drain"
    IDLE = "Idle"


@attrs.frozen
class AntiThrashing:
    enabled: bool = True
    hysteresis_window: timedelta = attrs.field(
        default=timedelta(seconds=10), validator=non_negative_duration
    )
    request_queue_threshold: int = attrs.field(default=3, validator=int_between(1, 100))
    minimum_run_duration: timedelta = attrs.field(
        default=timedelta(seconds=30), validator=non_negative_duration
    )
    cooldown_after_preemption: timedelta = attrs.field(
        default=timedelta(seconds=60), validator=non_negative_duration
    )


@attrs.frozen
class GpuGroupMember:
    """One member ModelDeployment of a GPUGroup, with the proxy's demand report.

    `queued`/`oldest_waiting` are the report as written; `reported_at` is when. A
    stale report is read as no demand by the decision, not here, so that the
    decision can also say when a live report will go stale.
    """

    name: str = attrs.field(validator=non_empty_name)
    priority: int = attrs.field(
        default=DEFAULT_PRIORITY, validator=int_between(MIN_PRIORITY, MAX_PRIORITY)
    )
    queued: int = attrs.field(default=0, validator=int_between(0, None))
    oldest_waiting: datetime | None = attrs.field(default=None, validator=aware_or_none)
    reported_at: datetime | None = attrs.field(default=None, validator=aware_or_none)
    last_request: datetime | None = attrs.field(default=None, validator=aware_or_none)
    idle_timeout: timedelta = attrs.field(
        default=Policy.IDLE_TIMEOUT, validator=non_negative_duration
    )
    preempted_at: datetime | None = attrs.field(default=None, validator=aware_or_none)
    preempted_by: str = ""
    exists: bool = True
    # The membership reason when this ModelDeployment may not run in this group (it
    # is listed by another group too, or its gpuGroupRef names another): it is left
    # out of the decision, but its pods still hold the card.
    conflict: str = ""
    # False while the ModelCache it mounts is not complete: it may not run yet.
    cache_ready: bool = True
    has_pods: bool = False
    ready: bool = False
    # The report's `inFlight`: requests its server is answering (docs/election.md 1.6);
    # 0 once the report is stale, as its queue.
    in_flight: int = attrs.field(default=0, validator=int_between(0, None), kw_only=True)
    # `spec.models[].vramEstimate` in bytes (None: unknown); shown in status, and read
    # only by the packing of `flexinfer_core.gpugroup_packing` (docs/election.md 3).
    vram_estimate: int | None = attrs.field(
        default=None, validator=positive_bytes_or_none, kw_only=True
    )
    # Its recorded `modelStatuses[].state` is Active: it holds a seat on the card (the
    # active model, or a member packed beside it). Read only by the packing.
    seated: bool = attrs.field(default=False, kw_only=True)

    @property
    def eligible(self) -> bool:
        return self.exists and not self.conflict and self.cache_ready


_TICK = timedelta(microseconds=1)


def _why_not(member: GpuGroupMember) -> str:
    if member.conflict:
        return member.conflict
    if not member.exists:
        return "missing"
    return "its ModelCache is not ready" if not member.cache_ready else "eligible"


def _members(value: Iterable[GpuGroupMember]) -> tuple[GpuGroupMember, ...]:
    return tuple(value)


@attrs.frozen
class GpuGroupState:
    """A GPUGroup as observed: spec, recorded status and its members."""

    name: str = attrs.field(validator=non_empty_name)
    namespace: str = "default"
    members: tuple[GpuGroupMember, ...] = attrs.field(default=(), converter=_members)
    current_model: str | None = None
    last_swap_time: datetime | None = attrs.field(default=None, validator=aware_or_none)
    last_swap_reason: str = ""
    swap_count: int = attrs.field(default=0, validator=int_between(0, None))
    preemption_policy: PreemptionPolicy = attrs.field(
        default=PreemptionPolicy.GRACEFUL, converter=PreemptionPolicy
    )
    drain_timeout: timedelta = attrs.field(
        default=timedelta(seconds=60), validator=non_negative_duration
    )
    anti_thrashing: AntiThrashing = AntiThrashing()
    # `spec.vramBudget` in bytes (None: not set); shown in status with the holder's
    # footprint, never read by the decision (docs/election.md 1.7).
    vram_budget: int | None = attrs.field(default=None, validator=positive_bytes_or_none)

    def member(self, name: str) -> GpuGroupMember | None:
        return next((m for m in self.members if m.name == name), None)


@attrs.frozen
class GpuGroupMemberStatus:
    """One row of `status.modelStatuses`."""

    name: str
    state: MemberState
    queued_requests: int
    queued_since: datetime | None
    preempted_at: datetime | None
    preempted_by: str


@attrs.frozen
class GpuGroupDecision:
    action: GpuGroupAction
    active_model: str | None
    reason: str
    message: str
    blocked_by: str | None
    desired_replicas: tuple[tuple[str, int], ...]
    phase: GpuGroupPhase
    last_swap_time: datetime | None
    last_swap_reason: str
    swap_count: int
    member_statuses: tuple[GpuGroupMemberStatus, ...]
    next_change_at: datetime | None
    # Recorded once the status is written: on the GPUGroup itself (`model` names the
    # group), and on member ModelDeployments.
    group_events: tuple[Event, ...] = ()
    member_events: tuple[Event, ...] = ()
    # Members whose ModelDeployment's `lastAccessTime` lay far in the future: to be
    # written back as `now` (the member statuses are the adapter's to write).
    rewrite_last_access_time: tuple[str, ...] = ()

    def replicas_for(self, name: str) -> int:
        return dict(self.desired_replicas)[name]


def member_order(member: GpuGroupMember) -> tuple[int, int, float, str]:
    """Queued first, then priority desc, then oldest waiting request first, then name."""
    waiting = member.oldest_waiting.timestamp() if member.oldest_waiting else float("inf")
    return (0 if member.queued > 0 else 1, -member.priority, waiting, member.name)


def _last_activity(state: GpuGroupState, current: GpuGroupMember) -> datetime | None:
    # Becoming active counts as activity: a model just swapped in is not idle yet.
    times = [t for t in (current.last_request, state.last_swap_time) if t is not None]
    return max(times, default=None)


def _is_in_use(state: GpuGroupState, current: GpuGroupMember, *, now: datetime) -> bool:
    if current.queued > 0:
        return True
    last = _last_activity(state, current)
    return last is not None and now - last < current.idle_timeout


def _gates(
    state: GpuGroupState, current: GpuGroupMember, *, winner: GpuGroupMember, now: datetime
) -> list[tuple[str, bool, str]]:
    """Each anti-thrashing rule (steps 3–4) in order: (reason, blocks the swap, why)."""
    anti = state.anti_thrashing
    if not anti.enabled:
        off = "anti-thrashing is disabled"
        return [(reason, False, off) for reason in _GATE_REASONS]
    gates = []
    below = winner.queued < anti.request_queue_threshold
    gates.append(
        (
            reasons.QUEUE_BELOW_THRESHOLD,
            below,
            f"{winner.name} has {winner.queued} queued request(s), "
            f"{'below' if below else 'at least'} the threshold of {anti.request_queue_threshold}",
        )
    )
    hysteresis = anti.hysteresis_window
    waited = None if winner.oldest_waiting is None else now - winner.oldest_waiting
    young = hysteresis > timedelta(0) and waited is not None and waited < hysteresis
    gates.append(
        (
            reasons.HYSTERESIS,
            young,
            "the hysteresis window is 0s (disabled)"
            if hysteresis <= timedelta(0)
            else f"{winner.name}'s oldest request has waited "
            f"{'less than' if young else 'at least'} the {format_duration(hysteresis)} "
            "hysteresis window",
        )
    )
    ran = None if state.last_swap_time is None else now - state.last_swap_time
    short = ran is not None and ran < anti.minimum_run_duration
    gates.append(
        (
            reasons.MINIMUM_RUN,
            short,
            f"{current.name} has run {'less than' if short else 'at least'} the minimum "
            f"{format_duration(anti.minimum_run_duration)} since the last swap"
            if ran is not None
            else "no swap recorded yet",
        )
    )
    cooling = (
        winner.preempted_at is not None
        and now - winner.preempted_at < anti.cooldown_after_preemption
    )
    gates.append(
        (
            reasons.COOLDOWN_AFTER_PREEMPTION,
            cooling,
            f"{winner.name} was preempted less than "
            f"{format_duration(anti.cooldown_after_preemption)} ago"
            if cooling
            else f"{winner.name} was not preempted in the last "
            f"{format_duration(anti.cooldown_after_preemption)}",
        )
    )
    return gates


_GATE_REASONS = (
    reasons.QUEUE_BELOW_THRESHOLD,
    reasons.HYSTERESIS,
    reasons.MINIMUM_RUN,
    reasons.COOLDOWN_AFTER_PREEMPTION,
)

# The steps of docs/election.md section 3, numbered for `flexinfer explain`.
GPU_GROUP_RULES: Final = (
    (1, "members exist"),
    (2, "queued demand"),
    (3, "winner holds"),
    (4, "no holder"),
    (5, "holder idle"),
    (6, "queue threshold"),
    (7, "hysteresis"),
    (8, "minimum run"),
    (9, "cooldown after preemption"),
    (10, "swap"),
    (11, "drain"),
)
_GPU_GROUP_RULE_NAMES: Final = dict(GPU_GROUP_RULES)


def _blocking_gate(
    state: GpuGroupState, current: GpuGroupMember, *, winner: GpuGroupMember, now: datetime
) -> tuple[str, str] | None:
    """The anti-thrashing rule that keeps `current` against `winner`, if any (steps 3–4)."""
    return next(
        ((r, why) for r, blocks, why in _gates(state, current, winner=winner, now=now) if blocks),
        None,
    )


@attrs.frozen
class GpuGroupTrace:
    """The GPUGroup decision and each step's outcome, in spec order (all eleven)."""

    decision: GpuGroupDecision
    rules: tuple[RuleCheck, ...]


def explain_gpu_group(state: GpuGroupState, *, now: datetime) -> GpuGroupTrace:
    """`decide_gpu_group`, plus each step's outcome in order (for `flexinfer explain`)."""
    notes: list[RuleCheck] = []
    decision = _decide(state, now=now, notes=notes)
    decided = next(rule.number for rule in notes if rule.applied)
    rules = [
        *notes,
        *(
            RuleCheck(number, name, False, f"not reached: step {decided} decided")
            for number, name in GPU_GROUP_RULES
            if decided < number < 11
        ),
    ]
    if decision.phase is GpuGroupPhase.DRAINING:
        rules.append(_gpu_note(11, True, _drain_says(state, decision)))
    elif decision.active_model is None:
        rules.append(_gpu_note(11, False, "no member is to hold the GPU"))
    elif state.preemption_policy is PreemptionPolicy.IMMEDIATE:
        rules.append(_gpu_note(11, False, "preemption is Immediate: the holder does not wait"))
    else:
        rules.append(_gpu_note(11, False, "no other member's pods are in the way"))
    return GpuGroupTrace(decision, tuple(rules))


def _drain_says(state: GpuGroupState, decision: GpuGroupDecision) -> str:
    """Step 11 while the holder waits: who drains, how much is in flight, and the
    deadline (the drain timeout after the swap), as the shared groups' drain says it."""
    swapped = decision.last_swap_time
    if swapped is None:  # no drain without a recorded swap (see `_finish`)
        return decision.message
    deadline = (swapped + state.drain_timeout).isoformat()
    timeout = format_duration(state.drain_timeout)
    # The members the decision keeps up beside a holder that is not them: the drainers.
    drainers = [
        (name, member.in_flight)
        for name, replicas in decision.desired_replicas
        if replicas > 0
        and name != decision.active_model
        and (member := state.member(name)) is not None
    ]
    if drainers:
        return "; ".join(
            f"{name} drains its requests in flight before it is scaled to 0 ({count} in "
            f"flight, deadline {deadline}: the {timeout} drain timeout after the swap)"
            for name, count in drainers
        )
    return (
        f"{decision.message}, at the latest until {deadline} "
        f"(the {timeout} drain timeout after the swap)"
    )


def record_gpu_group_decision(state: GpuGroupState, decision: GpuGroupDecision) -> GpuGroupState:
    """The GPUGroup as observed once the controller has written the decision's status."""
    rows = {s.name: s for s in decision.member_statuses}
    return attrs.evolve(
        state,
        current_model=decision.active_model,
        last_swap_time=decision.last_swap_time,
        last_swap_reason=decision.last_swap_reason,
        swap_count=decision.swap_count,
        members=tuple(
            attrs.evolve(
                m, preempted_at=rows[m.name].preempted_at, preempted_by=rows[m.name].preempted_by
            )
            for m in state.members
        ),
    )


def _gpu_note(number: int, applied: bool, why: str) -> RuleCheck:
    return RuleCheck(number, _GPU_GROUP_RULE_NAMES[number], applied, why)


def _without_stale_demand(state: GpuGroupState, *, now: datetime) -> GpuGroupState:
    """The state with every stale demand report read as no demand."""
    if not any(
        (m.queued or m.in_flight) and demand_is_stale(m.reported_at, now=now) for m in state.members
    ):
        return state
    return attrs.evolve(
        state,
        members=tuple(
            attrs.evolve(m, queued=0, oldest_waiting=None, in_flight=0)
            if (m.queued or m.in_flight) and demand_is_stale(m.reported_at, now=now)
            else m
            for m in state.members
        ),
    )


def decide_gpu_group(state: GpuGroupState, *, now: datetime) -> GpuGroupDecision:
    """Decide which member holds the group's GPU (docs/election.md 3).

    Recorded instants after `now` (a member's `lastAccessTime` or `preemptedAt`, the
    `lastSwapTime`) are read as `now`: read as recorded, one from the year 9999 would
    keep a model in use, a cooldown or a minimum run going, until then. Beyond
    `FUTURE_TOLERANCE` the decision's message and a Warning say so; the status the
    decision describes writes the group's own instants back, and
    `rewrite_last_access_time` names the members whose `lastAccessTime` to rewrite.
    """
    return _decide(state, now=now)


def _decide(
    state: GpuGroupState, *, now: datetime, notes: list[RuleCheck] | None = None
) -> GpuGroupDecision:
    clamped, future, rewrite = _instants_not_after(state, now=now)
    decision = _decide_read_as_now(clamped, now=now, notes=notes)
    if not future:
        return decision
    said = "; ".join(future)
    return attrs.evolve(
        decision,
        message=f"{decision.message}; {said}",
        group_events=(
            *decision.group_events,
            Event(state.name, reasons.TIMESTAMP_IN_FUTURE, said, type="Warning"),
        ),
        rewrite_last_access_time=rewrite,
    )


def _instants_not_after(
    state: GpuGroupState, *, now: datetime
) -> tuple[GpuGroupState, list[str], tuple[str, ...]]:
    """`state` with every recorded instant after `now` read as `now`; the notes for those
    far ahead, and the members whose `lastAccessTime` was."""
    notes: list[str] = []
    rewrite: list[str] = []
    if far_ahead(state.last_swap_time, now) and state.last_swap_time is not None:
        notes.append(future_note("status.lastSwapTime", state.last_swap_time))
    members = []
    for m in state.members:
        if far_ahead(m.last_request, now) and m.last_request is not None:
            notes.append(future_note(f"{m.name}'s status.lastAccessTime", m.last_request))
            rewrite.append(m.name)
        if far_ahead(m.preempted_at, now) and m.preempted_at is not None:
            notes.append(future_note(f"{m.name}'s preemptedAt", m.preempted_at))
        # The proxy's queue report, which the controller does not rewrite: an
        # `oldestWaiting` far ahead, read as now at every decision, would keep the
        # hysteresis from ever being met (the member could never swap in), so how
        # long its requests waited reads as unknown; a `reportedAt` far ahead keeps
        # the report from going stale until then, which only a Warning can tell.
        key = f"the annotation demand.ai.flexinfer/{m.name}"
        oldest_waiting = not_after(m.oldest_waiting, now)
        if far_ahead(m.oldest_waiting, now) and m.oldest_waiting is not None:
            notes.append(
                f"{key}'s oldestWaiting {m.oldest_waiting.isoformat()} is in the future "
                "and is read as unknown"
            )
            oldest_waiting = None
        if far_ahead(m.reported_at, now) and m.reported_at is not None:
            notes.append(future_note(f"{key}'s reportedAt", m.reported_at))
        members.append(
            attrs.evolve(
                m,
                last_request=not_after(m.last_request, now),
                preempted_at=not_after(m.preempted_at, now),
                oldest_waiting=oldest_waiting,
                reported_at=not_after(m.reported_at, now),
            )
        )
    clamped = attrs.evolve(
        state, members=tuple(members), last_swap_time=not_after(state.last_swap_time, now)
    )
    return clamped, notes, tuple(rewrite)


def _decide_read_as_now(
    state: GpuGroupState, *, now: datetime, notes: list[RuleCheck] | None = None
) -> GpuGroupDecision:
    # Each step either decides or, when notes are asked for, says why not.
    def note(number: int, applied: bool, why: str) -> None:
        if notes is not None:
            notes.append(_gpu_note(number, applied, why))

    state = _without_stale_demand(state, now=now)
    existing = sorted((m for m in state.members if m.eligible), key=member_order)
    current = state.member(state.current_model) if state.current_model else None
    if current is not None and not current.eligible:
        current = None
    queued = [m for m in existing if m.queued > 0]

    if not existing:
        message = _no_member_can_run(state)
        note(1, True, message)
        return _finish(
            state,
            now=now,
            target=None,
            action=GpuGroupAction.IDLE,
            reason=reasons.NO_DEMAND,
            message=message,
            failed=True,
        )
    note(1, False, f"{len(existing)} member ModelDeployment(s) can run")
    if not queued:
        if current is not None and _is_in_use(state, current, now=now):
            message = (
                f"{current.name} keeps the GPU: its last request is younger than its "
                f"{format_duration(current.idle_timeout)} idle timeout"
            )
            note(2, True, f"no queued requests; {message}")
            return _finish(
                state,
                now=now,
                target=current,
                action=GpuGroupAction.KEEP,
                reason=reasons.KEEP_CURRENT,
                message=message,
            )
        if current is not None:
            message = (
                f"{current.name} idle for longer than "
                f"{format_duration(current.idle_timeout)}; scaling the group to zero"
            )
            note(2, True, f"no queued requests; {message}")
            return _finish(
                state,
                now=now,
                target=None,
                action=GpuGroupAction.IDLE,
                reason=reasons.IDLE_TIMEOUT,
                message=message,
            )
        message = "no queued requests; no model holds the GPU"
        note(2, True, message)
        return _finish(
            state,
            now=now,
            target=None,
            action=GpuGroupAction.IDLE,
            reason=reasons.NO_DEMAND,
            message=message,
        )
    if notes is not None:
        waiting = ", ".join(f"{m.name} ({m.queued}, priority {m.priority})" for m in queued)
        note(2, False, f"queued, in order: {waiting}")

    winner = queued[0]
    if current is not None and winner.name == current.name:
        message = f"{current.name} serves its own queue"
        note(3, True, message)
        return _finish(
            state,
            now=now,
            target=current,
            action=GpuGroupAction.KEEP,
            reason=reasons.KEEP_CURRENT,
            message=message,
        )
    if current is None:
        note(3, False, f"the first in the queue, {winner.name}, does not hold the GPU")
        message = f"starting {winner.name} for {winner.queued} queued request(s)"
        note(4, True, message)
        return _finish(
            state,
            now=now,
            target=winner,
            action=GpuGroupAction.SWAP,
            reason=reasons.START,
            message=message,
        )
    note(3, False, f"{winner.name} is first in the queue; {current.name} holds the GPU")
    note(4, False, f"{current.name} holds the GPU")
    if not _is_in_use(state, current, now=now):
        message = (
            f"swapping {current.name} (idle) for {winner.name} ({winner.queued} queued request(s))"
        )
        note(5, True, message)
        return _finish(
            state,
            now=now,
            target=winner,
            action=GpuGroupAction.SWAP,
            reason=reasons.SWAP,
            message=message,
        )
    note(5, False, f"{current.name} is in use (requests within its idle timeout, or queued)")
    gates = _gates(state, current, winner=winner, now=now)
    for number, (blocked, blocks, why) in zip(range(6, 10), gates, strict=True):
        if blocks:
            message = f"{current.name} keeps the GPU: {why}"
            note(number, True, message)
            return _finish(
                state,
                now=now,
                target=current,
                action=GpuGroupAction.KEEP,
                reason=blocked,
                message=message,
                blocked=blocked,
            )
        note(number, False, why)
    message = (
        f"swapping {current.name} for {winner.name} ({winner.queued} queued "
        f"request(s), priority {winner.priority})"
    )
    note(10, True, message)
    return _finish(
        state,
        now=now,
        target=winner,
        action=GpuGroupAction.SWAP,
        reason=reasons.SWAP,
        message=message,
    )


def _no_member_can_run(state: GpuGroupState) -> str:
    if all(not m.exists for m in state.members):
        missing = ", ".join(m.name for m in state.members) or "none listed"
        return f"no member ModelDeployment exists ({missing})"
    why = ", ".join(f"{m.name}: {_why_not(m)}" for m in state.members)
    return f"no member ModelDeployment can run ({why})"


def _finish(
    state: GpuGroupState,
    *,
    now: datetime,
    target: GpuGroupMember | None,
    action: GpuGroupAction,
    reason: str,
    message: str,
    blocked: str | None = None,
    failed: bool = False,
) -> GpuGroupDecision:
    """The full decision once the holder (`target`) and the rule that chose it are known."""
    swapping = action is GpuGroupAction.SWAP
    last_swap_time = now if swapping else state.last_swap_time
    last_swap_reason = message if swapping else state.last_swap_reason
    swap_count = state.swap_count + 1 if swapping else state.swap_count
    previous = state.current_model if swapping else None

    # Break-before-make: the holder waits for every other member's pods to be gone
    # (Graceful: at most the drain timeout after the swap; Immediate: not at all).
    draining = False
    waiting_for = ""
    if target is not None and not target.has_pods:
        occupied = [m.name for m in state.members if m.name != target.name and m.has_pods]
        waiting_for = ", ".join(sorted(occupied))
        if occupied and state.preemption_policy is PreemptionPolicy.GRACEFUL:
            # Without a recorded swap (status written by hand or by an older
            # version) there is no drain start; waiting from `now` on every
            # reconcile would never end, so the drain counts as timed out.
            draining = last_swap_time is not None and now < last_swap_time + state.drain_timeout
    # docs/election.md 1.6: while the drain runs, a member that was serving and still
    # answers requests keeps its pod until they are answered (its report says 0 or goes
    # stale) or the drain timeout after the swap has passed.
    drainers = (
        [
            m
            for m in state.members
            if target is not None
            and m.name != target.name
            and m.has_pods
            and m.ready
            and m.in_flight > 0
        ]
        if draining
        else []
    )
    if draining and not swapping:
        action = GpuGroupAction.DRAIN
        reason = reasons.DRAINING
        message = f"waiting for the pods of {waiting_for} to be gone before starting the holder"
    if drainers and not swapping and last_swap_time is not None:
        until = (last_swap_time + state.drain_timeout).strftime("%H:%M:%S")
        message = "waiting for " + ", ".join(
            f"{m.name} to drain ({m.in_flight} in flight, until {until})" for m in drainers
        )
    draining_names = {m.name for m in drainers}

    desired = tuple(
        (
            m.name,
            1
            if (target is not None and m.name == target.name and not draining)
            or m.name in draining_names
            else 0,
        )
        for m in sorted(state.members, key=lambda m: m.name)
    )

    statuses = []
    for m in sorted(state.members, key=lambda m: m.name):
        preempted_at, preempted_by = m.preempted_at, m.preempted_by
        if previous is not None and m.name == previous and target is not None:
            preempted_at, preempted_by = now, target.name
        if target is not None and m.name == target.name:
            preempted_at, preempted_by = None, ""
            member_state = MemberState.ACTIVE
        elif m.queued > 0:
            member_state = MemberState.QUEUED
        elif preempted_at is not None:
            member_state = MemberState.PREEMPTED
        else:
            member_state = MemberState.IDLE
        statuses.append(
            GpuGroupMemberStatus(
                name=m.name,
                state=member_state,
                queued_requests=m.queued,
                queued_since=m.oldest_waiting,
                preempted_at=preempted_at,
                preempted_by=preempted_by,
            )
        )

    if failed:
        phase = GpuGroupPhase.FAILED
    elif target is None:
        phase = GpuGroupPhase.IDLE
    elif draining:
        phase = GpuGroupPhase.DRAINING
    elif not target.ready:
        phase = GpuGroupPhase.SWAPPING
    else:
        phase = GpuGroupPhase.ACTIVE

    group_events: tuple[Event, ...] = ()
    member_events: tuple[Event, ...] = ()
    if swapping and target is not None:
        group_events = (Event(state.name, reason, message),)
        if previous and previous != target.name:
            member_events = (
                Event(
                    previous,
                    reasons.PREEMPTED,
                    f"{previous} was preempted by {target.name}: {message}",
                    type="Warning",
                ),
            )

    return GpuGroupDecision(
        action=action,
        active_model=target.name if target is not None else None,
        reason=reason,
        message=message,
        blocked_by=blocked,
        desired_replicas=desired,
        phase=phase,
        last_swap_time=last_swap_time,
        last_swap_reason=last_swap_reason,
        swap_count=swap_count,
        member_statuses=tuple(statuses),
        next_change_at=_gpu_group_next_change(
            state, now=now, last_swap_time=last_swap_time, statuses=statuses
        ),
        group_events=group_events,
        member_events=member_events,
    )


def _gpu_group_next_change(
    state: GpuGroupState,
    *,
    now: datetime,
    last_swap_time: datetime | None,
    statuses: list[GpuGroupMemberStatus],
) -> datetime | None:
    anti = state.anti_thrashing
    candidates: list[datetime] = []
    for m in state.members:
        for t in (m.last_request, last_swap_time):
            if t is not None:
                candidates.append(t + m.idle_timeout)
        if m.oldest_waiting is not None:
            candidates.append(m.oldest_waiting + anti.hysteresis_window)
        if (m.queued or m.in_flight) and m.reported_at is not None:
            # The report goes stale one tick after it is DEMAND_STALE_AFTER old.
            candidates.append(m.reported_at + DEMAND_STALE_AFTER + _TICK)
    for s in statuses:
        if s.preempted_at is not None:
            candidates.append(s.preempted_at + anti.cooldown_after_preemption)
    if last_swap_time is not None:
        candidates += [
            last_swap_time + anti.minimum_run_duration,
            last_swap_time + state.drain_timeout,
        ]
    return min((c for c in candidates if c > now), default=None)
