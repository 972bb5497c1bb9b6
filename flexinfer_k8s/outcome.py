"""What every reconciler is built from and what it hands back to the controller.

`Wiring` bundles the collaborators each reconciler uses (the informer cache, the
writer, the API client for live reads, metrics and the clock); `Outcome` is a
reconcile's result (when to look again, whether it wrote, the deciding reason);
`Applied` says how applying a decision went. `record_events` writes a decision's
Events and counts the swaps and preemptions among them; `Refusals` remembers which
status writes the API server refused, so that each is logged (and its Events
recorded) once rather than at every reconcile. No decisions here.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from flexinfer_core import Event, reasons
from flexinfer_k8s.apply import Writer
from flexinfer_k8s.cache import ClusterCache
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_kube.clock import Clock
from flexinfer_kube.kubeapi import KubeApi, Rejected
from flexinfer_kube.objects import name_of, namespace_of
from flexinfer_kube.resources import Resource

log = logging.getLogger("flexinfer.outcome")

# How soon to look again after a scale-up was held back for pods the cache had not
# seen go (or come): long enough for a watch event, short enough not to delay.
RECHECK_AFTER = timedelta(milliseconds=500)

# Event reasons that mean a member lost the card (counted as preemptions).
EVICTION_REASONS = frozenset({reasons.PREEMPTED, reasons.GPU_LEASE_HELD})
# Event reasons that mean a group changed hands (counted as swaps), by kind of group: a
# shared group's handover has one Event, `Preempted` on the member that was serving or,
# when none was, `Promoted` on the new holder; a GPUGroup's is `Swap` or `Start` on it
# (its `Preempted` on the displaced member goes with that one).
SWAP_REASONS = {
    "shared": frozenset({reasons.PROMOTED, reasons.PREEMPTED}),
    "gpugroup": frozenset({reasons.SWAP, reasons.START}),
}


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
        if event.reason in SWAP_REASONS.get(kind, ()):
            wiring.metrics.swaps.labels(namespace=namespace, group=group, kind=kind).inc()


class Refusals:
    """Status writes the API server refused (422), per object, until one is accepted.

    Retrying a refused write changes nothing until the object does (which queues its key
    anyway), so a refusal is not a reconcile failure: the rest of the decision is
    written and the key's timer armed as usual. What it must not do is repeat itself:
    `refused` counts every refusal but says True (log it, record the write's Events)
    only for a new one, e.g. an object whose stored spec the real CRD no longer accepts
    refuses every status write, and its Events are then the only place the user reads
    why.
    """

    def __init__(self, wiring: Wiring, *, kind: str) -> None:
        self._metrics = wiring.metrics
        self._kind = kind
        self._said: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()

    def refused(self, resource: Resource, obj: Mapping[str, Any], *, error: Rejected) -> bool:
        """Count the refusal; True (and one log line) when it is news for this object."""
        self._metrics.reconcile_errors.labels(kind=self._kind, error="Rejected").inc()
        key = (resource.plural, namespace_of(obj), name_of(obj))
        with self._lock:
            if self._said.get(key) == str(error):
                return False
            self._said[key] = str(error)
        log.warning(
            "status write refused; the rest is written",
            extra={
                "fields": {
                    "kind": resource.kind,
                    "namespace": key[1],
                    "name": key[2],
                    "error": str(error),
                }
            },
        )
        return True

    def accepted(self, resource: Resource, obj: Mapping[str, Any]) -> None:
        """A status write of this object went through: a later refusal is news again."""
        with self._lock:
            self._said.pop((resource.plural, namespace_of(obj), name_of(obj)), None)
