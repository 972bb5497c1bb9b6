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

A status write that fails never holds back the scale-downs that park members: a
refused one (422) is logged once and the rest is written; a conflict decides again on
a fresh read, and once the key's last attempts all conflicted the scale-downs go out
anyway. Scale-ups wait for a decision whose statuses were written (or refused).

Who occupies the card is read from the cluster at every reconcile: pods labelled with
the group (a deleted member's included, until they are gone), and Deployments of
former members that still ask for replicas are scaled to 0. A member whose spec
cannot be read (flexinfer_core.invalid) is left out of the election, its pods still
hold the card, it is scaled to 0 and told why, with one Warning Event and one log
line when that becomes news.

A reconcile that changes nothing writes nothing. The core is given the leases that
were read (a lease whose `expiresAt` does not parse carries its problem) and the
lease sources that could not be listed; when it fails open toward serving, this
module counts every such reconcile, and logs (and Warns on an unreadable lease) when
that changes. The caller arms a timer at the returned `next_change_at`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime

import attrs

from flexinfer_core import (
    ACTIVE_SERVICES_ANNOTATION,
    DEFAULT_POLICY,
    Event,
    GroupDecision,
    InvalidFieldError,
    LeaseSource,
    ModelState,
    Policy,
    Scope,
    SpecProblem,
    decide_group,
    lease_is_active,
    reasons,
    reports_spec_problem,
    spec_problem,
)
from flexinfer_k8s import observe
from flexinfer_k8s.apply import RetryNow
from flexinfer_k8s.cache import live_occupants
from flexinfer_k8s.convert_leases import gpu_lease_from_k8s
from flexinfer_k8s.convert_models import (
    MODEL_CONDITIONS,
    model_state_group,
    model_status,
    unreadable_model_status,
)
from flexinfer_k8s.outcome import (
    RECHECK_AFTER,
    Applied,
    Outcome,
    Refusals,
    Wiring,
    recheck_soon,
    record_events,
)
from flexinfer_k8s.pods import deployment_replicas
from flexinfer_k8s.status_diff import recorded_conditions, status_differs
from flexinfer_kube.kubeapi import JSON, Rejected
from flexinfer_kube.objects import get_path, name_of
from flexinfer_kube.resources import CONFIG_MAPS, GPU_LEASES, MODELS, SERVICES

log = logging.getLogger("flexinfer.shared")


@attrs.frozen
class MemberWrites:
    """What to write for one member: its status patch (None: unchanged), the Events to
    record once that status is written, its Deployment's scale (`replicas_from` None:
    no Deployment) and its Service's `ai.flexinfer/active-services` (None: unchanged)."""

    name: str
    obj: JSON
    status: JSON | None
    events: tuple[Event, ...]
    replicas_from: int | None
    replicas_to: int
    active_services: str | None
    # Why the member's spec cannot be read (flexinfer_core.invalid), said in one log
    # line when its Events are recorded (when that is news).
    unreadable: SpecProblem | None = None

    @property
    def scale_down(self) -> bool:
        return self.replicas_from is not None and self.replicas_to < self.replicas_from

    @property
    def scale_up(self) -> bool:
        return self.replicas_from is not None and self.replicas_to > self.replicas_from


class SharedGroupReconciler:
    def __init__(self, wiring: Wiring, *, policy: Policy = DEFAULT_POLICY) -> None:
        self.wiring = wiring
        self.cache = wiring.cache
        self.writer = wiring.writer
        self.metrics = wiring.metrics
        self.policy = policy
        # Per group: the lease metrics' labels and what was counted as an acquisition,
        # the members whose `member_active` series exist, and what failing open was
        # last logged for (metrics and logs only; no decision reads these).
        self._lease_labels: dict[tuple[str, str], tuple[str, str, str]] = {}
        self._governing: dict[tuple[str, str], tuple[str, str]] = {}
        self._member_series: dict[tuple[str, str], set[str]] = {}
        self._failing_open: dict[tuple[str, str], str] = {}
        self.refusals = Refusals(wiring, kind="shared")

    def reconcile_standalone(self, namespace: str, name: str, *, insist: bool = False) -> Outcome:
        """A Model outside any shared group, decided as a group of one. `insist`: see
        `reconcile_group`."""
        model = self.cache.get(MODELS, namespace, name)
        if model is None or model_state_group(model):
            return Outcome(None, False)
        return self._reconcile(namespace, "", [model], insist=insist)

    def reconcile_group(self, namespace: str, group: str, *, insist: bool = False) -> Outcome:
        """One shared group. `insist`: this key's last attempts all ended in a status
        conflict; write the scale-downs that park members even if one conflicts again."""
        models = self.cache.shared_group_models(namespace, group)
        members = {name_of(m) for m in models}
        released = self._release_former_members(namespace, group, members=members)
        departed = observe.departed_members(self.cache, namespace, group, members=members)
        if not models:
            if not departed:
                self._forget_group(namespace, group)
            # Nothing to decide; look again until the former members' pods are gone.
            return Outcome(self.wiring.clock.now() + RECHECK_AFTER if departed else None, released)
        return self._reconcile(namespace, group, models, departed=departed, insist=insist)

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
        insist: bool = False,
    ) -> Outcome:
        now = self.wiring.clock.now()
        snapshot = observe.shared_group_snapshot(
            self.cache, namespace, group, objs, departed=departed
        )
        states = list(snapshot.states)
        for state in states:
            if reports_spec_problem(state.conditions):
                log.info(
                    "spec readable again",
                    extra={"fields": {"namespace": namespace, "group": group, "model": state.name}},
                )
        # Left out of the election; their pods (in `running`) still hold the card.
        unreadable = [
            self._unreadable(
                member.obj,
                member.error,
                deployment=member.deployment,
                service=member.service,
                group=group,
                now=now,
            )
            for member in snapshot.unreadable
        ]
        decision = decide_group(
            states,
            now=now,
            leases=snapshot.leases,
            unreadable_lease_sources=snapshot.unreadable_lease_sources,
            policy=self.policy,
            running=snapshot.running,
        )
        if group:
            self._report_fail_open(decision, namespace=namespace, group=group, now=now)
            self._record_metrics(
                decision, namespace=namespace, group=group, unreadable=[w.name for w in unreadable]
            )
        writes = [
            *self._decided_writes(decision, observed=states, objs=objs, group=group, now=now),
            *unreadable,
        ]
        applied = self._apply(writes, namespace=namespace, group=group, now=now, insist=insist)
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
                        "unreadable": [w.name for w in unreadable] or None,
                    }
                },
            )
        return Outcome(next_at, applied is not Applied.NOTHING, decision.reason)

    def _decided_writes(
        self,
        decision: GroupDecision,
        *,
        observed: Sequence[ModelState],
        objs: Sequence[JSON],
        group: str,
        now: datetime,
    ) -> list[MemberWrites]:
        """What differs between the members the election decided and the cluster."""
        by_name = {name_of(o): o for o in objs}
        writes = []
        for change in decision.changes(observed):
            obj = by_name[change.name]
            member = decision.member(change.name)
            writes.append(
                MemberWrites(
                    name=change.name,
                    obj=obj,
                    status=model_status(obj, member, group=group, now=now)
                    if change.status
                    else None,
                    events=change.events,
                    replicas_from=change.replicas_from,
                    replicas_to=change.replicas_to,
                    active_services=member.active_services if change.active_services else None,
                )
            )
        return writes

    def _unreadable(
        self,
        obj: JSON,
        error: InvalidFieldError,
        *,
        deployment: JSON | None,
        service: JSON | None,
        group: str,
        now: datetime,
    ) -> MemberWrites:
        """The writes for a Model whose spec cannot be read: told why (once), held at 0,
        and named by no Service as the holder (flexinfer_core.invalid)."""
        name = name_of(obj)
        problem = spec_problem(
            name,
            error,
            recorded=recorded_conditions(obj, MODEL_CONDITIONS),
            condition_types=MODEL_CONDITIONS,
            scope=Scope.MEMBER if group else Scope.ALONE,
        )
        status = unreadable_model_status(obj, problem, group=group, now=now)
        annotations = get_path(service, "metadata", "annotations") or {}
        return MemberWrites(
            name=name,
            obj=obj,
            status=status if status_differs(obj.get("status"), status) else None,
            events=(problem.event,) if problem.event is not None else (),
            replicas_from=deployment_replicas(deployment),
            replicas_to=0,
            active_services=(
                ""
                if service is not None and annotations.get(ACTIVE_SERVICES_ANNOTATION) != ""
                else None
            ),
            unreadable=problem,
        )

    def _apply(
        self,
        writes: Sequence[MemberWrites],
        *,
        namespace: str,
        group: str,
        now: datetime,
        insist: bool,
    ) -> Applied:
        """Write `writes` in the safe order: statuses, scale-downs, their Events, Service
        annotations, then scale-ups after a live check.

        A status write that fails never holds back the scale-downs that park members: a
        refused one (422) is logged once (its Events recorded then, since no status will
        hold them) and the rest is written; a conflict re-reads and decides again first
        (the decision may be stale), and only when the key's last attempts all conflicted
        (`insist`) are the scale-downs written anyway. Scale-ups wait for a decision
        whose statuses were written, or refused.
        """
        applied = Applied.NOTHING
        events: list[tuple[JSON | None, Event]] = []
        stale: RetryNow | None = None

        def record() -> None:
            record_events(
                self.wiring, events, namespace=namespace, group=group, kind="shared", now=now
            )
            events.clear()

        def news(write: MemberWrites) -> None:
            events.extend((write.obj, event) for event in write.events)
            problem = write.unreadable
            if problem is not None and problem.event is not None:
                # Logged when it becomes news, not at every reconcile while it lasts.
                log.warning(
                    "spec cannot be read; the model runs nothing until it is fixed",
                    extra={
                        "fields": {
                            "namespace": namespace,
                            "group": group or None,
                            "model": write.name,
                            "field": problem.field,
                            "message": problem.message,
                        }
                    },
                )

        # 1. status (conditional on the observed resourceVersion), then its Events.
        for write in writes:
            if write.status is None:
                continue
            try:
                written = self.writer.patch_status(MODELS, write.obj, write.status)
            except RetryNow as conflict:
                stale = conflict
                break
            except Rejected as error:
                if self.refusals.refused(MODELS, write.obj, error=error):
                    news(write)  # no status will hold them: said once, here
                continue
            if written is None:
                continue
            self.refusals.accepted(MODELS, write.obj)
            applied = Applied.WROTE
            news(write)
        if stale is not None and not insist:
            record()  # the statuses written so far keep their Events
            raise stale

        # 2. scale-downs.
        for write in writes:
            if write.scale_down and self.writer.scale(namespace, write.name, write.replicas_to):
                applied = Applied.WROTE

        # Events only once their status is written (a retry must not repeat them), and
        # after the scale-downs, which are what frees the card.
        record()
        if stale is not None:
            raise stale  # the rest waits for a decision on a fresh view

        # 3. Service annotations.
        for write in writes:
            if write.active_services is None:
                continue
            if self.cache.get(SERVICES, namespace, write.name) is None:
                continue  # nothing to annotate until the Service exists
            if self.writer.annotate(
                SERVICES,
                namespace,
                write.name,
                {ACTIVE_SERVICES_ANNOTATION: write.active_services},
            ):
                applied = Applied.WROTE

        # 4. scale-ups, after a live check that no other member still has a pod.
        ups = [write for write in writes if write.scale_up]
        if ups:
            occupied = (
                live_occupants(self.wiring.api, namespace, group=group, kind=MODELS.kind)
                if group
                else set()
            )
            for write in ups:
                others = sorted(occupied - {write.name})
                if others:
                    log.info(
                        "scale-up deferred: other members still have pods",
                        extra={
                            "fields": {
                                "namespace": namespace,
                                "group": group,
                                "model": write.name,
                                "occupied": others,
                            }
                        },
                    )
                    applied = Applied.DEFERRED
                    break
                if self.writer.scale(namespace, write.name, write.replicas_to):
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

    # -- metrics and logs ----------------------------------------------------------

    def _report_fail_open(
        self, decision: GroupDecision, *, namespace: str, group: str, now: datetime
    ) -> None:
        """Count every reconcile that failed open; log it, and Warn on a lease that
        cannot be read, only when what it failed open for changes."""
        election = decision.election
        key = (namespace, group)
        for source in election.unreadable_lease_sources:
            self.metrics.lease_read_errors.labels(namespace=namespace, source=source).inc()
        for lease in election.unreadable_leases:
            source = "configmaps" if lease.source is LeaseSource.CONFIG_MAP else "gpuleases"
            self.metrics.lease_read_errors.labels(namespace=namespace, source=source).inc()
        why = "; ".join(
            [*election.unreadable_lease_sources, *(x.problem for x in election.unreadable_leases)]
        )
        if self._failing_open.get(key, "") == why:
            return
        if why:
            self._failing_open[key] = why
            log.warning(
                "GPU leases unreadable; failing open toward serving",
                extra={
                    "fields": {
                        "namespace": namespace,
                        "group": group,
                        "sources": election.unreadable_lease_sources or None,
                        "leases": [x.name for x in election.unreadable_leases] or None,
                        "message": election.message,
                    }
                },
            )
            for lease in election.unreadable_leases:
                carrier = self.cache.get(
                    CONFIG_MAPS if lease.source is LeaseSource.CONFIG_MAP else GPU_LEASES,
                    namespace,
                    lease.name,
                )
                if carrier is not None:
                    self.writer.event(
                        carrier,
                        reason=reasons.GPU_LEASE_UNREADABLE,
                        message=f"{lease.problem}; group {group} does not treat this lease as "
                        "held (fail open toward serving) until it can be read",
                        type="Warning",
                        now=now,
                    )
        else:
            del self._failing_open[key]
            log.info(
                "GPU leases readable again",
                extra={"fields": {"namespace": namespace, "group": group}},
            )

    def _record_metrics(
        self,
        decision: GroupDecision,
        *,
        namespace: str,
        group: str,
        unreadable: Sequence[str] = (),
    ) -> None:
        key = (namespace, group)
        members = {m.name for m in decision.members} | set(unreadable)
        for member in decision.members:
            self.metrics.member_active.labels(
                namespace=namespace, group=group, model=member.name
            ).set(1 if member.is_leader else 0)
        for name in unreadable:
            self.metrics.member_active.labels(namespace=namespace, group=group, model=name).set(0)
        # A deleted (or departed) member's series goes with it: left at 1, a group would
        # read two holders.
        for gone in self._member_series.get(key, set()) - members:
            self.metrics.member_active.remove(namespace, group, gone)
        self._member_series[key] = members

        lease = decision.election.lease
        previous = self._lease_labels.get(key)
        labels = (group, namespace, lease.owner or lease.name) if lease is not None else None
        if previous is not None and previous != labels:
            # A past holder's series go: they would otherwise pile up, one per owner.
            self.metrics.lease_active.remove(*previous)
            self.metrics.lease_acquired.remove(*previous)
            del self._lease_labels[key]
        if lease is None or labels is None:
            self._governing.pop(key, None)
            return
        self.metrics.lease_active.labels(*labels).set(1)
        self._lease_labels[key] = labels
        # A new lease, or the same one whose owner was changed in place, is taken anew.
        holder = (lease.name, lease.owner)
        if self._governing.get(key) != holder:
            self._governing[key] = holder
            self.metrics.lease_acquired.labels(*labels).inc()

    def _forget_group(self, namespace: str, group: str) -> None:
        key = (namespace, group)
        previous = self._lease_labels.pop(key, None)
        if previous is not None:
            self.metrics.lease_active.remove(*previous)
            self.metrics.lease_acquired.remove(*previous)
        self._governing.pop(key, None)
        for gone in self._member_series.pop(key, set()):
            self.metrics.member_active.remove(namespace, group, gone)
        self._failing_open.pop(key, None)
