"""GPU leases: when one is active, which one governs a group, and the finetune lifecycle.

Rules: docs/election.md section 2. A lease is active while it exists and its
`expiresAt` is absent or still ahead of `now`; expiry needs no write. A `GPULease`
takes precedence over the legacy ConfigMap carrier. This module decides; the
controller creates, refreshes and deletes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import datetime, timedelta

import attrs

from flexinfer_core import reasons
from flexinfer_core.errors import InvalidFieldError
from flexinfer_core.snapshot import GpuLease, LeaseSource, aware_or_none

MIN_LEASE_TTL_SECONDS = 60
DEFAULT_FINETUNE_TIMEOUT_SECONDS = 21600
LEASE_TTL_MARGIN_SECONDS = 600


def lease_is_active(lease: GpuLease, now: datetime) -> bool:
    """Active ⇔ readable, and no expiry or `now` strictly before it.

    A lease that cannot be read (`problem`) is never active: an `expiresAt` that does
    not parse must not read as "no expiry", which would park the group forever (the
    spec's fail-open rule points the other way).
    """
    if lease.problem:
        return False
    return lease.expires_at is None or now < lease.expires_at


def unreadable_leases(
    leases: Iterable[GpuLease], *, namespace: str, group: str
) -> tuple[GpuLease, ...]:
    """The leases on `group` that could not be read, by name (they govern nothing)."""
    return tuple(
        sorted(
            (
                lease
                for lease in leases
                if lease.problem and lease.namespace == namespace and lease.group == group
            ),
            key=lambda lease: (lease.source.value, lease.name),
        )
    )


def governing_lease(
    leases: Iterable[GpuLease], *, namespace: str, group: str, now: datetime
) -> GpuLease | None:
    """The active lease that parks `group`, or None.

    Several may exist; the choice is deterministic: a `GPULease` before a
    ConfigMap, then the one without expiry or expiring last, then by name.
    """
    active = [
        lease
        for lease in leases
        if lease.namespace == namespace and lease.group == group and lease_is_active(lease, now)
    ]
    if not active:
        return None

    def rank(lease: GpuLease) -> tuple[int, int, float, str, str, str]:
        no_ttl = 0 if lease.expires_at is None else 1
        expiry = 0.0 if lease.expires_at is None else -lease.expires_at.timestamp()
        source = 0 if lease.source is LeaseSource.GPU_LEASE else 1
        # Owner and node last, so the choice is total even for look-alike leases.
        return (source, no_ttl, expiry, lease.name, lease.owner, lease.node)

    return min(active, key=rank)


def finetune_lease_name(cache_name: str) -> str:
    """The GPULease a finetuning ModelCache takes: `<modelcache>-gpu-lease`."""
    return f"{cache_name}-gpu-lease"


MAX_HOLDER_LABEL_BYTES = 512
"""`sharedGroup.preemptedBy`'s bound in the CRD. A legacy ConfigMap's `owner` has none;
a label beyond it would be refused (422), so it is cut (by UTF-8 bytes, which also
keeps it within 512 characters however they are counted)."""


def lease_holder_label(lease: GpuLease) -> str:
    """What `sharedGroup.preemptedBy` says under a lease: ``gpu-lease/<owner>``, cut to
    `MAX_HOLDER_LABEL_BYTES` with a trailing "..." when the owner is longer."""
    label = f"gpu-lease/{lease.owner or lease.name}"
    encoded = label.encode()
    if len(encoded) <= MAX_HOLDER_LABEL_BYTES:
        return label
    return encoded[: MAX_HOLDER_LABEL_BYTES - 3].decode(errors="ignore") + "..."


MAX_LEASE_SECONDS = 2_592_000
"""30 days: the CRD's bound on lease and timeout seconds (older objects may hold more;
far larger ones would overflow `now + ttl`)."""


def finetune_lease_ttl(
    ttl_seconds: int | None = None, *, timeout_seconds: int | None = None
) -> timedelta:
    """The finetune lease TTL: `ttlSeconds` if given (at least 60), else timeout + 600 s."""
    if ttl_seconds is not None:
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int):
            raise InvalidFieldError(
                "spec.finetune.gpuLease.ttlSeconds", ttl_seconds, "is not an integer"
            )
        if not MIN_LEASE_TTL_SECONDS <= ttl_seconds <= MAX_LEASE_SECONDS:
            raise InvalidFieldError(
                "spec.finetune.gpuLease.ttlSeconds",
                ttl_seconds,
                f"must be between {MIN_LEASE_TTL_SECONDS} and {MAX_LEASE_SECONDS}",
            )
        return timedelta(seconds=ttl_seconds)
    timeout = DEFAULT_FINETUNE_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int)
        or not 0 <= timeout <= MAX_LEASE_SECONDS
    ):
        raise InvalidFieldError(
            "spec.finetune.timeoutSeconds",
            timeout_seconds,
            f"must be a whole number of seconds from 0 to {MAX_LEASE_SECONDS}",
        )
    return timedelta(seconds=timeout + LEASE_TTL_MARGIN_SECONDS)


class JobPhase(enum.StrEnum):
    """The finetune Job as the controller sees it."""

    ABSENT = "Absent"
    ACTIVE = "Active"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED)


class LeaseAction(enum.StrEnum):
    NONE = "None"
    CREATE = "Create"
    REFRESH = "Refresh"
    DELETE = "Delete"


@attrs.frozen
class FinetuneLeaseInput:
    """A finetune ModelCache that opted into `gpuLease`, with its Job and lease as observed."""

    cache_name: str
    namespace: str
    group: str
    ttl: timedelta
    node: str = ""
    job: JobPhase = attrs.field(default=JobPhase.ABSENT, converter=JobPhase)
    lease_expires_at: datetime | None = attrs.field(default=None, validator=aware_or_none)
    lease_exists: bool = False
    cache_deleted: bool = False

    @property
    def lease_name(self) -> str:
        return finetune_lease_name(self.cache_name)


@attrs.frozen
class FinetuneLeasePlan:
    """What to do with the lease and whether the Job may be created now."""

    action: LeaseAction
    expires_at: datetime | None
    create_job: bool
    reason: str
    message: str
    next_change_at: datetime | None


def refresh_interval(ttl: timedelta) -> timedelta:
    """How stale `expiresAt` may get before a refresh is written.

    Refreshing on literally every reconcile would make each refresh (a watched
    change) trigger the next one; a quarter of the TTL, capped at 5 minutes,
    keeps the lease far from expiry with a bounded number of writes.
    """
    return min(ttl / 4, timedelta(minutes=5))


def plan_finetune_lease(state: FinetuneLeaseInput, *, now: datetime) -> FinetuneLeasePlan:
    """Acquire before the Job, refresh while it is active, release when it ends."""
    target = now + state.ttl
    if state.cache_deleted or state.job.terminal:
        why = (
            "the ModelCache is being deleted"
            if state.cache_deleted
            else (f"the finetune Job {state.job.value.lower()}")
        )
        if state.lease_exists:
            return FinetuneLeasePlan(
                LeaseAction.DELETE,
                None,
                False,
                reasons.LEASE_RELEASE,
                f"releasing GPU lease {state.lease_name} on group {state.group}: {why}",
                None,
            )
        return FinetuneLeasePlan(
            LeaseAction.NONE,
            None,
            False,
            reasons.LEASE_NOT_NEEDED,
            f"no GPU lease held on group {state.group}: {why}",
            None,
        )
    if not state.lease_exists:
        return FinetuneLeasePlan(
            LeaseAction.CREATE,
            target,
            False,
            reasons.LEASE_ACQUIRE,
            f"acquiring GPU lease {state.lease_name} on group {state.group} before the Job starts",
            None,
        )
    # The lease exists: the Job may be created (it parks the group from now on).
    create_job = state.job is JobPhase.ABSENT
    expires = state.lease_expires_at
    interval = refresh_interval(state.ttl)
    if expires is None or expires <= now + state.ttl - interval:
        return FinetuneLeasePlan(
            LeaseAction.REFRESH,
            target,
            create_job,
            reasons.LEASE_REFRESH,
            f"refreshing GPU lease {state.lease_name} on group {state.group} while the Job runs",
            target - state.ttl + interval,
        )
    return FinetuneLeasePlan(
        LeaseAction.NONE,
        expires,
        create_job,
        reasons.LEASE_CURRENT,
        f"GPU lease {state.lease_name} on group {state.group} is current",
        expires - state.ttl + interval,
    )
