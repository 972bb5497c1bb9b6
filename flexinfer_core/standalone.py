"""A ModelDeployment no GPUGroup governs: in use, idle, scaled to zero, or held at zero.

Rules: docs/election.md section 4. A ModelDeployment outside any GPUGroup runs
`replicas` pods (at least 1) while its last request (`status.lastAccessTime`,
written by the proxy) is younger than `idleTimeoutSeconds`, and `minReplicas`
otherwise (0 = scale to zero; never used = `minReplicas`). One guard: a
Deployment that was woken up and has no ready pod yet is kept up for
`coldStartTimeoutSeconds` after the request, so an idle timeout shorter than the
model's load does not scale it down under the proxy's waiting queue.

The reason and message name the rule, never how long ago the request was or the
replicas being replaced, so deciding again after applying the decision gives the
same reason and no scale: the condition is not rewritten without news (ColdStart
ends when a pod is ready, which changes the status anyway). The scale itself is
reported as `scale_to` and an `Event`. No I/O, no clock: `now` is a parameter and
`next_change_at` is the idle-timeout (or cold-start) lapse.

A ModelDeployment whose GPUGroup membership is in conflict (flexinfer_core.membership)
is decided here too: it is held at zero whatever its demand, may not serve, and its
reason and message are the conflict's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from flexinfer_core import reasons
from flexinfer_core.durations import format_duration
from flexinfer_core.errors import InvalidFieldError
from flexinfer_core.group import Event
from flexinfer_core.membership import Membership
from flexinfer_core.snapshot import (
    MAX_REPLICAS,
    Policy,
    aware_or_none,
    int_between,
    non_empty_name,
    non_negative_duration,
)
from flexinfer_core.timestamps import far_ahead, future_note, not_after

DEFAULT_IDLE_TIMEOUT = Policy.IDLE_TIMEOUT
DEFAULT_COLD_START_TIMEOUT = Policy.COLD_START_TIMEOUT


def _optional_count(
    instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is not None:
        int_between(0, None)(instance, attribute, value)


@attrs.frozen
class StandaloneDeployment:
    """One standalone ModelDeployment as observed, with its Deployment's replicas."""

    name: str = attrs.field(validator=non_empty_name)
    namespace: str = attrs.field(default="default", validator=non_empty_name)
    replicas: int = attrs.field(default=1, validator=int_between(0, MAX_REPLICAS))
    min_replicas: int = attrs.field(
        default=Policy.MIN_REPLICAS, validator=int_between(0, MAX_REPLICAS)
    )
    idle_timeout: timedelta = attrs.field(
        default=DEFAULT_IDLE_TIMEOUT, validator=non_negative_duration
    )
    cold_start_timeout: timedelta = attrs.field(
        default=DEFAULT_COLD_START_TIMEOUT, validator=non_negative_duration
    )
    last_access_time: datetime | None = attrs.field(default=None, validator=aware_or_none)
    # The Deployment's spec.replicas; None when there is no Deployment to scale.
    current_replicas: int | None = attrs.field(default=None, validator=_optional_count)
    ready_replicas: int = attrs.field(default=0, validator=int_between(0, None))
    # Set when it may not run at all: its GPUGroup membership is in conflict.
    conflict: Membership | None = None
    # False while the ModelCache it mounts is not complete: it may not run yet.
    cache_ready: bool = True

    def __attrs_post_init__(self) -> None:
        if self.min_replicas > self.replicas:
            raise InvalidFieldError(
                f"StandaloneDeployment({self.name}).min_replicas",
                self.min_replicas,
                f"must not exceed replicas ({self.replicas})",
                attribute="min_replicas",
            )

    @property
    def in_use_replicas(self) -> int:
        """Pods while in use: `replicas`, at least 1 (a request needs a pod)."""
        return max(1, self.replicas)


@attrs.frozen
class StandaloneDecision:
    desired_replicas: int
    reason: str
    message: str
    # Set only when the Deployment exists and its replicas differ from the desired.
    scale_to: int | None
    event: Event | None
    next_change_at: datetime | None
    # False when it must not report Ready even with a ready pod (held at zero).
    may_serve: bool = True
    # Set when the recorded `lastAccessTime` lay far in the future: the value to write
    # instead (`now`), with the Warning that says so.
    rewrite_last_access_time: datetime | None = None
    warning: Event | None = None


def decide_standalone(state: StandaloneDeployment, *, now: datetime) -> StandaloneDecision:
    """How many pods a standalone ModelDeployment should run now (docs/election.md 4).

    A `lastAccessTime` after `now` is read as `now` (read as recorded, one from the year
    9999 would keep it in use, never scaled to zero, until then); beyond
    `FUTURE_TOLERANCE` the message and a Warning say so, and it is rewritten.
    """
    recorded = state.last_access_time
    state = attrs.evolve(state, last_access_time=not_after(recorded, now))
    decision = _decide(state, now=now)
    if recorded is None or not far_ahead(recorded, now):
        return decision
    note = future_note("status.lastAccessTime", recorded)
    return attrs.evolve(
        decision,
        message=f"{decision.message}; {note}",
        rewrite_last_access_time=now,
        warning=Event(state.name, reasons.TIMESTAMP_IN_FUTURE, f"{state.name}: {note}", "Warning"),
    )


def _decide(state: StandaloneDeployment, *, now: datetime) -> StandaloneDecision:
    if state.conflict is not None:
        return _held_at_zero(
            state, reason=state.conflict.reason, message=state.conflict.message, warning=True
        )
    if not state.cache_ready:
        return _held_at_zero(
            state,
            reason=reasons.CACHE_NOT_READY,
            message="its ModelCache is not ready; it starts once the copy is complete",
            warning=False,
        )
    last = state.last_access_time
    idle_timeout = format_duration(state.idle_timeout)
    next_change_at: datetime | None = None
    if last is None:
        desired = state.min_replicas
        reason = _idle_reason(state)
        message = f"no request recorded yet; {_idle_phrase(state)}"
    elif now - last < state.idle_timeout:
        desired = state.in_use_replicas
        reason = reasons.IN_USE
        message = f"in use: a request arrived within the {idle_timeout} idle timeout"
        next_change_at = last + state.idle_timeout
    elif _starting(state) and now - last < state.cold_start_timeout:
        desired = state.in_use_replicas
        reason = reasons.COLD_START
        message = (
            f"starting: no pod ready yet, kept up for the "
            f"{format_duration(state.cold_start_timeout)} cold start timeout"
        )
        next_change_at = last + state.cold_start_timeout
    else:
        desired = state.min_replicas
        reason = _idle_reason(state)
        message = f"no request for {idle_timeout}; {_idle_phrase(state)}"

    current = state.current_replicas
    scale_to = desired if current is not None and current != desired else None
    event: Event | None = None
    if scale_to is not None and current is not None:
        event_reason = reasons.DEMAND_SCALE_UP if scale_to > current else reason
        event = Event(state.name, event_reason, f"scaled from {current} to {scale_to}: {message}")
    return StandaloneDecision(
        desired_replicas=desired,
        reason=reason,
        message=message,
        scale_to=scale_to,
        event=event,
        next_change_at=next_change_at
        if next_change_at is not None and next_change_at > now
        else None,
    )


def _held_at_zero(
    state: StandaloneDeployment, *, reason: str, message: str, warning: bool
) -> StandaloneDecision:
    current = state.current_replicas
    scale_to = 0 if current else None
    event = (
        Event(
            state.name,
            reason,
            f"scaled from {current} to 0: {message}",
            type="Warning" if warning else "Normal",
        )
        if current
        else None
    )
    return StandaloneDecision(
        desired_replicas=0,
        reason=reason,
        message=message,
        scale_to=scale_to,
        event=event,
        next_change_at=None,
        may_serve=False,
    )


def _starting(state: StandaloneDeployment) -> bool:
    return bool(state.current_replicas) and state.ready_replicas == 0


def _idle_reason(state: StandaloneDeployment) -> str:
    return reasons.IDLE_SCALE_TO_ZERO if state.min_replicas == 0 else reasons.IDLE_MIN_REPLICAS


def _idle_phrase(state: StandaloneDeployment) -> str:
    if state.min_replicas == 0:
        return "scaled to zero until the next request"
    return f"kept at minReplicas {state.min_replicas}"
