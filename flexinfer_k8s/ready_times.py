"""How long a model's pods took to serve, read from the cluster's own timestamps.

For every pod of a model that is Ready, once: the *cold start*
(`flexinfer_cold_start_seconds`) is its Ready condition's `lastTransitionTime` less
its `metadata.creationTimestamp`; the *swap* (`flexinfer_swap_seconds`) is the same
Ready instant less the moment the model was handed the card, when that handover
came before the pod was created (the pod was made for it): a Model's `Active`
condition's `lastTransitionTime`, a GPUGroup's `status.lastSwapTime`. The handover
follows the demand the proxy wrote by one reconcile, so the swap is the demand →
Ready time within that (docs/operations.md). Timestamps have the API server's
one-second resolution.

Pods whose Ready transition came before this controller started are not observed
(a restarted controller would count them twice); which pods were observed is the
one thing remembered, a bounded set of uids. This module records; it decides
nothing and writes nothing to the cluster.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_kube.objects import get_path

# Uids of pods already observed, oldest forgotten first: far more than a cluster's
# model pods turn over between two reconciles of their group.
KEPT_UIDS = 4096


def condition_since(obj: Mapping[str, Any], kind: str) -> datetime | None:
    """When the object's condition `kind` last turned True (None: it is not True)."""
    for condition in get_path(obj, "status", "conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return parse_rfc3339(condition.get("lastTransitionTime"))
    return None


class ReadyTimes:
    def __init__(self, metrics: ControllerMetrics, *, since: datetime) -> None:
        self._metrics = metrics
        self._since = since
        self._seen: OrderedDict[str, None] = OrderedDict()

    def pods_seen(
        self,
        pods: Iterable[Mapping[str, Any]],
        *,
        namespace: str,
        model: str,
        handed_over_at: datetime | None,
    ) -> None:
        """Observe each Ready pod of `model` not observed before."""
        for pod in pods:
            uid = str(get_path(pod, "metadata", "uid") or "")
            ready_at = condition_since(pod, "Ready")
            if not uid or ready_at is None or uid in self._seen:
                continue
            self._seen[uid] = None
            if len(self._seen) > KEPT_UIDS:
                self._seen.popitem(last=False)
            created = parse_rfc3339(get_path(pod, "metadata", "creationTimestamp"))
            if created is None or ready_at < self._since:
                continue
            labels = {"namespace": namespace, "model": model}
            cold = (ready_at - created).total_seconds()
            self._metrics.cold_start_seconds.labels(**labels).observe(max(0.0, cold))
            if handed_over_at is not None and handed_over_at <= created:
                swap = (ready_at - handed_over_at).total_seconds()
                self._metrics.swap_seconds.labels(**labels).observe(swap)
