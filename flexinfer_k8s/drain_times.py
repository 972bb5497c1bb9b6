"""How long a replaced holder drained before it was scaled to 0, once per drain.

`flexinfer_drain_seconds{namespace,model,outcome}` (docs/controller.md): from the
drain's start as the cluster records it — a Model's `status.sharedGroup.drainingSince`,
a GPUGroup's `status.lastSwapTime` for a member kept up to drain — to the reconcile
whose decision scales the member to 0 (its count reached 0, its report went stale, or
the deadline passed), the instant that decision writes as the member's `preemptedAt`
(shared groups) or its scale-down (GPUGroups). `outcome` is `deadline` when that
instant is at or past the drain's deadline, else `drained`. A drain the election
ends by changing its mind (the drainer holds the card again) was not a drain that
ended in a scale-down and is not observed.

The drain's start is read from the cluster, so a controller restarted mid-drain
measures the same drain; which drains were observed (namespace, model, start) is the
one thing remembered, a bounded set, so a decision applied twice (a status conflict,
a retry) counts once. This module records; it decides nothing and writes nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime

from flexinfer_k8s.metrics import ControllerMetrics

# Drains already observed, oldest forgotten first: far more than a cluster's models
# drain between two reconciles of their group.
KEPT_DRAINS = 4096


class DrainTimes:
    def __init__(self, metrics: ControllerMetrics) -> None:
        self._metrics = metrics
        self._seen: OrderedDict[tuple[str, str, datetime], None] = OrderedDict()

    def drain_ended(
        self,
        *,
        namespace: str,
        model: str,
        since: datetime,
        deadline: datetime,
        ended: datetime,
    ) -> None:
        """Observe the drain of `model` that began at `since`, unless already observed."""
        key = (namespace, model, since)
        if key in self._seen:
            return
        self._seen[key] = None
        if len(self._seen) > KEPT_DRAINS:
            self._seen.popitem(last=False)
        outcome = "deadline" if ended >= deadline else "drained"
        self._metrics.drain_seconds.labels(
            namespace=namespace, model=model, outcome=outcome
        ).observe(max(0.0, (ended - since).total_seconds()))
