"""Reconcile one shared group (or one standalone Model): snapshot, decide, apply the diff.

Observe from the cache (Models, their Deployments, Pods and Services, leases),
call `flexinfer_core.decide_group` with `now` from the clock, then write exactly
what `GroupDecision.changes` says differs, nothing it does not, through the one
ordered apply (`flexinfer_k8s.write_plan`): Model statuses, scale-downs, their
Events, then scale-ups after a *live* Pod list, selected by the group label every
rendered pod carries, confirms no other member of the group, present or deleted, has
a pod left.

A holder's progress toward serving (`MemberChanges.progress`: taking the card from a
member the same decision evicts, then its phase among Idle, Preempted, Pending and
Loading, and the reason that goes with it) is written once it has waited `coalesce`
(or at once with the next change that is news, e.g. Ready), so a swap whose pods
start quickly writes its new holder once, Ready, rather than at every step; once its
status says it holds the card on its way (`flexinfer_core.group.shown_on_its_way`),
its later steps wait `later_steps_wait(coalesce)` (six times as long), so a slow swap
writes it twice, its takeover and Ready. The key's timer is armed for when it is due.
Until a held takeover is written, the evicted member's status names the holder, which
the election reads as `Active` (`flexinfer_core.group.handed_over`), and the new
holder's `Active` condition, when written, says it turned at the eviction: nothing of
it lives only in memory.

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
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime, timedelta

import attrs

from flexinfer_core import (
    DEFAULT_POLICY,
    GroupDecision,
    LeaseSource,
    MemberDecision,
    ModelState,
    Phase,
    Policy,
    Scope,
    decide_group,
    lease_is_active,
    reasons,
    reports_spec_problem,
    spec_problem,
)
from flexinfer_core.group import handed_over, shown_on_its_way
from flexinfer_core.packing import group_budget
from flexinfer_k8s import observe
from flexinfer_k8s.convert_leases import gpu_lease_from_k8s
from flexinfer_k8s.convert_models import (
    MODEL_CONDITIONS,
    model_state_group,
    model_status,
    unreadable_model_status,
)
from flexinfer_k8s.drain_times import DrainTimes
from flexinfer_k8s.outcome import (
    RECHECK_AFTER,
    Applied,
    Outcome,
    Refusals,
    Wiring,
    recheck_soon,
)
from flexinfer_k8s.pods import deployment_replicas
from flexinfer_k8s.ready_times import ReadyTimes, condition_since
from flexinfer_k8s.shared_card import cannot_share
from flexinfer_k8s.status_diff import recorded_conditions, status_differs
from flexinfer_k8s.write_plan import Interlock, Scale, StatusWrite, WritePlan, apply_plan
from flexinfer_kube.kubeapi import JSON
from flexinfer_kube.objects import get_path, name_of
from flexinfer_kube.resources import CONFIG_MAPS, GPU_LEASES, MODELS

log = logging.getLogger("flexinfer.shared")


# How long a holder's progress toward serving may wait to be written (docs/controller.md).
DEFAULT_COALESCE = timedelta(seconds=5)
# Once its status says it holds the card on its way to serving (`shown_on_its_way`), how
# many times as long its later steps may wait, and never longer than a minute: a status
# lagging its pods by more would mislead more than it saves.
LATER_STEPS_STRETCH = 6
MAX_LATER_STEPS_WAIT = timedelta(seconds=60)


def later_steps_wait(coalesce: timedelta) -> timedelta:
    """How long a holder's later step toward serving may wait to be written, once its
    status says it holds the card (`coalesce` times `LATER_STEPS_STRETCH`, at most
    `MAX_LATER_STEPS_WAIT`, never less than `coalesce`)."""
    return max(coalesce, min(coalesce * LATER_STEPS_STRETCH, MAX_LATER_STEPS_WAIT))


class SharedGroupReconciler:
    def __init__(
        self,
        wiring: Wiring,
        *,
        policy: Policy = DEFAULT_POLICY,
        coalesce: timedelta = DEFAULT_COALESCE,
        shared_card: bool = False,
        device_class: str = "",
    ) -> None:
        self.wiring = wiring
        # Whether members' pods can share one card (docs/election.md 1.7): without, a
        # group with a VRAM budget runs one member at a time, as without one.
        self.shared_card = shared_card
        # The DRA device class the card's claim names (`--gpu-device-class`).
        self.device_class = device_class
        self.cache = wiring.cache
        self.writer = wiring.writer
        self.metrics = wiring.metrics
        self.policy = policy
        self.coalesce = coalesce
        self.later_wait = later_steps_wait(coalesce)
        # Per group: the lease metrics' labels and what was counted as an acquisition,
        # the members whose `member_active` series exist, and what failing open was
        # last logged for (metrics and logs only; no decision reads these).
        self._lease_labels: dict[tuple[str, str], tuple[str, str, str]] = {}
        self._governing: dict[tuple[str, str], tuple[str, str]] = {}
        self._member_series: dict[tuple[str, str], set[str]] = {}
        self._failing_open: dict[tuple[str, str], str] = {}
        # Per key (namespace, group, and the Model's name when it is alone): since when
        # each member's status has differed only in progress (a takeover: since the
        # eviction, as stored). Only that key's reconcile reads or replaces its entry
        # (never one key twice at once); a restart forgets it, which delays such a
        # write by at most its wait again.
        self._progress_since: dict[tuple[str, str, str], dict[str, datetime]] = {}
        self.refusals = Refusals(wiring, kind="shared")
        self.ready_times = ReadyTimes(wiring.metrics, since=wiring.clock.now())
        self.drain_times = DrainTimes(wiring.metrics)

    def reconcile_standalone(self, namespace: str, name: str, *, insist: bool = False) -> Outcome:
        """A Model outside any shared group, decided as a group of one. `insist`: see
        `reconcile_group`."""
        model = self.cache.get(MODELS, namespace, name)
        if model is None or model_state_group(model):
            self._progress_since.pop((namespace, "", name), None)
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
        key = (namespace, group, "" if group else name_of(objs[0]))
        # A new holder whose status is not written yet, and when it was handed the card
        # (a stamp from the future read as now, as the election reads it).
        handover = handed_over(states)
        taking = {handover[0]: min(handover[1], now)} if handover is not None else {}
        self._observe_ready_times(namespace, objs, taking=taking)
        for state in states:
            if reports_spec_problem(state.conditions):
                log.info(
                    "spec readable again",
                    extra={"fields": {"namespace": namespace, "group": group, "model": state.name}},
                )
        if group and self.shared_card:
            states = self._sharing(states, objs)
        decision = decide_group(
            states,
            now=now,
            leases=snapshot.leases,
            unreadable_lease_sources=snapshot.unreadable_lease_sources,
            policy=self.policy,
            running=snapshot.running,
            shared_card=self.shared_card,
        )
        self._observe_drains(namespace, states, decision, now=now)
        # Left out of the election; their pods (in `running`) still hold the card.
        unreadable = [name_of(member.obj) for member in snapshot.unreadable]
        if group:
            self._report_fail_open(decision, namespace=namespace, group=group, now=now)
            self._record_metrics(decision, namespace=namespace, group=group, unreadable=unreadable)
        plan = WritePlan(
            namespace=namespace,
            group=group,
            kind="shared",
            interlock=self._interlock(group, states),
        )
        plan, held_until = self._decided(
            plan,
            decision,
            key=key,
            observed=states,
            objs=objs,
            taking=taking,
            nodes=snapshot.serving_nodes,
            now=now,
        )
        for member in snapshot.unreadable:
            plan = self._unreadable(plan, member, group=group, now=now)
        applied = apply_plan(self.wiring, self.refusals, plan, now=now, insist=insist)
        if (
            group
            and self._write_lease_statuses(namespace, group, now=now)
            and applied is Applied.NOTHING
        ):
            applied = Applied.WROTE
        next_at = decision.next_change_at
        if held_until is not None:
            next_at = held_until if next_at is None else min(next_at, held_until)
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
                        "unreadable": unreadable or None,
                    }
                },
            )
        return Outcome(next_at, applied is not Applied.NOTHING, decision.reason)

    def _sharing(self, states: list[ModelState], objs: Sequence[JSON]) -> list[ModelState]:
        """`states`, with the footprint of a member whose pods cannot share the group's
        claim (`shared_card.cannot_share`: not one AMD GPU) unknown: it takes the whole
        card, as docs/election.md 1.7 says of an unknown footprint."""
        by_name = {name_of(o): o for o in objs}
        return [
            attrs.evolve(state, vram_estimate=None)
            if state.vram_estimate is not None
            and cannot_share(by_name[state.name], self.device_class)
            else state
            for state in states
        ]

    def _interlock(self, group: str, states: Sequence[ModelState]) -> Interlock:
        """What a scale-up checks in the live pod list (write_plan.Interlock): with a
        shared card and an agreed budget, the footprints of every member with live pods
        plus its own must fit; otherwise no other member may have pods."""
        if not group or not self.shared_card:
            return Interlock(group=group, kind=MODELS.kind)
        return Interlock(
            group=group,
            kind=MODELS.kind,
            budget=group_budget(states).size,
            footprints=tuple(
                sorted((s.name, s.vram_estimate) for s in states if s.vram_estimate is not None)
            ),
        )

    def _decided(
        self,
        plan: WritePlan,
        decision: GroupDecision,
        *,
        key: tuple[str, str, str],
        observed: Sequence[ModelState],
        objs: Sequence[JSON],
        taking: dict[str, datetime],
        nodes: Mapping[str, str],
        now: datetime,
    ) -> tuple[WritePlan, datetime | None]:
        """`plan` with what differs between the members the election decided and the
        cluster (`observed`, as stored), and until when a status that differs only in
        progress is held back (None: nothing is). `taking`: the member handed the card
        whose status does not say so yet (`handed_over`), with when.

        Every status written names the node of the member's Ready pod when it has one
        (`nodes`), so a model turning Ready says where with no write of its own; a
        serving member whose status names another node, or none (written by an older
        controller), gets one write for it."""
        by_name = {name_of(o): o for o in objs}
        statuses: list[StatusWrite] = []
        scales: list[Scale] = []
        since = self._progress_since.get(key, {})
        waiting: dict[str, datetime] = {}
        held_until: datetime | None = None
        changes = decision.changes(observed)
        stored = {state.name: state for state in observed}

        def status_body(member: MemberDecision) -> JSON:
            return model_status(
                by_name[member.name],
                member,
                group=plan.group,
                now=now,
                packed=decision.packed_status(member.name),
                handed_over_at=taking.get(member.name),
                node=nodes.get(member.name),
            )

        statused = {change.name for change in changes if change.status}
        for member in decision.members:
            node = nodes.get(member.name)
            recorded = get_path(by_name[member.name], "status", "nodeName")
            if node is not None and node != recorded and member.name not in statused:
                statuses.append(StatusWrite(MODELS, by_name[member.name], status_body(member)))
        for change in changes:
            obj = by_name[change.name]
            member = decision.member(change.name)
            write = change.status
            if write and change.progress and self.coalesce > timedelta(0):
                waiting[change.name] = taking.get(change.name) or since.get(change.name, now)
                # Its first step (taking the card) within the window; once its status
                # says it holds the card, its later steps may wait longer.
                wait = (
                    self.later_wait if shown_on_its_way(stored[change.name]) else self.coalesce
                )
                due = waiting[change.name] + wait
                if now < due:
                    write = False
                    held_until = due if held_until is None else min(held_until, due)
            if write:
                statuses.append(
                    StatusWrite(
                        MODELS,
                        obj,
                        status_body(member),
                        events=tuple((obj, event) for event in change.events),
                    )
                )
            if change.replicas and change.replicas_from is not None:
                scales.append(Scale(change.name, change.replicas_from, change.replicas_to))
        if waiting:
            self._progress_since[key] = waiting
        else:
            self._progress_since.pop(key, None)
        plan = attrs.evolve(
            plan, statuses=(*plan.statuses, *statuses), scales=(*plan.scales, *scales)
        )
        return plan, held_until

    def _unreadable(
        self, plan: WritePlan, member: observe.UnreadableModel, *, group: str, now: datetime
    ) -> WritePlan:
        """`plan` with the writes for a Model whose spec cannot be read: told why (once),
        held at 0, and out of the queue (flexinfer_core.invalid)."""
        obj = member.obj
        problem = spec_problem(
            name_of(obj),
            member.error,
            recorded=recorded_conditions(obj, MODEL_CONDITIONS),
            condition_types=MODEL_CONDITIONS,
            scope=Scope.MEMBER if group else Scope.ALONE,
        )
        status = unreadable_model_status(obj, problem, group=group, now=now)
        statuses = plan.statuses
        if status_differs(obj.get("status"), status):
            events = ((obj, problem.event),) if problem.event is not None else ()
            statuses = (*statuses, StatusWrite(MODELS, obj, status, events, problem=problem))
        replicas = deployment_replicas(member.deployment)
        scales = plan.scales
        if replicas:
            scales = (*scales, Scale(name_of(obj), replicas, 0))
        return attrs.evolve(plan, statuses=statuses, scales=scales)

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

    def _observe_ready_times(
        self, namespace: str, objs: Sequence[JSON], *, taking: dict[str, datetime]
    ) -> None:
        for obj in objs:
            name = name_of(obj)
            self.ready_times.pods_seen(
                self.cache.pods_of(self.cache.workload_of(MODELS, namespace, name)),
                namespace=namespace,
                model=name,
                handed_over_at=taking.get(name) or condition_since(obj, "Active"),
            )

    def _observe_drains(
        self,
        namespace: str,
        observed: Sequence[ModelState],
        decision: GroupDecision,
        *,
        now: datetime,
    ) -> None:
        """A member whose status says it drains and that the decision scales to 0: its
        drain ended now (docs/election.md 1.6)."""
        for state in observed:
            since = state.draining_since
            if state.phase is not Phase.DRAINING or since is None:
                continue
            member = decision.member(state.name)
            if member.phase is Phase.DRAINING or member.desired_replicas != 0:
                continue
            self.drain_times.drain_ended(
                namespace=namespace,
                model=state.name,
                since=since,
                deadline=since + state.drain_timeout,
                ended=now,
            )

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
        self._progress_since.pop((namespace, group, ""), None)
        key = (namespace, group)
        previous = self._lease_labels.pop(key, None)
        if previous is not None:
            self.metrics.lease_active.remove(*previous)
            self.metrics.lease_acquired.remove(*previous)
        self._governing.pop(key, None)
        for gone in self._member_series.pop(key, set()):
            self.metrics.member_active.remove(namespace, group, gone)
        self._failing_open.pop(key, None)
