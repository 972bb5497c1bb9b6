"""Pods and the Deployments that select them, as the controller reads them.

Until the rendering issue lands, a Model's (and a ModelDeployment's) workload is the
Deployment *named like it* in its namespace, and a Deployment's pods are the pods
its `spec.selector` matches; `server_failure` reads why a workload's server is failing
from its pods' container statuses (the core decides what that makes the phase). Pure
readers of Kubernetes JSON: no client, no clock, no decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flexinfer_core import ServerFailure
from flexinfer_kube.objects import JSON, get_path, int_or, namespace_of


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against labels; empty matches none."""
    if not selector:
        return False
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    for key, value in match_labels.items():
        if labels.get(key) != value:
            return False
    for expression in expressions:
        key = expression.get("key", "")
        operator = expression.get("operator", "")
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def pods_of(deployment: Mapping[str, Any] | None, pods: Iterable[JSON]) -> list[JSON]:
    """The pods a Deployment's selector matches in its namespace (terminating included)."""
    if deployment is None:
        return []
    selector = get_path(deployment, "spec", "selector")
    namespace = namespace_of(deployment)
    return [
        p
        for p in pods
        if namespace_of(p) == namespace
        and selector_matches(selector, get_path(p, "metadata", "labels") or {})
    ]


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    if get_path(pod, "status", "phase") != "Running":
        return False
    conditions = get_path(pod, "status", "conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_is_finished(pod: Mapping[str, Any]) -> bool:
    return get_path(pod, "status", "phase") in ("Succeeded", "Failed")


def live_pods(pods: Iterable[JSON]) -> list[JSON]:
    """Pods that may still hold a GPU: everything not Succeeded/Failed, terminating included."""
    return [p for p in pods if not pod_is_finished(p)]


def serving_pod_count(pods: Sequence[JSON]) -> int:
    """Ready pods that are not on their way out (what a ModelDeployment reports as ready)."""
    return sum(
        1
        for p in live_pods(pods)
        if pod_is_ready(p) and not get_path(p, "metadata", "deletionTimestamp")
    )


def serving_node(pods: Sequence[JSON]) -> str | None:
    """The node of a Ready pod that is not on its way out (the first by name, so the
    answer does not depend on list order); None when none serves."""
    serving = sorted(
        (str(get_path(p, "metadata", "name") or ""), str(get_path(p, "spec", "nodeName") or ""))
        for p in live_pods(pods)
        if pod_is_ready(p) and not get_path(p, "metadata", "deletionTimestamp")
    )
    return next((node for _, node in serving if node), None)


def deployment_replicas(deployment: Mapping[str, Any] | None) -> int | None:
    """A Deployment's `spec.replicas` (1 when unset); None when there is no Deployment."""
    if deployment is None:
        return None
    return int_or(get_path(deployment, "spec", "replicas"), 1)


def _termination(container_status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    terminated: Mapping[str, Any] | None = get_path(
        container_status, "lastState", "terminated"
    ) or get_path(container_status, "state", "terminated")
    return terminated or None


def _container_failure(container_status: Mapping[str, Any]) -> ServerFailure | None:
    """A container that restarted and is not ready again, as a failure (its last end)."""
    restarts = int_or(container_status.get("restartCount"), 0)
    waiting = str(get_path(container_status, "state", "waiting", "reason") or "")
    if container_status.get("ready") or (restarts <= 0 and waiting != "CrashLoopBackOff"):
        return None
    terminated = _termination(container_status) or {}
    code = terminated.get("exitCode")
    return ServerFailure(
        container=str(container_status.get("name") or ""),
        restarts=max(restarts, 1),
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        reason=str(terminated.get("reason") or waiting or ""),
        message=str(terminated.get("message") or ""),
    )


def _pod_failure(pod: Mapping[str, Any]) -> ServerFailure | None:
    """Why a pod that failed outright did (its terminated container, else its own reason)."""
    for container_status in get_path(pod, "status", "containerStatuses") or []:
        terminated = get_path(container_status, "state", "terminated") or {}
        if terminated and terminated.get("exitCode") != 0:
            code = terminated.get("exitCode")
            return ServerFailure(
                container=str(container_status.get("name") or ""),
                exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                reason=str(terminated.get("reason") or ""),
                message=str(terminated.get("message") or get_path(pod, "status", "message") or ""),
            )
    containers = get_path(pod, "spec", "containers") or [{}]
    return ServerFailure(
        container=str(containers[0].get("name") or ""),
        reason=str(get_path(pod, "status", "reason") or "Failed"),
        message=str(get_path(pod, "status", "message") or ""),
    )


def server_failure(pods: Sequence[JSON]) -> ServerFailure | None:
    """Why the workload's server is failing, from its newest pod that is: an init or
    server container that restarted and is not ready again (CrashLoopBackOff, a probe
    kill), or a pod that failed outright. None while a pod is ready (it serves) or
    nothing failed. Terminating pods are on their way out and say nothing."""
    current = [p for p in pods if not get_path(p, "metadata", "deletionTimestamp")]
    if any(pod_is_ready(p) for p in current):
        return None
    newest_first = sorted(
        current,
        key=lambda p: str(get_path(p, "metadata", "creationTimestamp") or ""),
        reverse=True,
    )
    for pod in newest_first:
        if get_path(pod, "status", "phase") == "Failed":
            return _pod_failure(pod)
        statuses = [
            *(get_path(pod, "status", "initContainerStatuses") or []),
            *(get_path(pod, "status", "containerStatuses") or []),
        ]
        for container_status in statuses:
            failure = _container_failure(container_status)
            if failure is not None:
                return failure
    return None
