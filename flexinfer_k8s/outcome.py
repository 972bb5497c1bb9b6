"""What every reconciler is built from and what it hands back to the controller.

`Wiring` bundles the collaborators each reconciler uses (the informer cache, the
writer, the API client for live reads, metrics and the clock); `Outcome` is a
reconcile's result (when to look again, whether it wrote, the deciding reason);
`Applied` says how applying a decision went. `record_events` writes a decision's
Events and counts the swaps and preemptions among them. No decisions here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from flexinfer_core import Event, reasons
from flexinfer_k8s.apply import Writer
from flexinfer_k8s.cache import ClusterCache
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_kube.clock import Clock
from flexinfer_kube.kubeapi import KubeApi

# How soon to look again after a scale-up was held back for pods the cache had not
# seen go (or come): long enough for a watch event, short enough not to delay.
RECHECK_AFTER = timedelta(milliseconds=500)

# Event reasons that mean a member lost the card (counted as preemptions).
EVICTION_REASONS = frozenset({reasons.PREEMPTED, reasons.GPU_LEASE_HELD})
# Event reasons that mean a member (or a GPUGroup) changed hands (counted as swaps).
SWAP_REASONS = frozenset({reasons.PROMOTED, reasons.SWAP, reasons.START})


@attrs.frozen
class Wiring:
    """The collaborators every reconciler is built from."""

    cache: ClusterCache
    writer: Writer
    api: KubeApi
    metrics: ControllerMetrics
    clock: Clock


@attrs.frozen
class Outcome:
    """A reconcile's result: the timer to arm, whether it wrote, and why."""

    next_change_at: datetime | None
    wrote: bool
    reason: str = ""


class Applied(enum.Enum):
    """How applying one decision went."""

    NOTHING = "nothing"  # the cluster already said what the decision says
    WROTE = "wrote"
    # Wrote what it could; a scale-up waits for another member's pods to be gone.
    DEFERRED = "deferred"


def recheck_soon(next_change_at: datetime | None, *, now: datetime) -> datetime:
    """`next_change_at`, or sooner: a deferred scale-up is looked at again shortly."""
    recheck = now + RECHECK_AFTER
    return recheck if next_change_at is None else min(next_change_at, recheck)


def record_events(
    wiring: Wiring,
    events: Iterable[tuple[Mapping[str, Any] | None, Event]],
    *,
    namespace: str,
    group: str,
    kind: str,
    now: datetime,
) -> None:
    """Write each (involved object, Event) and count the group's swaps and preemptions.

    An Event whose object is gone (None) is counted but not written. `kind` labels the
    swap counter (`shared` or `gpugroup`); outside a group (a Model of its own)
    nothing is counted.
    """
    for involved, event in events:
        if involved is not None:
            wiring.writer.event(
                involved, reason=event.reason, message=event.message, type=event.type, now=now
            )
        if not group:
            continue
        if event.reason in EVICTION_REASONS:
            wiring.metrics.preemptions.labels(
                namespace=namespace, group=group, reason=event.reason
            ).inc()
        if event.reason in SWAP_REASONS:
            wiring.metrics.swaps.labels(namespace=namespace, group=group, kind=kind).inc()
