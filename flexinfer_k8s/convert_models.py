"""Models (v1alpha2) from Kubernetes JSON, and the status the controller writes on them.

`model_state_from_k8s` reads a Model with its Deployment and pods into the core's
`ModelState` (its phase observed from the workload, and why its server fails when
it does; the service labels it advertises from its status: the holder's, i.e.
`sharedGroup.state: Active`, as the proxy reads them); `model_status` turns a
`MemberDecision` into the status merge patch. Pure: no client, no clock (callers
pass `now`). Unreadable optional values fall back to the spec's defaults; a value
the core rejects raises the core's `InvalidFieldError` naming the Model's field
(`spec.gpu.swapCooldown`) and the value stored there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from flexinfer_core import (
    Condition,
    InvalidFieldError,
    MemberDecision,
    ModelState,
    Phase,
    Policy,
    Serverless,
    SpecProblem,
    VramUse,
    observed_phase,
    parse_duration,
)
from flexinfer_core.annotations import IN_FLIGHT_FIELD, parse_in_flight
from flexinfer_core.group import CONDITION_PACKED, PackedStatus
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_k8s.field_names import user_fields
from flexinfer_k8s.pods import deployment_replicas, live_pods, pod_is_ready, server_failure
from flexinfer_k8s.render.policy import quantity_bytes
from flexinfer_k8s.status_diff import generation_of, merge_conditions, recorded_conditions
from flexinfer_kube.objects import JSON, get_path, int_or, name_of, namespace_of

# The conditions the controller owns on a Model; others are left as they are.
MODEL_CONDITIONS = ("Active", "Ready")
# Where each `ModelState` (and `Serverless`) attribute is written on a Model.
MODEL_FIELDS = {
    "priority": "spec.gpu.priority",
    "swap_cooldown": "spec.gpu.swapCooldown",
    "min_replicas": "spec.serverless.minReplicas",
    "idle_timeout": "spec.serverless.idleTimeout",
    "cold_start_timeout": "spec.serverless.coldStartTimeout",
    "last_active": "status.lastActiveTime",
    "preempted_at": "status.sharedGroup.preemptedAt",
    "drain_timeout": "spec.gpu.drainTimeout",
    "in_flight": "status.inFlight.count",
    "in_flight_at": "status.inFlight.reportedAt",
    "draining_since": "status.sharedGroup.drainingSince",
    "vram_budget": "spec.gpu.vramBudget",
    "vram_estimate": "spec.gpu.vramEstimate",
}


def _duration(value: Any, default: timedelta, *, field: str) -> timedelta:
    if value is None or value == "":
        return default
    return parse_duration(str(value), field=field)


def _bytes(gpu: Mapping[str, Any], key: str) -> int | None:
    """`spec.gpu.<key>`, a quantity of bytes (docs/election.md 1.7); None when absent."""
    value = gpu.get(key)
    if value is None or value == "":
        return None
    return quantity_bytes(str(value), field=f"spec.gpu.{key}")


def format_quantity(size: int) -> str:
    """Bytes as the exact quantity with the largest binary unit that divides them
    (`9728Mi`, `24Gi`; plain bytes otherwise): what `status.vram` records."""
    for power, unit in ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        if size and size % 1024**power == 0:
            return f"{size // 1024**power}{unit}"
    return str(size)


def _recorded_vram(status: Mapping[str, Any]) -> VramUse | None:
    """`status.vram` as written (None: absent or unreadable, so it is written again)."""
    vram = status.get("vram")
    if not isinstance(vram, Mapping):
        return None
    try:
        sizes = [
            None if vram.get(k) is None else quantity_bytes(str(vram[k]), field=f"status.vram.{k}")
            for k in ("footprint", "budget", "used")
        ]
        return VramUse(*sizes)
    except InvalidFieldError:
        return None


def model_state_from_k8s(
    model: Mapping[str, Any],
    *,
    deployment: Mapping[str, Any] | None,
    pods: Sequence[JSON],
    cache_ready: bool = True,
) -> ModelState:
    """A Model as the core sees it, its phase derived from its Deployment and pods."""
    spec = get_path(model, "spec") or {}
    status = get_path(model, "status") or {}
    gpu = spec.get("gpu") or {}
    serverless = spec.get("serverless") or {}
    shared = status.get("sharedGroup") or {}
    name = name_of(model)
    # Written by the proxy (docs/election.md 1.6); unreadable reads as nothing in flight.
    in_flight = parse_in_flight(status.get(IN_FLIGHT_FIELD))

    recorded = _phase_or_none(status.get("phase"))
    live = live_pods(pods)
    failed = bool(pods) and all(get_path(p, "status", "phase") == "Failed" for p in pods)
    failure = server_failure(pods)
    phase = observed_phase(
        recorded or Phase.IDLE,
        replicas=deployment_replicas(deployment) or 0,
        pods=len(live),
        ready_pods=sum(1 for p in live if pod_is_ready(p)),
        failed=failed,
        failure=failure,
    )
    state_value = shared.get("state")
    shared_state = state_value if state_value in ("Active", "Queued") else None
    queue_position = shared.get("queuePosition")
    service_labels = tuple(str(s) for s in spec.get("serviceLabels") or ())
    with user_fields(model, MODEL_FIELDS):
        return ModelState(
            name=name,
            namespace=namespace_of(model) or "default",
            group=str(gpu.get("shared") or ""),
            priority=int_or(gpu.get("priority"), Policy.PRIORITY),
            phase=phase,
            last_active=parse_rfc3339(status.get("lastActiveTime")),
            shared_state=shared_state,
            preempted_at=parse_rfc3339(shared.get("preemptedAt")),
            # Absent (the CRD has no default): the controller's --default-swap-cooldown.
            swap_cooldown=(
                None
                if gpu.get("swapCooldown") in (None, "")
                else parse_duration(str(gpu["swapCooldown"]), field="spec.gpu.swapCooldown")
            ),
            force_promotion=bool(gpu.get("forcePromotion", Policy.FORCE_PROMOTION)),
            drain_timeout=_duration(
                gpu.get("drainTimeout"), Policy.DRAIN_TIMEOUT, field="spec.gpu.drainTimeout"
            ),
            in_flight=in_flight.count if in_flight is not None else 0,
            in_flight_at=in_flight.reported_at if in_flight is not None else None,
            draining_since=parse_rfc3339(shared.get("drainingSince")),
            vram_budget=_bytes(gpu, "vramBudget"),
            vram_estimate=_bytes(gpu, "vramEstimate"),
            default_member=gpu.get("default", Policy.DEFAULT_MEMBER) is True,
            serverless=Serverless(
                enabled=bool(serverless.get("enabled", Policy.SERVERLESS_ENABLED)),
                min_replicas=int_or(serverless.get("minReplicas"), Policy.MIN_REPLICAS),
                idle_timeout=_duration(
                    serverless.get("idleTimeout"),
                    Policy.IDLE_TIMEOUT,
                    field="spec.serverless.idleTimeout",
                ),
                cold_start_timeout=_duration(
                    serverless.get("coldStartTimeout"),
                    Policy.COLD_START_TIMEOUT,
                    field="spec.serverless.coldStartTimeout",
                ),
            ),
            service_labels=service_labels,
            cache_ready=cache_ready,
            failure=failure if phase is Phase.FAILED else None,
            queue_position=queue_position if isinstance(queue_position, int) else None,
            preempted_by=shared.get("preemptedBy") if "preemptedBy" in shared else None,
            conditions=recorded_conditions(model, MODEL_CONDITIONS),
            replicas=deployment_replicas(deployment),
            # What its status advertises: the holder its labels, a queued member none.
            active_services=(
                ",".join(service_labels)
                if shared_state == "Active"
                else ""
                if shared_state == "Queued"
                else None
            ),
            recorded_phase=recorded,
            recorded_message=_str_or_none(status.get("message")),
            recorded_group=_str_or_none(shared.get("groupName")),
            recorded_vram=_recorded_vram(status),
            recorded_packed=next(iter(recorded_conditions(model, (CONDITION_PACKED,))), None),
            generation=generation_of(model),
            observed_generation=_int_or_none(status.get("observedGeneration")),
        )


def _phase_or_none(value: Any) -> Phase | None:
    try:
        return Phase(value) if value else None
    except ValueError:
        return None


def _int_or_none(value: Any) -> int | None:
    return None if isinstance(value, bool) or not isinstance(value, int) else value


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def model_cache_ref(model: Mapping[str, Any]) -> str:
    return str(get_path(model, "spec", "cache", "modelCacheRef") or "")


def model_cache_is_ready(cache: Mapping[str, Any] | None) -> bool:
    return cache is not None and bool(get_path(cache, "status", "ready"))


def model_state_group(model: Mapping[str, Any]) -> str:
    """`spec.gpu.shared`: the shared group a Model belongs to ("" for none)."""
    return str(get_path(model, "spec", "gpu", "shared") or "")


def model_status(
    model: Mapping[str, Any],
    member: MemberDecision,
    *,
    group: str,
    now: datetime,
    packed: PackedStatus | None = None,
    handed_over_at: datetime | None = None,
    node: str | None = None,
) -> JSON:
    """The status fields the controller owns on a Model, as a merge patch body; with
    `packed` (a group with a VRAM budget, docs/election.md 1.7) its `Packed` condition
    and `status.vram` too. `handed_over_at`: when the member was given the card, for a
    takeover written later (its `Active` condition turned then). `node` is where its
    Ready pod runs (`status.nodeName`); None leaves the field as it is, so a model
    scaled to 0 keeps naming the node it last served on."""
    generation = generation_of(model)
    conditions: tuple[Condition, ...] = member.conditions
    if packed is not None:
        conditions = (*conditions, packed.condition)
    status: JSON = {
        "phase": member.phase.value,
        "message": member.message,
        "conditions": merge_conditions(
            get_path(model, "status", "conditions"),
            conditions,
            now=now,
            generation=generation,
            turned_at={"Active": handed_over_at} if handed_over_at is not None else None,
        ),
        "sharedGroup": {
            "groupName": group or None,
            "state": member.state.value,
            "queuePosition": member.queue_position,
            "preemptedBy": member.preempted_by,
            "preemptedAt": format_rfc3339(member.preempted_at),
            # None removes it: the drain is over (docs/election.md 1.6).
            "drainingSince": format_rfc3339(member.draining_since),
        },
    }
    if packed is not None:
        # None removes it: the group no longer sets a budget. Each absent size too.
        status["vram"] = (
            None
            if packed.vram is None
            else {
                key: None if size is None else format_quantity(size)
                for key, size in (
                    ("footprint", packed.vram.footprint),
                    ("budget", packed.vram.budget),
                    ("used", packed.vram.used),
                )
            }
        )
    if member.rewrite_last_active is not None:
        status["lastActiveTime"] = format_rfc3339(member.rewrite_last_active)
    if node is not None:
        status["nodeName"] = node
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def unreadable_model_status(
    model: Mapping[str, Any], problem: SpecProblem, *, group: str, now: datetime
) -> JSON:
    """The status of a Model whose spec cannot be read: `Failed`, out of the queue, and
    `Active`/`Ready` False saying which field and why (flexinfer_core.invalid)."""
    generation = generation_of(model)
    status: JSON = {
        "phase": Phase.FAILED.value,
        "message": problem.message,
        "conditions": merge_conditions(
            get_path(model, "status", "conditions"),
            problem.conditions,
            now=now,
            generation=generation,
        ),
        "sharedGroup": {
            "groupName": group or None,
            "state": "Queued",
            "queuePosition": None,
            "preemptedBy": None,
        },
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status
