"""Reconcile one GPUGroup: members' demand and pods -> `decide_gpu_group` -> apply the diff.

Members are ModelDeployments named in `spec.models`; each runs as the Deployment of
the same name. A listed ModelDeployment whose membership is in conflict (another
group lists it too, or its `gpuGroupRef` names another group) is left out of the
decision (its pods still hold the card), and its status is its own key's to write.
Demand is the `demand.ai.flexinfer/<member>` annotations the proxy writes
(docs/resources.md). The decision records a swap at once in the status
(`activeModel`, `lastSwapTime`, `swapCount`); every later decision derives the
Graceful drain from that record and the members' pods, so the writes here are: the
status (conditional on the observed resourceVersion) with the decision's Events
(Swap/Start on the group, Preempted on the member it displaces), scale-downs, then
scale-ups — the latter only when a live Pod list agrees with the cache about which
other members still have pods — and each member ModelDeployment's observed
`phase`/`readyReplicas` with a Ready condition naming the group. Nothing else is
written; a reconcile that changes nothing writes nothing.
"""

from __future__ import annotations

import logging

from flexinfer_core import decide_gpu_group
from flexinfer_k8s import observe
from flexinfer_k8s.cache import live_occupants
from flexinfer_k8s.convert_gpugroups import gpu_group_status
from flexinfer_k8s.convert_model_deployments import member_status
from flexinfer_k8s.outcome import Outcome, Wiring, recheck_soon, record_events
from flexinfer_k8s.pods import live_pods
from flexinfer_k8s.status_diff import status_differs
from flexinfer_kube.resources import GPU_GROUPS, MODEL_DEPLOYMENTS

log = logging.getLogger("flexinfer.gpugroup")


class GpuGroupReconciler:
    def __init__(self, wiring: Wiring) -> None:
        self.wiring = wiring
        self.cache = wiring.cache
        self.writer = wiring.writer

    def reconcile(self, namespace: str, name: str) -> Outcome:
        group = self.cache.get(GPU_GROUPS, namespace, name)
        if group is None:
            return Outcome(None, False)
        now = self.wiring.clock.now()
        snapshot = observe.gpu_group_snapshot(self.cache, group)
        state, members = snapshot.state, list(snapshot.members)
        model_deployments, memberships = snapshot.model_deployments, snapshot.memberships
        member_pods, replicas = snapshot.member_pods, snapshot.replicas
        decision = decide_gpu_group(state, now=now)
        wrote = False

        wanted = gpu_group_status(group, decision, now=now)
        if (
            status_differs(group.get("status"), wanted)
            and self.writer.patch_status(GPU_GROUPS, group, wanted) is not None
        ):
            wrote = True
            # The Events of a swap are the decision's; a retry after a conflict decides
            # again, so they are recorded only once the status that holds them is written.
            record_events(
                self.wiring,
                [
                    *((group, event) for event in decision.group_events),
                    *(
                        (model_deployments.get(event.model), event)
                        for event in decision.member_events
                    ),
                ],
                namespace=namespace,
                group=name,
                kind="gpugroup",
                now=now,
            )

        for member in members:
            want = decision.replicas_for(member)
            have = replicas[member]
            if have is not None and want < have:
                wrote = self.writer.scale(namespace, member, want) or wrote

        ups = [
            m
            for m in members
            if replicas[m] is not None and decision.replicas_for(m) > (replicas[m] or 0)
        ]
        deferred = False
        if ups:
            cached = {m for m in members if live_pods(member_pods[m])}
            # Label-selected: a former member's pods count too (the decision never saw them).
            live = live_occupants(
                self.wiring.api, namespace, group=name, kind=MODEL_DEPLOYMENTS.kind
            )
            for member in ups:
                surprise = sorted((live - cached) - {member})
                if surprise:
                    # The cache had not seen these pods when the core decided.
                    log.info(
                        "scale-up deferred: the cache was behind on pods",
                        extra={"fields": {"gpugroup": name, "model": member, "pods_of": surprise}},
                    )
                    deferred = True
                    break
                wrote = self.writer.scale(namespace, member, decision.replicas_for(member)) or wrote

        for member, md in model_deployments.items():
            if memberships[member].in_conflict:
                continue  # held at zero by its own key, which writes why
            wanted = member_status(
                md,
                memberships[member],
                replicas=replicas[member],
                pods=member_pods[member],
                now=now,
            )
            if status_differs(md.get("status"), wanted):
                wrote = self.writer.patch_status(MODEL_DEPLOYMENTS, md, wanted) is not None or wrote

        next_at = decision.next_change_at
        if deferred:
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
                    }
                },
            )
        return Outcome(next_at, wrote, decision.reason)
