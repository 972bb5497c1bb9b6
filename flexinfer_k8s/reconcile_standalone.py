"""Reconcile one ModelDeployment no GPUGroup governs: snapshot -> `decide_standalone` -> apply.

A ModelDeployment that no GPUGroup lists and whose `spec.gpuGroupRef` is empty runs
as the Deployment of the same name (docs/controller.md); one whose membership is in
conflict (listed by two groups, or a `gpuGroupRef` naming a group that does not list
it; flexinfer_core.membership) is held at zero here and its Ready condition says
why. The proxy records requests in
`status.lastAccessTime`; the core turns that into desired replicas. The writes
are: the Deployment's replicas through the scale subresource when they differ
(with an Event saying why), then the ModelDeployment's status (observed `phase`,
`readyReplicas`, `message` and a `Ready` condition carrying the decision's
reason) when it differs, conditional on the resourceVersion it was decided on.
Nothing else is written; a reconcile that changes nothing writes nothing. The
caller arms a timer at the returned `next_change_at` (the idle-timeout lapse). One
whose spec cannot be read (flexinfer_core.invalid: `spec.replicas` beyond int32 stored
before the CRD bound, ...) is scaled to 0 and its `Ready=False` condition, reason
`InvalidSpec`, names the field; one Warning Event and one log line when that is news.
"""

from __future__ import annotations

import logging
from datetime import datetime

from flexinfer_core import (
    InvalidFieldError,
    Scope,
    decide_standalone,
    reports_spec_problem,
    spec_problem,
)
from flexinfer_k8s import observe
from flexinfer_k8s.convert_model_deployments import (
    standalone_status,
    unreadable_status,
)
from flexinfer_k8s.outcome import Outcome, Refusals, Wiring
from flexinfer_k8s.pods import deployment_replicas
from flexinfer_k8s.status_diff import recorded_conditions, status_differs
from flexinfer_k8s.write_plan import write_spec_problem
from flexinfer_kube.kubeapi import JSON
from flexinfer_kube.objects import name_of, namespace_of
from flexinfer_kube.resources import MODEL_DEPLOYMENTS

log = logging.getLogger("flexinfer.standalone")


class StandaloneReconciler:
    def __init__(self, wiring: Wiring) -> None:
        self.wiring = wiring
        self.cache = wiring.cache
        self.writer = wiring.writer
        self.clock = wiring.clock
        self.refusals = Refusals(wiring, kind="modeldeployment")

    def reconcile(self, namespace: str, name: str) -> Outcome:
        found = self.cache.model_deployment_on_its_own(namespace, name)
        if found is None:
            return Outcome(None, False)  # gone, or its GPUGroup decides for it
        md, membership = found
        now = self.clock.now()
        try:
            snapshot = observe.standalone_snapshot(self.cache, md, membership)
        except InvalidFieldError as error:
            deployment = self.cache.workload_of(MODEL_DEPLOYMENTS, namespace, name)
            pods = self.cache.pods_of(deployment)
            return self._unreadable(md, error, deployment=deployment, pods=pods, now=now)
        state, pods = snapshot.state, snapshot.pods
        if reports_spec_problem(recorded_conditions(md, ("Ready",))):
            log.info(
                "spec readable again",
                extra={"fields": {"namespace": namespace, "modeldeployment": name}},
            )
        decision = decide_standalone(state, now=now)
        wrote = False

        replicas = state.current_replicas
        if decision.scale_to is not None and self.writer.scale(namespace, name, decision.scale_to):
            wrote = True
            replicas = decision.scale_to
            if decision.event is not None:
                self.writer.event(
                    md,
                    reason=decision.event.reason,
                    message=decision.event.message,
                    type=decision.event.type,
                    now=now,
                )

        # After the scale, so the phase written is the one the new replicas give
        # (Pending while woken pods start), not a stale Idle rewritten a moment later.
        wanted = standalone_status(md, decision, replicas=replicas, pods=pods, now=now)
        if status_differs(md.get("status"), wanted):
            written = self.writer.patch_status(MODEL_DEPLOYMENTS, md, wanted) is not None
            wrote = written or wrote
            if written and decision.warning is not None:
                # Once: the write puts lastAccessTime back to now.
                self.writer.event(
                    md,
                    reason=decision.warning.reason,
                    message=decision.warning.message,
                    type=decision.warning.type,
                    now=now,
                )

        if wrote:
            log.info(
                "applied standalone decision",
                extra={
                    "fields": {
                        "namespace": namespace,
                        "modeldeployment": name,
                        "replicas": decision.desired_replicas,
                        "phase": wanted["phase"],
                        "reason": decision.reason,
                        "message": decision.message,
                    }
                },
            )
        return Outcome(decision.next_change_at, wrote, decision.reason)

    def _unreadable(
        self,
        md: JSON,
        error: InvalidFieldError,
        *,
        deployment: JSON | None,
        pods: list[JSON],
        now: datetime,
    ) -> Outcome:
        """A ModelDeployment whose spec cannot be read runs nothing: scaled to 0, told
        why, with one Warning Event and one log line when that is news."""
        namespace, name = namespace_of(md), name_of(md)
        problem = spec_problem(
            name, error, recorded=recorded_conditions(md, ("Ready",)), scope=Scope.ALONE
        )
        wrote = False
        replicas = deployment_replicas(deployment)
        if replicas and self.writer.scale(namespace, name, 0):
            wrote, replicas = True, 0
        wanted = unreadable_status(md, problem, replicas=replicas, pods=pods, now=now)
        wrote = (
            write_spec_problem(
                self.wiring,
                self.refusals,
                resource=MODEL_DEPLOYMENTS,
                obj=md,
                problem=problem,
                status=wanted,
                now=now,
            )
            or wrote
        )
        return Outcome(None, wrote, problem.reason)
