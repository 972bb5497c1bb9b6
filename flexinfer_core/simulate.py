"""A discrete-event simulator of one shared group, driven only by the core.

Simulated time is still just `now`: the simulator jumps from one instant to the
next (a request, a pod becoming ready or gone, a lease starting or ending, or the
decision's own `next_change_at`), decides, and applies the decision to a model of
the cluster in which pods take `load_time` to become ready and
`termination_time` to go away. It is what `flexinfer simulate` prints and what the
docs' scenarios are checked against. No clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import attrs

from flexinfer_core.errors import InvalidFieldError
from flexinfer_core.group import Event, GroupDecision, apply_decision, decide_group
from flexinfer_core.phases import observed_phase
from flexinfer_core.snapshot import (
    DEFAULT_POLICY,
    GpuLease,
    ModelState,
    Policy,
    aware_or_none,
)


@attrs.frozen
class Request:
    """A request for `model` at `at` (the proxy's demand signal)."""

    at: datetime = attrs.field(validator=aware_or_none)
    model: str


@attrs.frozen
class LeaseWindow:
    """A lease that exists from `start` until it is deleted at `end` (None: never)."""

    lease: GpuLease
    start: datetime = attrs.field(validator=aware_or_none)
    end: datetime | None = attrs.field(default=None, validator=aware_or_none)


@attrs.frozen
class Pod:
    created: datetime
    ready_at: datetime
    gone_at: datetime | None = None


@attrs.frozen
class Step:
    """One instant at which something visible changed."""

    at: datetime
    leader: str | None
    reason: str
    message: str
    events: tuple[Event, ...]
    pods: tuple[tuple[str, int, int], ...]  # (model, pods, ready pods)


@attrs.frozen
class Timeline:
    steps: tuple[Step, ...]
    swaps: int
    max_members_with_pods: int


def simulate(
    models: Sequence[ModelState],
    *,
    start: datetime,
    until: datetime,
    requests: Iterable[Request] = (),
    leases: Iterable[LeaseWindow] = (),
    load_time: timedelta = timedelta(seconds=30),
    termination_time: timedelta = timedelta(seconds=5),
    policy: Policy = DEFAULT_POLICY,
    max_steps: int = 100_000,
) -> Timeline:
    """Run the group from `start` to `until` and return what happened."""
    _check_duration("load_time", load_time)
    _check_duration("termination_time", termination_time)
    names = {m.name for m in models}
    pending = sorted(requests, key=lambda r: (r.at, r.model))
    for request in pending:
        if request.model not in names:
            raise InvalidFieldError("requests.model", request.model, "is not a member")
    windows = tuple(leases)
    state = list(models)
    pods: dict[str, list[Pod]] = {m.name: [] for m in models}
    steps: list[Step] = []
    swaps = 0
    widest = 0
    now = start
    last_leader: str | None = None
    for _ in range(max_steps):
        while pending and pending[0].at <= now:
            request = pending.pop(0)
            state = [
                attrs.evolve(m, last_active=request.at) if m.name == request.model else m
                for m in state
            ]
        for name in pods:
            pods[name] = [p for p in pods[name] if p.gone_at is None or p.gone_at > now]
        state = [_observe(m, pods[m.name], now=now) for m in state]
        active_leases = [
            w.lease for w in windows if w.start <= now and (w.end is None or now < w.end)
        ]
        running = {name for name, ps in pods.items() if ps}
        decision = decide_group(
            state, now=now, leases=active_leases, running=running, policy=policy
        )
        state = list(apply_decision(state, decision))
        for target in decision.members:
            _scale(
                pods[target.name],
                target.desired_replicas,
                now=now,
                load=load_time,
                termination=termination_time,
            )
        widest = max(widest, sum(1 for ps in pods.values() if ps))
        if (
            decision.leader != last_leader
            and decision.leader is not None
            and (last_leader is not None)
        ):
            swaps += 1
        step = _step(now, decision, pods=pods)
        if (
            not steps
            or step.events
            or (step.leader, step.pods)
            != (
                steps[-1].leader,
                steps[-1].pods,
            )
        ):
            steps.append(step)
        last_leader = decision.leader
        following = _next_instant(
            now, pending, pods=pods, windows=windows, next_change=decision.next_change_at
        )
        if following is None or following > until:
            break
        now = following
    return Timeline(tuple(steps), swaps, widest)


def _check_duration(name: str, value: timedelta) -> None:
    if value < timedelta(0):
        raise InvalidFieldError(name, value, "is negative; durations must be zero or more")


def _observe(model: ModelState, pods: list[Pod], *, now: datetime) -> ModelState:
    replicas = model.replicas or 0
    live = [p for p in pods if p.gone_at is None]
    ready = sum(1 for p in live if p.ready_at <= now)
    phase = observed_phase(model.phase, replicas=replicas, pods=len(live), ready_pods=ready)
    return attrs.evolve(model, phase=phase)


def _scale(
    pods: list[Pod], desired: int, *, now: datetime, load: timedelta, termination: timedelta
) -> None:
    live = [i for i, p in enumerate(pods) if p.gone_at is None]
    for _ in range(desired - len(live)):
        pods.append(Pod(created=now, ready_at=now + load))
    for i in live[desired:] if desired < len(live) else []:
        pods[i] = attrs.evolve(pods[i], gone_at=now + termination)


def _next_instant(
    now: datetime,
    pending: list[Request],
    *,
    pods: dict[str, list[Pod]],
    windows: Sequence[LeaseWindow],
    next_change: datetime | None,
) -> datetime | None:
    candidates = [r.at for r in pending[:1]]
    for ps in pods.values():
        for p in ps:
            candidates += [t for t in (p.ready_at, p.gone_at) if t is not None]
    for w in windows:
        candidates += [t for t in (w.start, w.end, w.lease.expires_at) if t is not None]
    if next_change is not None:
        candidates.append(next_change)
    return min((c for c in candidates if c > now), default=None)


def _step(now: datetime, decision: GroupDecision, *, pods: dict[str, list[Pod]]) -> Step:
    counts = tuple(
        (
            name,
            len(ps),
            len([p for p in ps if p.gone_at is None and p.ready_at <= now]),
        )
        for name, ps in sorted(pods.items())
    )
    return Step(now, decision.leader, decision.reason, decision.message, decision.events, counts)
