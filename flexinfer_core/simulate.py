"""A discrete-event simulator of one shared group, driven only by the core.

Simulated time is still just `now`: the simulator jumps from one instant to the
next (a request, a pod becoming ready or gone, a lease starting or ending, a queued
request's refresh or time-out, a client's retry, or the decision's own
`next_change_at`), decides, and applies the decision to a model of the cluster in
which pods take `load_time` to become ready and `termination_time` to go away.

Requests go through a model of the proxy (docs/proxy.md, "Queueing and demand"),
because demand is what the proxy writes, not what clients send: a request for a
Ready model with nobody waiting is served and refreshes `lastActiveTime` at most
once per `refresh_interval`; any other request queues, the first of a burst
writes `lastActiveTime`, and the demand is written again every `refresh_interval`
while requests wait; a queued request is served when its model turns Ready, or
answered 503 at the queue wait (max(`min_queue_wait`, the model's
`coldStartTimeout`)), after which its client asks again `retry_after` later, up to
`retries` times. So a model asked for while another holds the card stays demanded
as long as its clients keep asking, as it does on a cluster.

It is what `flexinfer simulate` prints and what the docs' scenarios are checked
against. No clock, no I/O.
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
    Phase,
    Policy,
    aware_or_none,
    int_between,
    non_negative_duration,
)


@attrs.frozen
class Request:
    """A client's request for `model`, first sent at `at`."""

    at: datetime = attrs.field(validator=aware_or_none)
    model: str


@attrs.frozen
class LeaseWindow:
    """A lease that exists from `start` until it is deleted at `end` (None: never)."""

    lease: GpuLease
    start: datetime = attrs.field(validator=aware_or_none)
    end: datetime | None = attrs.field(default=None, validator=aware_or_none)


@attrs.frozen
class ProxySettings:
    """The proxy's timing, as its flags set it (docs/proxy.md)."""

    # `--min-queue-wait`: a queued request waits max(this, the model's coldStartTimeout).
    min_queue_wait: timedelta = attrs.field(
        default=timedelta(seconds=60), validator=non_negative_duration
    )
    # How often the proxy writes the demand of requests that wait, and at most how often
    # it writes it for served ones (a minute; not a flag).
    refresh_interval: timedelta = attrs.field(
        default=timedelta(seconds=60), validator=non_negative_duration
    )

    def __attrs_post_init__(self) -> None:
        if self.refresh_interval <= timedelta(0):
            raise InvalidFieldError(
                "proxy.refreshInterval", self.refresh_interval, "must be longer than 0s"
            )


@attrs.frozen
class ClientSettings:
    """What a client does with a 503 `model_not_ready`: asks again `retry_after` later,
    at most `retries` times. The proxy's `Retry-After` is between `--retry-after` (10s)
    and twice that; OpenAI's clients retry twice by default."""

    retries: int = attrs.field(default=2, validator=int_between(0, 1000))
    retry_after: timedelta = attrs.field(
        default=timedelta(seconds=15), validator=non_negative_duration
    )


DEFAULT_PROXY = ProxySettings()
DEFAULT_CLIENTS = ClientSettings()


@attrs.frozen
class RequestOutcome:
    """What became of one request: when it reached a Ready model (None: not by the end
    of the run) and each 503 it got on the way (its client asked again after each but
    the last when `gave_up`)."""

    request: Request
    served_at: datetime | None
    refusals: tuple[datetime, ...] = ()
    gave_up: bool = False


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
    # Every member that holds the card, the leader first (more than one only in a
    # packed group, docs/election.md 1.7).
    holders: tuple[str, ...] = ()


@attrs.frozen
class Timeline:
    steps: tuple[Step, ...]
    swaps: int
    max_members_with_pods: int
    requests: tuple[RequestOutcome, ...] = ()
    # Every write of a member's `lastActiveTime` by the proxy: (when, member).
    demand: tuple[tuple[datetime, str], ...] = ()

    @property
    def holders(self) -> tuple[tuple[datetime, str | None], ...]:
        """Each change of the card's holder (None: nobody), in order, from the first step."""
        out: list[tuple[datetime, str | None]] = []
        for step in self.steps:
            if not out or out[-1][1] != step.leader:
                out.append((step.at, step.leader))
        return tuple(out)


@attrs.define
class _Attempt:
    """One try of a request: queued until `deadline`, or not yet sent (`sent_at`)."""

    index: int
    sent_at: datetime
    tries: int
    deadline: datetime | None = None


@attrs.define
class _ProxyModel:
    """The proxy's per-model queue and demand writes (flexinfer_proxy.queues/.demand)."""

    settings: ProxySettings
    clients: ClientSettings
    requests: Sequence[Request]
    wait_limit: dict[str, timedelta]
    queues: dict[str, list[_Attempt]] = attrs.field(factory=dict)
    refresh_at: dict[str, datetime] = attrs.field(factory=dict)
    last_marked: dict[str, datetime] = attrs.field(factory=dict)
    served_at: dict[int, datetime] = attrs.field(factory=dict)
    refusals: dict[int, list[datetime]] = attrs.field(factory=dict)
    gave_up: set[int] = attrs.field(factory=set)
    upcoming: list[_Attempt] = attrs.field(factory=list)
    written: list[tuple[datetime, str]] = attrs.field(factory=list)

    def step(self, now: datetime, *, ready: set[str]) -> dict[str, datetime]:
        """Everything the proxy does at `now`; returns the demand written, by model."""
        marks: dict[str, datetime] = {}
        # Time-outs first: a request's wait timer is armed before its burst's refresher.
        for model, queue in self.queues.items():
            for attempt in [a for a in queue if a.deadline is not None and a.deadline <= now]:
                queue.remove(attempt)
                self.refusals.setdefault(attempt.index, []).append(now)
                if attempt.tries > self.clients.retries:
                    self.gave_up.add(attempt.index)
                else:
                    self.upcoming.append(
                        _Attempt(attempt.index, now + self.clients.retry_after, attempt.tries + 1)
                    )
            if not queue:
                self.refresh_at.pop(model, None)
        for model, due in list(self.refresh_at.items()):
            if due <= now:
                marks[model] = now
                self.refresh_at[model] = now + self.settings.refresh_interval
        arriving = sorted(
            (a for a in self.upcoming if a.sent_at <= now), key=lambda a: (a.sent_at, a.index)
        )
        self.upcoming = [a for a in self.upcoming if a.sent_at > now]
        for attempt in arriving:
            model = self.requests[attempt.index].model
            queue = self.queues.setdefault(model, [])
            if model in ready and not queue:
                self._served(attempt, model, now=now, marks=marks)
                continue
            if not queue:  # a burst starts: demand now, and again every interval
                marks[model] = now
                self.refresh_at[model] = now + self.settings.refresh_interval
            attempt.deadline = now + self.wait_limit[model]
            queue.append(attempt)
        for model, queue in self.queues.items():
            if model in ready and queue:
                for attempt in queue:
                    self._served(attempt, model, now=now, marks=marks)
                queue.clear()
                self.refresh_at.pop(model, None)
        for model, at in sorted(marks.items()):
            self.last_marked[model] = at
            self.written.append((at, model))
        return marks

    def _served(
        self, attempt: _Attempt, model: str, *, now: datetime, marks: dict[str, datetime]
    ) -> None:
        self.served_at[attempt.index] = now
        last = marks.get(model) or self.last_marked.get(model)
        if last is None or now - last >= self.settings.refresh_interval:
            marks[model] = now

    def instants(self) -> list[datetime]:
        """When the proxy next acts by itself: retries, time-outs, refreshes."""
        out = [a.sent_at for a in self.upcoming]
        out += [a.deadline for q in self.queues.values() for a in q if a.deadline is not None]
        out += list(self.refresh_at.values())
        return out

    def outcomes(self) -> tuple[RequestOutcome, ...]:
        return tuple(
            RequestOutcome(
                request,
                self.served_at.get(i),
                tuple(self.refusals.get(i, ())),
                gave_up=i in self.gave_up,
            )
            for i, request in enumerate(self.requests)
        )


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
    proxy: ProxySettings = DEFAULT_PROXY,
    clients: ClientSettings = DEFAULT_CLIENTS,
    max_steps: int = 100_000,
) -> Timeline:
    """Run the group from `start` to `until` and return what happened."""
    _check_duration("load_time", load_time)
    _check_duration("termination_time", termination_time)
    names = {m.name for m in models}
    ordered = sorted(requests, key=lambda r: (r.at, r.model))
    for request in ordered:
        if request.model not in names:
            raise InvalidFieldError("requests.model", request.model, "is not a member")
    front = _ProxyModel(
        proxy,
        clients,
        ordered,
        wait_limit={
            m.name: max(proxy.min_queue_wait, m.serverless.cold_start_timeout) for m in models
        },
        upcoming=[_Attempt(i, r.at, 1) for i, r in enumerate(ordered)],
    )
    windows = tuple(leases)
    state = list(models)
    pods: dict[str, list[Pod]] = {m.name: [] for m in models}
    steps: list[Step] = []
    swaps = 0
    widest = 0
    now = start
    last_leader: str | None = None
    for _ in range(max_steps):
        for name in pods:
            pods[name] = [p for p in pods[name] if p.gone_at is None or p.gone_at > now]
        state = [_observe(m, pods[m.name], now=now) for m in state]
        marks = front.step(now, ready={m.name for m in state if m.phase is Phase.READY})
        state = [
            attrs.evolve(m, last_active=_later(m.last_active, marks[m.name]))
            if m.name in marks
            else m
            for m in state
        ]
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
            or (step.leader, step.pods, step.holders)
            != (
                steps[-1].leader,
                steps[-1].pods,
                steps[-1].holders,
            )
        ):
            steps.append(step)
        last_leader = decision.leader
        following = _next_instant(
            now,
            front.instants(),
            pods=pods,
            windows=windows,
            next_change=decision.next_change_at,
        )
        if following is None or following > until:
            break
        now = following
    return Timeline(tuple(steps), swaps, widest, front.outcomes(), tuple(front.written))


def _later(recorded: datetime | None, mark: datetime) -> datetime:
    # The proxy never moves `lastActiveTime` backwards.
    return mark if recorded is None or mark > recorded else recorded


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
    proxy_instants: list[datetime],
    *,
    pods: dict[str, list[Pod]],
    windows: Sequence[LeaseWindow],
    next_change: datetime | None,
) -> datetime | None:
    candidates = list(proxy_instants)
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
    beside = tuple(m.name for m in decision.members if m.is_leader and m.name != decision.leader)
    holders = (decision.leader, *beside) if decision.leader is not None else beside
    return Step(
        now, decision.leader, decision.reason, decision.message, decision.events, counts, holders
    )
