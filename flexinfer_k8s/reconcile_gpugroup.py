"""Reconcile one GPUGroup: members' demand and pods -> the decision -> apply the diff.

The decision is section 3's (`decide_gpu_group`, one member at a time), or, when the
controller has a DRA device class (`--gpu-device-class`) and the group sets
`spec.vramBudget`, the packed one (`decide_packed_gpu_group`, docs/election.md 3,
"Packing"): the members that fit hold the card together, each `Active` in
`status.modelStatuses`, their pods all referencing the group's one ResourceClaim
(rendered by `reconcile_workload`). A member whose pods cannot reference it (not on
one AMD GPU) counts as unknown footprint: the whole card. A packed group's scale-ups
wait, on the live pod list, until the footprints of every member with pods plus the
new holder's own fit the budget (`write_plan.Interlock`).

Members are ModelDeployments named in `spec.models`; each runs as the Deployment of
the same name. A listed ModelDeployment whose membership is in conflict (another
group lists it too, or its `gpuGroupRef` names another group) is left out of the
decision (its pods still hold the card), and its status is its own key's to write.
A listed ModelDeployment whose own spec cannot be read (flexinfer_core.invalid) is
left out the same way, held at zero by the decision, and told why (`Ready=False`,
`InvalidSpec`, one Warning Event when that is news); a GPUGroup whose own spec cannot
be read decides nothing and says so.
Demand is the `demand.ai.flexinfer/<member>` annotations the proxy writes
(docs/resources.md). The decision records a swap at once in the status
(`activeModel`, `lastSwapTime`, `swapCount`); every later decision derives the
Graceful drain from that record and the members' pods. The writes go out through the
one ordered apply (`flexinfer_k8s.write_plan`): the status (conditional on the
observed resourceVersion), scale-downs, the decision's Events (Swap/Start on the
group, Preempted on the member it displaces), scale-ups — only when a live Pod list
shows no pod of another member the decision did not see — and last each member
ModelDeployment's observed `phase`/`readyReplicas` with a Ready condition naming the
group. Nothing else is written; a reconcile that changes nothing writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from flexinfer_core import (
    DeploymentPhase,
    GpuGroupDecision,
    GpuGroupState,
    InvalidFieldError,
    Membership,
    Scope,
    reports_spec_problem,
    spec_problem,
)
from flexinfer_core.gpugroup_packing import GpuGroupPacking
from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_k8s import observe
from flexinfer_k8s.convert_gpugroups import (
    gpu_group_status,
    unreadable_group_status,
)
from flexinfer_k8s.convert_model_deployments import member_status, unreadable_status
from flexinfer_k8s.decide_gpugroup import decide_gpu_group_snapshot
from flexinfer_k8s.drain_times import DrainTimes
from flexinfer_k8s.outcome import Applied, Outcome, Refusals, Wiring, recheck_soon
from flexinfer_k8s.pods import live_pods
from flexinfer_k8s.ready_times import ReadyTimes
from flexinfer_k8s.status_diff import recorded_conditions, status_differs
from flexinfer_k8s.write_plan import (
    Interlock,
    Scale,
    StatusWrite,
    WritePlan,
    apply_plan,
    write_spec_problem,
)
from flexinfer_kube.kubeapi import JSON
from flexinfer_kube.objects import get_path, name_of, namespace_of
from flexinfer_kube.resources import GPU_GROUPS, MODEL_DEPLOYMENTS

log = logging.getLogger("flexinfer.gpugroup")


class GpuGroupReconciler:
    def __init__(self, wiring: Wiring, *, device_class: str = "") -> None:
        self.wiring = wiring
        # The DRA device class of a budgeted group's claim (`--gpu-device-class`): with
        # it, a GPUGroup that sets `spec.vramBudget` packs; without, its members take
        # turns, and its `Packed` condition says why (docs/election.md 3).
        self.device_class = device_class
        self.cache = wiring.cache
        self.writer = wiring.writer
        self.refusals = Refusals(wiring, kind="gpugroup")
        self.ready_times = ReadyTimes(wiring.metrics, since=wiring.clock.now())
        self.drain_times = DrainTimes(wiring.metrics)

    def reconcile(self, namespace: str, name: str, *, insist: bool = False) -> Outcome:
        """One GPUGroup. `insist`: this key's last attempts all ended in a status
        conflict; write the scale-downs even if the status conflicts again."""
        group = self.cache.get(GPU_GROUPS, namespace, name)
        if group is None:
            return Outcome(None, False)
        now = self.wiring.clock.now()
        try:
            snapshot = observe.gpu_group_snapshot(self.cache, group)
        except InvalidFieldError as error:
            return self._unreadable_group(group, error, now=now)
        state, members = snapshot.state, list(snapshot.members)
        model_deployments, memberships = snapshot.model_deployments, snapshot.memberships
        member_pods, replicas = snapshot.member_pods, snapshot.replicas
        unreadable = snapshot.unreadable
        swapped_at = parse_rfc3339(get_path(group, "status", "lastSwapTime"))
        active = get_path(group, "status", "activeModel")
        for member, pods in member_pods.items():
            # Only the member swapped in at `lastSwapTime` was handed the card then.
            self.ready_times.pods_seen(
                pods,
                namespace=namespace,
                model=member,
                handed_over_at=swapped_at if member == active else None,
            )
        state, decision, packing, holders = self._decide(snapshot, now=now)
        self._observe_drains(snapshot, decision, swapped_at=swapped_at, now=now)

        wanted = gpu_group_status(group, decision, now=now, state=state, packing=packing)
        statuses: list[StatusWrite] = []
        if status_differs(group.get("status"), wanted):
            # The Events of a swap are the decision's: recorded only once the status
            # that holds them is written (or, refused, once).
            events = (
                *((group, event) for event in decision.group_events),
                *((model_deployments.get(e.model), e) for e in decision.member_events),
            )
            statuses.append(StatusWrite(GPU_GROUPS, group, wanted, events))
        scales = []
        for member in members:
            have, want = replicas[member], decision.replicas_for(member)
            if have is not None and want != have:
                scales.append(Scale(member, have, want))
        trailing = []
        for member, md in model_deployments.items():
            if memberships[member].in_conflict:
                continue  # held at zero by its own key, which writes why
            write = self._member_status(
                md,
                memberships[member],
                error=unreadable.get(member),
                replicas=replicas[member],
                pods=member_pods[member],
                group=name,
                now=now,
                rewrite_last_access_time=member in decision.rewrite_last_access_time,
                # Kept up by the decision without holding the card: it drains.
                draining=member not in holders and decision.replicas_for(member) > 0,
            )
            if write is not None:
                trailing.append(write)
        plan = WritePlan(
            namespace=namespace,
            group=name,
            kind="gpugroup",
            interlock=self._interlock(name, state, members, member_pods, packed=packing),
            statuses=tuple(statuses),
            scales=tuple(scales),
            trailing=tuple(trailing),
        )
        applied = apply_plan(self.wiring, self.refusals, plan, now=now, insist=insist)
        wrote = applied is not Applied.NOTHING

        next_at = decision.next_change_at
        if applied is Applied.DEFERRED:
            next_at = recheck_soon(next_at, now=now)
        if wrote:
            log.info(
                "applied GPUGroup decision",
                extra={
                    "fields": {
                        "namespace": namespace,
                        "gpugroup": name,
                        "action": decision.action.value,
                        "active": decision.active_model,
                        "phase": decision.phase.value,
                        "reason": decision.reason,
                        "message": decision.message,
                        "replicas": dict(decision.desired_replicas),
                        "unreadable": sorted(unreadable) or None,
                    }
                },
            )
        return Outcome(next_at, wrote, decision.reason)

    def _decide(
        self, snapshot: observe.GpuGroupSnapshot, *, now: datetime
    ) -> tuple[GpuGroupState, GpuGroupDecision, GpuGroupPacking | None, frozenset[str]]:
        """The group as decided on, the decision, its packing as written (None: the
        members take turns) and the members that hold the card
        (`decide_gpu_group_snapshot`, as `flexinfer explain` decides it too)."""
        state, outcome = decide_gpu_group_snapshot(
            snapshot, device_class=self.device_class, now=now
        )
        return state, outcome.decision, outcome.packing, outcome.holders

    @staticmethod
    def _interlock(
        group: str,
        state: GpuGroupState,
        members: Sequence[str],
        member_pods: Mapping[str, Sequence[JSON]],
        *,
        packed: GpuGroupPacking | None,
    ) -> Interlock:
        """What a scale-up checks in the live pod list (write_plan.Interlock).

        Members taking turns: the decision saw these members' pods and chose to start
        beside them (an Immediate preemption, a drain past its timeout); any other in
        the live list (a former member's included) is one the cache had not seen.
        Packed (several may hold the card): every live pod counts by its member's
        footprint, the co-holders' that the decision counted included, and a holder
        starts only when they and its own fit the budget; a pod of a member of unknown
        footprint, or of no member, takes the whole card."""
        if packed is None or not packed.used:
            return Interlock(
                group=group,
                kind=MODEL_DEPLOYMENTS.kind,
                accounted=frozenset(m for m in members if live_pods(member_pods[m])),
            )
        return Interlock(
            group=group,
            kind=MODEL_DEPLOYMENTS.kind,
            budget=state.vram_budget,
            footprints=tuple(
                sorted((m.name, m.vram_estimate) for m in state.members if m.vram_estimate)
            ),
        )

    def _observe_drains(
        self,
        snapshot: observe.GpuGroupSnapshot,
        decision: GpuGroupDecision,
        *,
        swapped_at: datetime | None,
        now: datetime,
    ) -> None:
        """A member whose status says it drains (written while the decision kept it up
        after the swap at `swapped_at`) and that the decision now scales to 0: its drain
        ended now (docs/election.md 1.6)."""
        if swapped_at is None:
            return
        wanted = dict(decision.desired_replicas)
        for member, md in snapshot.model_deployments.items():
            if (
                get_path(md, "status", "phase") == DeploymentPhase.DRAINING.value
                and snapshot.replicas.get(member)
                and wanted.get(member) == 0
            ):
                self.drain_times.drain_ended(
                    namespace=namespace_of(md),
                    model=member,
                    since=swapped_at,
                    deadline=swapped_at + snapshot.state.drain_timeout,
                    ended=now,
                )

    def _member_status(
        self,
        md: JSON,
        membership: Membership,
        *,
        error: InvalidFieldError | None,
        replicas: int | None,
        pods: list[JSON],
        group: str,
        now: datetime,
        rewrite_last_access_time: bool = False,
        draining: bool = False,
    ) -> StatusWrite | None:
        """A member's observed status with a Ready condition naming its group, or, when
        its spec cannot be read, why (with one Warning Event when that is news); None
        when the status already says it."""
        recorded = recorded_conditions(md, ("Ready",))
        if error is None:
            if reports_spec_problem(recorded):
                log.info(
                    "spec readable again",
                    extra={"fields": {"gpugroup": group, "modeldeployment": name_of(md)}},
                )
            wanted = member_status(
                md,
                membership,
                replicas=replicas,
                pods=pods,
                now=now,
                rewrite_last_access_time=rewrite_last_access_time,
                draining=draining,
            )
            if not status_differs(md.get("status"), wanted):
                return None
            return StatusWrite(MODEL_DEPLOYMENTS, md, wanted)
        problem = spec_problem(name_of(md), error, recorded=recorded, scope=Scope.MEMBER)
        wanted = unreadable_status(md, problem, replicas=replicas, pods=pods, now=now)
        if not status_differs(md.get("status"), wanted):
            return None
        events = ((md, problem.event),) if problem.event is not None else ()
        return StatusWrite(MODEL_DEPLOYMENTS, md, wanted, events, problem=problem)

    def _unreadable_group(self, group: JSON, error: InvalidFieldError, *, now: datetime) -> Outcome:
        """A GPUGroup whose own spec (or status) cannot be read decides nothing: its
        members keep their replicas, and its status says which field and why."""
        problem = spec_problem(
            name_of(group),
            error,
            recorded=recorded_conditions(group, ("Ready",)),
            scope=Scope.GROUP,
        )
        wanted = unreadable_group_status(group, problem, now=now)
        wrote = write_spec_problem(
            self.wiring,
            self.refusals,
            resource=GPU_GROUPS,
            obj=group,
            problem=problem,
            status=wanted,
            now=now,
        )
        return Outcome(None, wrote, problem.reason)
