"""Reconcile one shared group (or one standalone Model): snapshot, decide, apply the diff.

Observe from the cache (Models, their Deployments, Pods and Services, leases),
call `flexinfer_core.decide_group` with `now` from the clock, then write exactly
what `GroupDecision.changes` says differs, nothing it does not:

1. Model status through the status subresource (a status write records a
   preemption, so it comes before the scale-down that makes the phase unreadable);
2. scale-downs through `deployments/scale`, then the Events of the written statuses;
3. the `ai.flexinfer/active-services` annotation on each member's Service;
4. scale-ups, only after a *live* Pod list (not the cache), selected by the group
   label every rendered pod carries, confirms no other member of the group, present
   or deleted, has a pod left — break-before-make must not rest on a watch that is a
   few milliseconds behind, nor on a memory of deletions a restart would lose.

Who occupies the card is read from the cluster at every reconcile: pods labelled with
the group (a deleted member's included, until they are gone), and Deployments of
former members that still ask for replicas are scaled to 0.

A reconcile that changes nothing writes nothing. The core is given the leases that
were read and the lease sources that could not be listed; when it fails open toward
serving, this module logs and counts it. The caller arms a timer at the returned
`next_change_at`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime

from flexinfer_core import (
    ACTIVE_SERVICES_ANNOTATION,
    DEFAULT_POLICY,
    Event,
    GroupDecision,
    ModelState,
    Policy,
    decide_group,
    lease_is_active,
)
from flexinfer_k8s import observe
from flexinfer_k8s.apply import RetryNow
from flexinfer_k8s.cache import live_occupants
from flexinfer_k8s.convert_leases import gpu_lease_from_k8s
from flexinfer_k8s.convert_models import (
    model_state_group,
    model_status,
)
from flexinfer_k8s.outcome import (
    RECHECK_AFTER,
    Applied,
    Outcome,
    Wiring,
    recheck_soon,
    record_events,
)
from flexinfer_k8s.pods import deployment_replicas
from flexinfer_k8s.status_diff import status_differs
from flexinfer_kube.kubeapi import JSON
from flexinfer_kube.objects import name_of
from flexinfer_kube.resources import GPU_LEASES, MODELS, SERVICES

log = logging.getLogger("flexinfer.shared")


class SharedGroupReconciler:
    def __init__(self, wiring: Wiring, *, policy: Policy = DEFAULT_POLICY) -> None:
        self.wiring = wiring
        self.cache = wiring.cache
        self.writer = wiring.writer
        self.metrics = wiring.metrics
        self.policy = policy
        self._lease_labels: dict[tuple[str, str], tuple[str, str, str]] = {}
        self._governing: dict[tuple[str, str], str] = {}

    def reconcile_standalone(self, namespace: str, name: str) -> Outcome:
        model = self.cache.get(MODELS, namespace, name)
        if model is None or model_state_group(model):
            return Outcome(None, False)
        return self._reconcile(namespace, "", [model])

    def reconcile_group(self, namespace: str, group: str) -> Outcome:
        models = self.cache.shared_group_models(namespace, group)
        members = {name_of(m) for m in models}
        released = self._release_former_members(namespace, group, members=members)
        departed = observe.departed_members(self.cache, namespace, group, members=members)
        if not models:
            if not departed:
                self._forget_group(namespace, group)
            # Nothing to decide; look again until the former members' pods are gone.
            return Outcome(self.wiring.clock.now() + RECHECK_AFTER if departed else None, released)
        return self._reconcile(namespace, group, models, departed=departed)

    def _release_former_members(self, namespace: str, group: str, *, members: set[str]) -> bool:
        """Scale to 0 the Deployments whose pods carry the group's label but whose Model
        is no longer a member (deleted, or moved to another group) and that still ask
        for pods: until their pods are gone they hold the card."""
        wrote = False
        for deployment in self.cache.group_deployments(namespace, group=group, kind=MODELS.kind):
            name = name_of(deployment)
            if name not in members and (deployment_replicas(deployment) or 0) > 0:
                wrote = self.writer.scale(namespace, name, 0) or wrote
        return wrote

    # -- the reconcile ----------------------------------------------------------------

    def _reconcile(
        self,
        namespace: str,
        group: str,
        objs: list[JSON],
        *,
        departed: AbstractSet[str] = frozenset(),
    ) -> Outcome:
        now = self.wiring.clock.now()
        snapshot = observe.shared_group_snapshot(
            self.cache, namespace, group, objs, departed=departed
        )
        states = list(snapshot.states)
        decision = decide_group(
            states,
            now=now,
            leases=snapshot.leases,
            unreadable_lease_sources=snapshot.unreadable_lease_sources,
            policy=self.policy,
            running=snapshot.running,
        )
        failed_open = decision.election.unreadable_lease_sources
        if failed_open:
            for source in failed_open:
                self.metrics.lease_read_errors.labels(namespace=namespace, source=source).inc()
            log.warning(
                "GPU leases unreadable; failing open toward serving",
                extra={"fields": {"namespace": namespace, "group": group, "sources": failed_open}},
            )
        if group:
            self._record_metrics(decision, namespace=namespace, group=group)
        applied = self._apply(
            decision,
            observed=states,
            objs={name_of(o): o for o in objs},
            namespace=namespace,
            group=group,
            now=now,
        )
        if (
            group
            and self._write_lease_statuses(namespace, group, now=now)
            and applied is Applied.NOTHING
        ):
            applied = Applied.WROTE
        next_at = decision.next_change_at
        if applied is Applied.DEFERRED:
            next_at = recheck_soon(next_at, now=now)
        if applied is not Applied.NOTHING:
            log.info(
                "applied decision",
                extra={
                    "fields": {
                        "namespace": namespace,
                        "group": group or None,
                        "leader": decision.leader,
                        "reason": decision.reason,
                        "message": decision.message,
                        "members": {
                            m.name: {
                                "state": m.state.value,
                                "phase": m.phase.value,
                                "replicas": m.desired_replicas,
                                "reason": m.reason,
                            }
                            for m in decision.members
                        },
                    }
                },
            )
        return Outcome(next_at, applied is not Applied.NOTHING, decision.reason)

    def _apply(
        self,
        decision: GroupDecision,
        *,
        observed: Sequence[ModelState],
        objs: Mapping[str, JSON],
        namespace: str,
        group: str,
        now: datetime,
    ) -> Applied:
        """Write exactly what `decision.changes(observed)` names, in the safe order."""
        changes = decision.changes(observed)
        applied = Applied.NOTHING
        events: list[tuple[JSON | None, Event]] = []

        def record() -> None:
            record_events(
                self.wiring, events, namespace=namespace, group=group, kind="shared", now=now
            )
            events.clear()

        # 1. status (conditional on the observed resourceVersion), then its Events.
        for change in changes:
            if not change.status:
                continue
            obj = objs[change.name]
            status = model_status(obj, decision.member(change.name), group=group, now=now)
            try:
                written = self.writer.patch_status(MODELS, obj, status)
            except RetryNow:
                record()  # the statuses written so far keep their Events
                raise
            if written is None:
                continue
            applied = Applied.WROTE
            events.extend((obj, event) for event in change.events)

        # 2. scale-downs.
        for change in changes:
            if change.scale_down and self.writer.scale(namespace, change.name, change.replicas_to):
                applied = Applied.WROTE

        # Events only once their status is written (a retry must not repeat them), and
        # after the scale-downs, which are what frees the card.
        record()

        # 3. Service annotations.
        for change in changes:
            if not change.active_services:
                continue
            if self.cache.get(SERVICES, namespace, change.name) is None:
                continue  # nothing to annotate until the Service exists
            services = decision.member(change.name).active_services
            if self.writer.annotate(
                SERVICES, namespace, change.name, {ACTIVE_SERVICES_ANNOTATION: services}
            ):
                applied = Applied.WROTE

        # 4. scale-ups, after a live check that no other member still has a pod.
        ups = [change for change in changes if change.scale_up]
        if ups:
            occupied = (
                live_occupants(self.wiring.api, namespace, group=group, kind=MODELS.kind)
                if group
                else set()
            )
            for change in ups:
                others = sorted(occupied - {change.name})
                if others:
                    log.info(
                        "scale-up deferred: other members still have pods",
                        extra={
                            "fields": {
                                "namespace": namespace,
                                "group": group,
                                "model": change.name,
                                "occupied": others,
                            }
                        },
                    )
                    return Applied.DEFERRED
                if self.writer.scale(namespace, change.name, change.replicas_to):
                    applied = Applied.WROTE
        return applied

    def _write_lease_statuses(self, namespace: str, group: str, *, now: datetime) -> bool:
        """GPULease `status.active`/`acquiredAt` for people; decisions never read them.

        A lease's expiry takes effect at once through the timer; turning `active`
        false afterwards is bookkeeping, not what parks or frees the group.
        """
        wrote = False
        for obj in self.cache.objects(GPU_LEASES, namespace):
            lease = gpu_lease_from_k8s(obj)
            if lease is None or lease.group != group:
                continue
            status = obj.get("status") or {}
            wanted = {
                "active": lease_is_active(lease, now),
                "acquiredAt": status.get("acquiredAt")
                or (obj.get("metadata") or {}).get("creationTimestamp"),
            }
            if status_differs(status, wanted):
                wrote = self.writer.patch_status(GPU_LEASES, obj, wanted) is not None or wrote
        return wrote

    # -- metrics ----------------------------------------------------------------------

    def _record_metrics(self, decision: GroupDecision, *, namespace: str, group: str) -> None:
        for member in decision.members:
            self.metrics.member_active.labels(
                namespace=namespace, group=group, model=member.name
            ).set(1 if member.is_leader else 0)
        key = (namespace, group)
        lease = decision.election.lease
        previous = self._lease_labels.get(key)
        if lease is not None:
            labels = (group, namespace, lease.owner or lease.name)
            if previous is not None and previous != labels:
                self.metrics.lease_active.labels(*previous).set(0)
            self.metrics.lease_active.labels(*labels).set(1)
            self._lease_labels[key] = labels
            if self._governing.get(key) != lease.name:
                self._governing[key] = lease.name
                self.metrics.lease_acquired.labels(*labels).inc()
        else:
            if previous is not None:
                self.metrics.lease_active.labels(*previous).set(0)
                del self._lease_labels[key]
            self._governing.pop(key, None)

    def _forget_group(self, namespace: str, group: str) -> None:
        previous = self._lease_labels.pop((namespace, group), None)
        if previous is not None:
            self.metrics.lease_active.labels(*previous).set(0)
        self._governing.pop((namespace, group), None)
