"""Frozen snapshots of the cluster as the core sees it.

Snapshots are values: `@attrs.frozen`, tuple fields, changed only through
`attrs.evolve`. Construction validates ranges and forms (priority 0–1000, no
negative durations, timezone-aware datetimes) and raises `InvalidFieldError`
naming the field and the value. Converting Kubernetes JSON into these classes is
the adapter's job, never this module's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

import attrs

from flexinfer_core.durations import check_window, format_duration, parse_duration
from flexinfer_core.errors import InvalidFieldError

MIN_PRIORITY = 0
MAX_PRIORITY = 1000


class Phase(enum.StrEnum):
    """`Model.status.phase`."""

    IDLE = "Idle"
    PENDING = "Pending"
    LOADING = "Loading"
    READY = "Ready"
    PREEMPTED = "Preempted"
    FAILED = "Failed"
    # Replaced as the holder while requests were in flight: it keeps its pods (and
    # finishes those requests) until they are done or its drain timeout ends
    # (flexinfer_core.drain).
    DRAINING = "Draining"


class SharedState(enum.StrEnum):
    """`Model.status.sharedGroup.state`."""

    ACTIVE = "Active"
    QUEUED = "Queued"


class LeaseSource(enum.StrEnum):
    """Where a GPU lease was read from; a `GPULease` beats the legacy ConfigMap."""

    GPU_LEASE = "GPULease"
    CONFIG_MAP = "ConfigMap"


# --- validators -----------------------------------------------------------------


def _qualified(instance: Any, attribute: attrs.Attribute[Any]) -> str:
    name = getattr(instance, "name", None)
    prefix = type(instance).__name__
    return f"{prefix}({name}).{attribute.name}" if name else f"{prefix}.{attribute.name}"


def aware_or_none(instance: Any, attribute: attrs.Attribute[Any], value: datetime | None) -> None:
    if value is None:
        return
    if not isinstance(value, datetime):
        raise InvalidFieldError(
            _qualified(instance, attribute), value, "is not a datetime", attribute=attribute.name
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidFieldError(
            _qualified(instance, attribute),
            value,
            "is a naive datetime; give a timezone (UTC)",
            attribute=attribute.name,
        )


MAX_REPLICAS = 2**31 - 1
"""What the API server's scale subresource can hold (int32)."""


def non_negative_duration(
    instance: Any, attribute: attrs.Attribute[Any], value: timedelta | None
) -> None:
    if value is None:
        return
    if not isinstance(value, timedelta):
        raise InvalidFieldError(
            _qualified(instance, attribute), value, "is not a duration", attribute=attribute.name
        )
    check_window(value, field=_qualified(instance, attribute), attribute=attribute.name)


def int_between(low: int, high: int | None) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidFieldError(
                _qualified(instance, attribute),
                value,
                "is not an integer",
                attribute=attribute.name,
            )
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise InvalidFieldError(
                _qualified(instance, attribute),
                value,
                f"must be {bound}",
                attribute=attribute.name,
            )

    return check


def positive_bytes_or_none(
    instance: Any, attribute: attrs.Attribute[Any], value: int | None
) -> None:
    """A memory size in bytes: None (not given) or a positive integer."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidFieldError(
            _qualified(instance, attribute),
            value,
            "must be a positive number of bytes",
            attribute=attribute.name,
        )


def non_empty_name(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidFieldError(f"{type(instance).__name__}.{attribute.name}", value, "is empty")


def _as_tuple(value: Any) -> tuple[str, ...]:
    return tuple(value)


def _conditions(value: Any) -> tuple[Condition, ...]:
    return tuple(value)


# --- the policy: every default ------------------------------------------------------


def _window(instance: Any, attribute: attrs.Attribute[Any], value: timedelta) -> None:
    non_negative_duration(instance, attribute, value)


@attrs.frozen
class Policy:
    """Every default the decisions use, in one place (docs/election.md, Timing defaults).

    The fields are the controller's to decide: each is one of its flags (`flag` in the
    field's metadata; `policy_flags` lists them for every command that decides as the
    controller does). A spec field the controller's policy decides (`spec_field` in the
    metadata: a Model's `spec.gpu.swapCooldown`) has no default in the CRDs, so that
    leaving it out means "the controller's default".

    The class constants are the defaults of the spec fields the API server fills in
    from the CRDs (tests/test_crd_defaults.py checks that the CRDs say exactly these);
    the adapters, the proxy and the simulator use them for an object read without the
    field (e.g. one stored before a CRD had the default).
    """

    demand_window: timedelta = attrs.field(
        default=timedelta(minutes=2),
        validator=_window,
        metadata={
            "flag": "--demand-window",
            "help": "a model asked for this recently is demanded (Go duration)",
        },
    )
    recent_window: timedelta = attrs.field(
        default=timedelta(minutes=5),
        validator=_window,
        metadata={
            "flag": "--recent-window",
            "help": "a model used this recently leads when nothing is Ready (Go duration)",
        },
    )
    default_swap_cooldown: timedelta = attrs.field(
        default=timedelta(minutes=5),
        validator=_window,
        metadata={
            "flag": "--default-swap-cooldown",
            "help": "the swap cooldown of a Model that leaves spec.gpu.swapCooldown out "
            "(Go duration)",
            "spec_field": ("Model", "spec.gpu.swapCooldown"),
        },
    )

    # Model `spec.gpu.priority`, ModelDeployment `spec.priority`, GPUGroup
    # `spec.models[].priority`.
    PRIORITY: ClassVar[int] = 100
    # Model `spec.serverless.*`; a ModelDeployment's `idleTimeoutSeconds`,
    # `coldStartTimeoutSeconds` and `minReplicas` default to the same.
    SERVERLESS_ENABLED: ClassVar[bool] = True
    MIN_REPLICAS: ClassVar[int] = 0
    IDLE_TIMEOUT: ClassVar[timedelta] = timedelta(minutes=5)
    COLD_START_TIMEOUT: ClassVar[timedelta] = timedelta(seconds=60)
    # Model `spec.gpu.forcePromotion`.
    FORCE_PROMOTION: ClassVar[bool] = False
    # Model `spec.gpu.default` (docs/election.md 1.5).
    DEFAULT_MEMBER: ClassVar[bool] = False
    # Model `spec.gpu.drainTimeout` (docs/election.md 1.6): how long a replaced holder
    # may keep its pods to finish the requests in flight; 0 turns draining off.
    DRAIN_TIMEOUT: ClassVar[timedelta] = timedelta(seconds=60)


DEFAULT_PRIORITY = Policy.PRIORITY


@attrs.frozen
class PolicyFlag:
    """One of the controller's election flags: its name, the `Policy` attribute it sets,
    its default as written on the command line, and what it does."""

    flag: str
    attribute: str
    default: str
    help: str


def policy_flags(defaults: Policy | None = None) -> tuple[PolicyFlag, ...]:
    """The flags that set a `Policy`, with `defaults`' values (the built-in policy's)."""
    defaults = defaults if defaults is not None else Policy()
    return tuple(
        PolicyFlag(
            flag=field.metadata["flag"],
            attribute=field.name,
            default=format_duration(getattr(defaults, field.name)),
            help=field.metadata["help"],
        )
        for field in attrs.fields(Policy)
    )


def policy_from_flags(values: Mapping[str, str]) -> Policy:
    """A `Policy` from the flags' values, by `Policy` attribute name (an absent one keeps
    its default); a value that does not parse raises `DurationError` naming the flag."""
    fields = {flag.attribute: flag for flag in policy_flags()}
    return Policy(
        **{name: parse_duration(text, field=fields[name].flag) for name, text in values.items()}
    )


# --- the Model snapshot -----------------------------------------------------------


FAILURE_MESSAGE_CHARS = 1024
"""How much of a termination message a failure keeps (its end: where a log says why)."""


@attrs.frozen
class ServerFailure:
    """Why a workload's server is failing, as the kubelet recorded it.

    `container` restarted `restarts` times, or its pod failed (`restarts` 0); its last
    termination had `exit_code` (None: not known), `reason` (Error, OOMKilled,
    Completed, ...) and `message` (the termination message: with the
    `FallbackToLogsOnError` policy, the end of its log).
    """

    container: str
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    message: str = ""

    def describe(self) -> str:
        """One line for a condition: which container, how it ended, in its own words.

        The restart count is left out on purpose: it grows with every restart, and a
        status rewritten at each one would be news without news.
        """
        how = "failed" if self.restarts == 0 else "keeps restarting"
        ended = []
        if self.exit_code is not None:
            ended.append(f"exit code {self.exit_code}")
        if self.reason:
            ended.append(self.reason)
        text = f"container {self.container} {how}"
        if ended:
            text += f" (last termination: {', '.join(ended)})"
        message = " ".join(self.message.split())
        if len(message) > FAILURE_MESSAGE_CHARS:
            message = "…" + message[-FAILURE_MESSAGE_CHARS:]
        return f"{text}: {message}" if message else text


@attrs.frozen
class Condition:
    """A status condition without its transition time (the adapter stamps that)."""

    type: str
    status: bool
    reason: str
    message: str


@attrs.frozen
class VramUse:
    """`status.vram` of a member of a budgeted group (docs/election.md 1.7), in bytes:
    its footprint (None: unknown, it takes the whole card), the group's budget (None:
    its members disagree) and what the holders' footprints take of it (None: the
    group is not packed; the members that hold the card are those Active)."""

    footprint: int | None
    budget: int | None
    used: int | None


@attrs.frozen
class Serverless:
    """`Model.spec.serverless` with the spec's defaults."""

    enabled: bool = Policy.SERVERLESS_ENABLED
    min_replicas: int = attrs.field(default=Policy.MIN_REPLICAS, validator=int_between(0, 10))
    idle_timeout: timedelta = attrs.field(
        default=Policy.IDLE_TIMEOUT, validator=non_negative_duration
    )
    cold_start_timeout: timedelta = attrs.field(
        default=Policy.COLD_START_TIMEOUT, validator=non_negative_duration
    )


@attrs.frozen
class ModelState:
    """One `Model` as observed: its spec, its status and its Deployment's replicas.

    `phase` is the phase as observed from the workload; the `recorded_*` fields and
    the other observed status fields (`shared_state`, `queue_position`,
    `preempted_by`, `conditions`, `observed_generation`, `replicas`,
    `active_services`) are what the cluster holds now. Together they let the core
    say exactly what would change, so that a reconcile that changes nothing writes
    nothing.
    """

    name: str = attrs.field(validator=non_empty_name)
    namespace: str = attrs.field(default="default", validator=non_empty_name)
    group: str = ""
    priority: int = attrs.field(
        default=DEFAULT_PRIORITY, validator=int_between(MIN_PRIORITY, MAX_PRIORITY)
    )
    phase: Phase = attrs.field(default=Phase.IDLE, converter=Phase)
    last_active: datetime | None = attrs.field(default=None, validator=aware_or_none)
    shared_state: SharedState | None = attrs.field(
        default=None, converter=attrs.converters.optional(SharedState)
    )
    preempted_at: datetime | None = attrs.field(default=None, validator=aware_or_none)
    swap_cooldown: timedelta | None = attrs.field(default=None, validator=non_negative_duration)
    force_promotion: bool = Policy.FORCE_PROMOTION
    serverless: Serverless = Serverless()
    # `spec.gpu.default`: the member the card returns to (docs/election.md 1.5).
    default_member: bool = Policy.DEFAULT_MEMBER
    service_labels: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    cache_ready: bool = True
    # `spec.gpu.drainTimeout` (docs/election.md 1.6).
    drain_timeout: timedelta = attrs.field(
        default=Policy.DRAIN_TIMEOUT, validator=non_negative_duration
    )
    # `status.inFlight`: the requests the proxy has sent it and not yet seen answered,
    # and when it said so (None: never; a report older than DEMAND_STALE_AFTER counts
    # as 0, flexinfer_core.drain).
    in_flight: int = attrs.field(default=0, validator=int_between(0, None))
    in_flight_at: datetime | None = attrs.field(default=None, validator=aware_or_none)
    # `status.sharedGroup.drainingSince`: when it started draining (None: it is not).
    draining_since: datetime | None = attrs.field(default=None, validator=aware_or_none)
    # docs/election.md 1.7: `spec.gpu.vramBudget` (bytes; None: not set, no packing)
    # and the member's footprint, its `spec.gpu.vramEstimate` or the adapter's
    # estimate (bytes; None: unknown, it takes the whole card).
    vram_budget: int | None = attrs.field(default=None, validator=positive_bytes_or_none)
    vram_estimate: int | None = attrs.field(default=None, validator=positive_bytes_or_none)
    # Why its server is failing (None: it is not); what a Failed member's Ready
    # condition and message say (flexinfer_core.phases).
    failure: ServerFailure | None = None
    # Observed status and workload; None means "not written yet".
    queue_position: int | None = None
    preempted_by: str | None = None
    conditions: tuple[Condition, ...] = attrs.field(default=(), converter=_conditions)
    replicas: int | None = None
    active_services: str | None = None
    # The status as written last (`status.phase`, `.message`, `.sharedGroup.groupName`,
    # `.observedGeneration`) and `metadata.generation`; None means absent.
    recorded_phase: Phase | None = attrs.field(
        default=None, converter=attrs.converters.optional(Phase)
    )
    recorded_message: str | None = None
    recorded_group: str | None = None
    # `status.vram` and the `Packed` condition as written last (None: absent).
    recorded_vram: VramUse | None = None
    recorded_packed: Condition | None = None
    generation: int | None = None
    observed_generation: int | None = None

    @property
    def runnable(self) -> bool:
        """A member is runnable unless it failed or its model cache is not ready."""
        return self.phase is not _FAILED and self.cache_ready

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def with_written_status(
    model: ModelState,
    *,
    shared_state: SharedState | None,
    phase: Phase,
    preempted_at: datetime | None,
) -> ModelState:
    """`model` with the `sharedGroup.state`, phase and `preemptedAt` a decision writes.

    For the election's settled ballot (flexinfer_core.election.Ballot.settled): the
    values come from a decision about this very model, so they are not validated
    again; `attrs.evolve` would run every validator of every field, for every member
    whose status a decision changes, at every reconcile.
    """
    copy = object.__new__(ModelState)
    for name in _MODEL_FIELDS:
        object.__setattr__(copy, name, getattr(model, name))
    object.__setattr__(copy, "shared_state", shared_state)
    object.__setattr__(copy, "phase", phase)
    object.__setattr__(copy, "preempted_at", preempted_at)
    return copy


_MODEL_FIELDS = tuple(f.name for f in attrs.fields(ModelState))


@attrs.frozen
class GpuLease:
    """A GPU lease on a shared group, from a `GPULease` or the legacy ConfigMap."""

    name: str = attrs.field(validator=non_empty_name)
    group: str = attrs.field(validator=non_empty_name)
    namespace: str = attrs.field(default="default", validator=non_empty_name)
    owner: str = ""
    node: str = ""
    expires_at: datetime | None = attrs.field(default=None, validator=aware_or_none)
    source: LeaseSource = attrs.field(default=LeaseSource.GPU_LEASE, converter=LeaseSource)
    # Why the lease cannot be read ("" when it can), e.g. an `expiresAt` that does not
    # parse. Such a lease governs nothing: the election fails open and says why.
    problem: str = ""


DEFAULT_POLICY = Policy()
_FAILED = Phase.FAILED  # a global: reading an enum member off its class is slow on 3.11
