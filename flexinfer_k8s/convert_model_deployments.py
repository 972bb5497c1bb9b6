"""ModelDeployments (v1alpha1) from Kubernetes JSON, and the status the controller writes.

`standalone_from_k8s` reads a ModelDeployment no GPUGroup governs, with its
Deployment and pods, into the core's `StandaloneDeployment`; `standalone_status`
and `member_status` (a GPUGroup member's) build the status merge patches. Pure: no
client, no clock (callers pass `now`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from flexinfer_core import (
    Condition,
    DeploymentPhase,
    Membership,
    Policy,
    ServerFailure,
    SpecProblem,
    StandaloneDecision,
    StandaloneDeployment,
    member_ready_condition,
    model_deployment_phase,
    reasons,
)
from flexinfer_core.durations import seconds_window
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_k8s.field_names import user_fields
from flexinfer_k8s.pods import deployment_replicas, server_failure, serving_pod_count
from flexinfer_k8s.status_diff import generation_of, merge_conditions
from flexinfer_kube.objects import JSON, get_path, int_or, name_of, namespace_of


def _failing_ready(failure: ServerFailure, name: str) -> Condition:
    """A failing server's Ready condition: the kubelet's reason and its own words."""
    reason = reasons.CRASH_LOOP_BACK_OFF if failure.restarts else DeploymentPhase.FAILED.value
    return Condition("Ready", False, reason, f"{name} is failing: {failure.describe()}")


def _observed(
    md: Mapping[str, Any], *, replicas: int | None, pods: Sequence[JSON]
) -> tuple[JSON, ServerFailure | None]:
    """A ModelDeployment's observed status, the phase as the core reads it from its pods
    (its `lastAccessTime` is the proxy's), and why its server fails when it is Failed."""
    failure = server_failure(pods)
    observed = model_deployment_phase(
        replicas=replicas, ready_pods=serving_pod_count(pods), failure=failure
    )
    status: JSON = {
        "phase": observed.phase.value,
        "message": observed.message,
        "readyReplicas": observed.ready_replicas,
    }
    generation = generation_of(md)
    if generation is not None:
        status["observedGeneration"] = generation
    return status, (failure if observed.phase is DeploymentPhase.FAILED else None)


# Where each `StandaloneDeployment` attribute is written on a ModelDeployment.
MODEL_DEPLOYMENT_FIELDS = {
    "replicas": "spec.replicas",
    "min_replicas": "spec.minReplicas",
    "last_access_time": "status.lastAccessTime",
}


def idle_timeout_of(md: Mapping[str, Any]) -> timedelta:
    """`spec.idleTimeoutSeconds` (default 300); an `InvalidFieldError` naming it when no
    decision could use it (what a GPUGroup reads of its members' own specs)."""
    return _seconds(md, "idleTimeoutSeconds", Policy.IDLE_TIMEOUT)


def _seconds(md: Mapping[str, Any], name: str, default: timedelta) -> timedelta:
    value = get_path(md, "spec", name)
    if isinstance(value, bool) or not isinstance(value, int):
        return default  # absent (the CRD defaults it) or not a number: the default
    return seconds_window(value, field=f"spec.{name}")


def standalone_from_k8s(
    md: Mapping[str, Any],
    *,
    deployment: Mapping[str, Any] | None,
    pods: Sequence[JSON],
    conflict: Membership | None = None,
    cache_ready: bool = True,
) -> StandaloneDeployment:
    """A ModelDeployment no GPUGroup governs, with its Deployment's replicas and ready
    pods (`conflict`: the membership conflict that holds it at zero, if any).

    A value no decision can use raises `InvalidFieldError` naming the ModelDeployment's
    field (`spec.replicas`, `spec.idleTimeoutSeconds`) and the value stored there.
    """
    spec = get_path(md, "spec") or {}
    with user_fields(md, MODEL_DEPLOYMENT_FIELDS):
        return StandaloneDeployment(
            name=name_of(md),
            namespace=namespace_of(md) or "default",
            replicas=int_or(spec.get("replicas"), 1),
            min_replicas=int_or(spec.get("minReplicas"), Policy.MIN_REPLICAS),
            idle_timeout=idle_timeout_of(md),
            cold_start_timeout=_seconds(md, "coldStartTimeoutSeconds", Policy.COLD_START_TIMEOUT),
            last_access_time=parse_rfc3339(get_path(md, "status", "lastAccessTime")),
            current_replicas=deployment_replicas(deployment),
            ready_replicas=serving_pod_count(pods),
            conflict=conflict,
            cache_ready=cache_ready,
        )


def standalone_status(
    md: Mapping[str, Any],
    decision: StandaloneDecision,
    *,
    replicas: int | None,
    pods: Sequence[JSON],
    now: datetime,
) -> JSON:
    """The observed phase and readyReplicas, with the decision's message and Ready
    condition (a failing server's own words when it is Failed)."""
    status, failure = _observed(md, replicas=replicas, pods=pods)
    serving = status["phase"] == DeploymentPhase.RUNNING.value and decision.may_serve
    status["message"] = decision.message
    ready = Condition("Ready", serving, decision.reason, decision.message)
    if failure is not None:
        ready = _failing_ready(failure, name_of(md))
        status["message"] = f"{decision.message}; {ready.message}"
    if decision.rewrite_last_access_time is not None:
        status["lastAccessTime"] = format_rfc3339(decision.rewrite_last_access_time)
    status["conditions"] = merge_conditions(
        get_path(md, "status", "conditions"),
        [ready],
        now=now,
        generation=generation_of(md),
    )
    return status


def member_status(
    md: Mapping[str, Any],
    membership: Membership,
    *,
    replicas: int | None,
    pods: Sequence[JSON],
    now: datetime,
    rewrite_last_access_time: bool = False,
    draining: bool = False,
) -> JSON:
    """A GPUGroup member's observed phase and readyReplicas, with a Ready condition naming
    its group (which replaces one left by a standalone or conflicting past); with
    `rewrite_last_access_time`, `lastAccessTime` put back to `now` (it lay far in the
    future, and the group's decision read it as now). `draining`: the group's decision
    keeps it up to finish its requests in flight after a swap (docs/election.md 1.6):
    a serving member says `Draining`, so the proxy sends it nothing new."""
    status, failure = _observed(md, replicas=replicas, pods=pods)
    if draining and status["phase"] == DeploymentPhase.RUNNING.value:
        status["phase"] = DeploymentPhase.DRAINING.value
        status["message"] = "draining: finishing its requests in flight before it stops"
    if rewrite_last_access_time:
        status["lastAccessTime"] = format_rfc3339(now)
    serving = status["phase"] == DeploymentPhase.RUNNING.value
    ready = member_ready_condition(membership, serving=serving)
    if failure is not None and not membership.in_conflict:
        ready = _failing_ready(failure, name_of(md))
    status["conditions"] = merge_conditions(
        get_path(md, "status", "conditions"),
        [ready],
        now=now,
        generation=generation_of(md),
    )
    return status


def unreadable_status(
    md: Mapping[str, Any],
    problem: SpecProblem,
    *,
    replicas: int | None,
    pods: Sequence[JSON],
    now: datetime,
) -> JSON:
    """The status of a ModelDeployment whose spec cannot be read: `Failed`, its ready
    pods counted while they go, and `Ready=False` saying which field and why."""
    status, _ = _observed(md, replicas=replicas, pods=pods)
    status["phase"] = DeploymentPhase.FAILED.value
    status["message"] = problem.message
    status["conditions"] = merge_conditions(
        get_path(md, "status", "conditions"),
        problem.conditions,
        now=now,
        generation=generation_of(md),
    )
    return status
