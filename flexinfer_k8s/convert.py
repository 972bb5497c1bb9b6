"""Kubernetes JSON <-> the core's snapshots and decisions.

`*_from_k8s` functions read objects (plain dicts, as the API returns them) into the
core's frozen snapshots; `*_status` functions turn decisions into the status
documents the controller writes. Pure functions: no client, no clock (callers pass
`now`), no logging. Unreadable optional values fall back to the spec's defaults;
a value the core rejects raises the core's `FlexinferError` naming the field.

Until the rendering issue lands, a Model's (and a ModelDeployment's) workload is the
Deployment and Service *named like it* in its namespace, and a Deployment's pods
are the pods its `spec.selector` matches.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from flexinfer_core import (
    ACTIVE_SERVICES_ANNOTATION,
    AntiThrashing,
    Condition,
    GpuGroupDecision,
    GpuGroupMember,
    GpuGroupPhase,
    GpuGroupState,
    GpuLease,
    LeaseSource,
    MemberDecision,
    ModelState,
    Phase,
    Serverless,
    SharedState,
    StandaloneDecision,
    StandaloneDeployment,
    observed_phase,
    parse_duration,
)
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_kube.objects import get_path
from flexinfer_kube.objects import name_of as name_of
from flexinfer_kube.objects import namespace_of as namespace_of

JSON = dict[str, Any]

GPU_LEASE_LABEL = "ai.flexinfer/gpu-lease"
DEMAND_ANNOTATION_PREFIX = "demand.ai.flexinfer/"
DEMAND_STALE_AFTER = timedelta(minutes=5)
MODEL_CONDITIONS = ("Active", "Ready")


# --- small readers -------------------------------------------------------------------

# The adapter's names for the core's one RFC 3339 reader and writer.
parse_time = parse_rfc3339
format_time = format_rfc3339


_get = get_path


def _duration(value: Any, default: timedelta, *, field: str) -> timedelta:
    if value is None or value == "":
        return default
    return parse_duration(str(value), field=field)


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value


# --- pods and workloads ------------------------------------------------------------


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
    selector = _get(deployment, "spec", "selector")
    namespace = namespace_of(deployment)
    return [
        p
        for p in pods
        if namespace_of(p) == namespace
        and selector_matches(selector, _get(p, "metadata", "labels") or {})
    ]


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    if _get(pod, "status", "phase") != "Running":
        return False
    conditions = _get(pod, "status", "conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_is_finished(pod: Mapping[str, Any]) -> bool:
    return _get(pod, "status", "phase") in ("Succeeded", "Failed")


def live_pods(pods: Iterable[JSON]) -> list[JSON]:
    """Pods that may still hold a GPU: everything not Succeeded/Failed, terminating included."""
    return [p for p in pods if not pod_is_finished(p)]


def deployment_replicas(deployment: Mapping[str, Any] | None) -> int | None:
    if deployment is None:
        return None
    return _int(_get(deployment, "spec", "replicas"), 1)


# --- Model -----------------------------------------------------------------------------


def _conditions_from_k8s(items: Any) -> tuple[Condition, ...]:
    out = []
    for item in items or []:
        if not isinstance(item, Mapping) or item.get("type") not in MODEL_CONDITIONS:
            continue
        out.append(
            Condition(
                str(item.get("type")),
                item.get("status") == "True",
                str(item.get("reason") or ""),
                str(item.get("message") or ""),
            )
        )
    return tuple(out)


def model_state_from_k8s(
    model: Mapping[str, Any],
    *,
    deployment: Mapping[str, Any] | None,
    pods: Sequence[JSON],
    service: Mapping[str, Any] | None,
    cache_ready: bool = True,
) -> ModelState:
    """A Model as the core sees it, its phase derived from its Deployment and pods."""
    spec = _get(model, "spec") or {}
    status = _get(model, "status") or {}
    gpu = spec.get("gpu") or {}
    serverless = spec.get("serverless") or {}
    shared = status.get("sharedGroup") or {}
    name = name_of(model)

    try:
        recorded = Phase(status.get("phase") or Phase.IDLE.value)
    except ValueError:
        recorded = Phase.IDLE
    live = live_pods(pods)
    failed = bool(pods) and all(_get(p, "status", "phase") == "Failed" for p in pods)
    phase = observed_phase(
        recorded,
        replicas=deployment_replicas(deployment) or 0,
        pods=len(live),
        ready_pods=sum(1 for p in live if pod_is_ready(p)),
        failed=failed,
    )
    state_value = shared.get("state")
    shared_state = state_value if state_value in ("Active", "Queued") else None
    queue_position = shared.get("queuePosition")
    annotations = _get(service, "metadata", "annotations") or {}
    return ModelState(
        name=name,
        namespace=namespace_of(model) or "default",
        group=str(gpu.get("shared") or ""),
        priority=_int(gpu.get("priority"), 100),
        phase=phase,
        last_active=parse_time(status.get("lastActiveTime")),
        shared_state=shared_state,
        preempted_at=parse_time(shared.get("preemptedAt")),
        swap_cooldown=(
            None
            if gpu.get("swapCooldown") in (None, "")
            else parse_duration(str(gpu["swapCooldown"]), field=f"{name}.spec.gpu.swapCooldown")
        ),
        force_promotion=bool(gpu.get("forcePromotion", False)),
        serverless=Serverless(
            enabled=bool(serverless.get("enabled", True)),
            min_replicas=_int(serverless.get("minReplicas"), 0),
            idle_timeout=_duration(
                serverless.get("idleTimeout"),
                timedelta(minutes=5),
                field=f"{name}.spec.serverless.idleTimeout",
            ),
            cold_start_timeout=_duration(
                serverless.get("coldStartTimeout"),
                timedelta(seconds=60),
                field=f"{name}.spec.serverless.coldStartTimeout",
            ),
        ),
        service_labels=tuple(str(s) for s in spec.get("serviceLabels") or ()),
        cache_ready=cache_ready,
        queue_position=queue_position if isinstance(queue_position, int) else None,
        preempted_by=shared.get("preemptedBy") if "preemptedBy" in shared else None,
        conditions=_conditions_from_k8s(status.get("conditions")),
        replicas=deployment_replicas(deployment),
        active_services=(
            str(annotations[ACTIVE_SERVICES_ANNOTATION])
            if service is not None and ACTIVE_SERVICES_ANNOTATION in annotations
            else None
        ),
    )


def model_cache_ref(model: Mapping[str, Any]) -> str:
    return str(_get(model, "spec", "cache", "modelCacheRef") or "")


def model_cache_is_ready(cache: Mapping[str, Any] | None) -> bool:
    return cache is not None and bool(_get(cache, "status", "ready"))


def merge_conditions(
    existing: Any,
    wanted: Iterable[Condition],
    *,
    now: datetime,
    generation: int | None,
) -> list[JSON]:
    """The full conditions list: ours replaced in place, others kept, new ones appended,
    transition times preserved. Keeping the order makes merges by different writers
    (the election and the workload reconciler share a Model's conditions) agree, so
    neither sees the other's write as a change to undo."""
    current = [c for c in existing or [] if isinstance(c, Mapping)]
    by_type = {c.get("type"): c for c in current}
    ours = []
    for condition in wanted:
        status = "True" if condition.status else "False"
        previous = by_type.get(condition.type)
        transition = (
            previous.get("lastTransitionTime")
            if previous is not None
            and previous.get("status") == status
            and previous.get("lastTransitionTime")
            else format_time(now.replace(microsecond=0))
        )
        entry: JSON = {
            "type": condition.type,
            "status": status,
            "reason": condition.reason,
            "message": condition.message,
            "lastTransitionTime": transition,
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        ours.append(entry)
    by_wanted = {c["type"]: c for c in ours}
    merged: list[JSON] = []
    for item in current:
        kind = str(item.get("type"))
        merged.append(by_wanted.pop(kind) if kind in by_wanted else dict(item))
    return merged + [c for c in ours if c["type"] in by_wanted]


def model_status(
    model: Mapping[str, Any], member: MemberDecision, *, group: str, now: datetime
) -> JSON:
    """The status fields the controller owns on a Model, as a merge patch body."""
    generation = _get(model, "metadata", "generation")
    generation = generation if isinstance(generation, int) else None
    status: JSON = {
        "phase": member.phase.value,
        "message": member.message,
        "conditions": merge_conditions(
            _get(model, "status", "conditions"), member.conditions, now=now, generation=generation
        ),
        "sharedGroup": {
            "groupName": group or None,
            "state": member.state.value,
            "queuePosition": member.queue_position,
            "preemptedBy": member.preempted_by,
            "preemptedAt": format_time(member.preempted_at),
        },
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def model_status_stale(model: Mapping[str, Any], member: MemberDecision, *, group: str) -> bool:
    """What `GroupDecision.changes` cannot see: the recorded phase, generation and group."""
    status = _get(model, "status") or {}
    generation = _get(model, "metadata", "generation")
    return (
        status.get("phase") != member.phase.value
        or status.get("message") != member.message
        or (isinstance(generation, int) and status.get("observedGeneration") != generation)
        or (_get(status, "sharedGroup", "groupName") or "") != group
    )


def model_state_group(model: Mapping[str, Any]) -> str:
    """`spec.gpu.shared`: the shared group a Model belongs to ("" for none)."""
    return str(_get(model, "spec", "gpu", "shared") or "")


# --- GPU leases ------------------------------------------------------------------------


def gpu_lease_from_k8s(obj: Mapping[str, Any]) -> GpuLease | None:
    """A `GPULease`; None when it names no group."""
    spec = _get(obj, "spec") or {}
    group = str(spec.get("group") or "")
    if not group:
        return None
    return GpuLease(
        name=name_of(obj),
        group=group,
        namespace=namespace_of(obj) or "default",
        owner=str(spec.get("owner") or ""),
        node=str(spec.get("node") or ""),
        expires_at=parse_time(spec.get("expiresAt")),
        source=LeaseSource.GPU_LEASE,
    )


def gpu_lease_from_config_map(obj: Mapping[str, Any]) -> GpuLease | None:
    """The legacy `gpu-lease-<group>` ConfigMap; the group comes from data, else the label."""
    data = _get(obj, "data") or {}
    labels = _get(obj, "metadata", "labels") or {}
    group = str(data.get("group") or labels.get(GPU_LEASE_LABEL) or "")
    if not group:
        return None
    return GpuLease(
        name=name_of(obj),
        group=group,
        namespace=namespace_of(obj) or "default",
        owner=str(data.get("owner") or ""),
        node=str(data.get("node") or ""),
        expires_at=parse_time(data.get("expiresAt")),
        source=LeaseSource.CONFIG_MAP,
    )


# --- GPUGroup --------------------------------------------------------------------------


def demand_from_annotation(
    value: Any, *, now: datetime
) -> tuple[int, datetime | None, datetime | None] | None:
    """(queued, oldestWaiting, reportedAt) from a demand annotation; None if unreadable.

    A report older than five minutes counts as no demand (a proxy that died with a
    queue), as docs/resources.md says.
    """
    try:
        body = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(body, Mapping):
        return None
    queued = body.get("queued")
    if isinstance(queued, bool) or not isinstance(queued, int) or queued < 0:
        return None
    reported = parse_time(body.get("reportedAt"))
    if reported is not None and now - reported > DEMAND_STALE_AFTER:
        return (0, None, reported)
    oldest = parse_time(body.get("oldestWaiting")) if queued > 0 else None
    return (queued, oldest, reported)


def gpu_group_state_from_k8s(
    group: Mapping[str, Any],
    *,
    model_deployments: Mapping[str, Mapping[str, Any]],
    member_pods: Mapping[str, Sequence[JSON]],
    now: datetime,
) -> GpuGroupState:
    """A GPUGroup with its members' ModelDeployments, pods and the proxy's demand."""
    spec = _get(group, "spec") or {}
    status = _get(group, "status") or {}
    annotations = _get(group, "metadata", "annotations") or {}
    policy = spec.get("scalingPolicy") or {}
    anti = spec.get("antiThrashing") or {}
    recorded = {
        str(s.get("name")): s for s in status.get("modelStatuses") or [] if isinstance(s, Mapping)
    }
    members = []
    for entry in spec.get("models") or []:
        name = str(entry.get("name") or "")
        if not name:
            continue
        md = model_deployments.get(name)
        demand = demand_from_annotation(
            annotations.get(DEMAND_ANNOTATION_PREFIX + name), now=now
        ) or (0, None, None)
        pods = live_pods(member_pods.get(name, ()))
        row = recorded.get(name) or {}
        members.append(
            GpuGroupMember(
                name=name,
                priority=_int(entry.get("priority"), 100),
                queued=demand[0],
                oldest_waiting=demand[1],
                last_request=parse_time(_get(md, "status", "lastAccessTime")),
                idle_timeout=timedelta(
                    seconds=_int(_get(md, "spec", "idleTimeoutSeconds"), 300)
                ),
                preempted_at=parse_time(row.get("preemptedAt")),
                preempted_by=str(row.get("preemptedBy") or ""),
                exists=md is not None,
                has_pods=bool(pods),
                ready=any(pod_is_ready(p) for p in pods),
            )
        )
    return GpuGroupState(
        name=name_of(group),
        namespace=namespace_of(group) or "default",
        members=tuple(members),
        current_model=str(status.get("activeModel") or "") or None,
        last_swap_time=parse_time(status.get("lastSwapTime")),
        last_swap_reason=str(status.get("lastSwapReason") or ""),
        swap_count=_int(status.get("swapCount"), 0),
        preemption_policy=str(policy.get("preemptionPolicy") or "Graceful"),
        drain_timeout=timedelta(seconds=_int(policy.get("drainTimeoutSeconds"), 60)),
        anti_thrashing=AntiThrashing(
            enabled=bool(anti.get("enabled", True)),
            hysteresis_window=timedelta(seconds=_int(anti.get("hysteresisWindowSeconds"), 10)),
            request_queue_threshold=_int(anti.get("requestQueueThreshold"), 3),
            minimum_run_duration=timedelta(
                seconds=_int(anti.get("minimumRunDurationSeconds"), 30)
            ),
            cooldown_after_preemption=timedelta(
                seconds=_int(anti.get("cooldownAfterPreemptionSeconds"), 60)
            ),
        ),
    )


def demand_reports_expire_at(
    group: Mapping[str, Any], *, now: datetime
) -> datetime | None:
    """When the next live demand report goes stale (the decision changes then)."""
    annotations = _get(group, "metadata", "annotations") or {}
    times = []
    for key, value in annotations.items():
        if not str(key).startswith(DEMAND_ANNOTATION_PREFIX):
            continue
        demand = demand_from_annotation(value, now=now)
        if demand is not None and demand[0] > 0 and demand[2] is not None:
            times.append(demand[2] + DEMAND_STALE_AFTER + timedelta(milliseconds=1))
    return min((t for t in times if t > now), default=None)


def gpu_group_status(
    group: Mapping[str, Any], decision: GpuGroupDecision, *, now: datetime
) -> JSON:
    """The GPUGroup status the decision describes (everything the controller owns)."""
    generation = _get(group, "metadata", "generation")
    generation = generation if isinstance(generation, int) else None
    draining = decision.phase is GpuGroupPhase.DRAINING
    ready = decision.phase is GpuGroupPhase.ACTIVE
    status: JSON = {
        "phase": decision.phase.value,
        "message": decision.message,
        "activeModel": decision.active_model or "",
        "pendingModel": decision.active_model if draining else None,
        "drainStartedAt": format_time(decision.last_swap_time) if draining else None,
        "lastSwapTime": format_time(decision.last_swap_time),
        "lastSwapReason": decision.last_swap_reason or None,
        "swapCount": decision.swap_count,
        "modelStatuses": [
            {
                "name": s.name,
                "state": s.state.value,
                "queuedRequests": s.queued_requests,
                "queuedSince": format_time(s.queued_since),
                "preemptedAt": format_time(s.preempted_at),
                "preemptedBy": s.preempted_by or None,
            }
            for s in decision.member_statuses
        ],
        "conditions": merge_conditions(
            _get(group, "status", "conditions"),
            [Condition("Ready", ready, decision.reason, decision.message)],
            now=now,
            generation=generation,
        ),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def model_deployment_status(
    md: Mapping[str, Any], *, replicas: int | None, pods: Sequence[JSON]
) -> JSON:
    """A ModelDeployment's observed status: Running once a pod is ready, Pending while
    its pods start, Idle at zero replicas (its `lastAccessTime` is the proxy's)."""
    ready = _ready_pods(pods)
    if ready:
        phase, message = "Running", f"{ready} pod(s) ready"
    elif replicas:
        phase, message = "Pending", "waiting for its pods to be ready"
    else:
        phase, message = "Idle", "scaled to zero"
    status: JSON = {"phase": phase, "message": message, "readyReplicas": ready}
    generation = _get(md, "metadata", "generation")
    if isinstance(generation, int):
        status["observedGeneration"] = generation
    return status


# --- standalone ModelDeployment ---------------------------------------------------------


def model_deployment_group_ref(md: Mapping[str, Any]) -> str:
    """`spec.gpuGroupRef` ("" for a standalone ModelDeployment)."""
    return str(_get(md, "spec", "gpuGroupRef") or "")


def _ready_pods(pods: Sequence[JSON]) -> int:
    return sum(
        1
        for p in live_pods(pods)
        if pod_is_ready(p) and not _get(p, "metadata", "deletionTimestamp")
    )


def standalone_from_k8s(
    md: Mapping[str, Any], *, deployment: Mapping[str, Any] | None, pods: Sequence[JSON]
) -> StandaloneDeployment:
    """A standalone ModelDeployment with its Deployment's replicas and ready pods."""
    spec = _get(md, "spec") or {}
    return StandaloneDeployment(
        name=name_of(md),
        namespace=namespace_of(md) or "default",
        replicas=_int(spec.get("replicas"), 1),
        min_replicas=_int(spec.get("minReplicas"), 0),
        idle_timeout=timedelta(seconds=_int(spec.get("idleTimeoutSeconds"), 300)),
        cold_start_timeout=timedelta(seconds=_int(spec.get("coldStartTimeoutSeconds"), 60)),
        last_access_time=parse_time(_get(md, "status", "lastAccessTime")),
        current_replicas=deployment_replicas(deployment),
        ready_replicas=_ready_pods(pods),
    )


def standalone_status(
    md: Mapping[str, Any],
    decision: StandaloneDecision,
    *,
    replicas: int | None,
    pods: Sequence[JSON],
    now: datetime,
) -> JSON:
    """The observed phase and readyReplicas, with the decision's message and Ready condition."""
    status = model_deployment_status(md, replicas=replicas, pods=pods)
    generation = status.get("observedGeneration")
    status["message"] = decision.message
    status["conditions"] = merge_conditions(
        _get(md, "status", "conditions"),
        [Condition("Ready", status["phase"] == "Running", decision.reason, decision.message)],
        now=now,
        generation=generation if isinstance(generation, int) else None,
    )
    return status


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def status_differs(current: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """Whether writing `wanted` (a merge patch; None deletes) would change `current`."""
    current = current or {}
    for key, value in wanted.items():
        if _without_nulls(value) != _without_nulls(current.get(key)):
            if value is None and key not in current:
                continue
            return True
    return False


def is_shared_state(value: Any) -> bool:
    return value in (SharedState.ACTIVE.value, SharedState.QUEUED.value)
