"""GPUGroups (v1alpha1) from Kubernetes JSON, and the status the controller writes on them.

`gpu_group_state_from_k8s` reads a GPUGroup with its member ModelDeployments, their
pods and the proxy's demand annotations into the core's `GpuGroupState`;
`gpu_group_status` turns a `GpuGroupDecision` into the status merge patch. The
demand annotations' format and staleness are the core's (`flexinfer_core.annotations`).
Pure: no client, no clock (callers pass `now`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from flexinfer_core import (
    AntiThrashing,
    Condition,
    DemandReport,
    GpuGroupDecision,
    GpuGroupMember,
    GpuGroupPhase,
    GpuGroupState,
    InvalidFieldError,
    MemberState,
    Policy,
    SpecProblem,
    demand_annotation_key,
    parse_demand,
    reasons,
)
from flexinfer_core.durations import seconds_window
from flexinfer_core.gpugroup_packing import GpuGroupPacking
from flexinfer_core.group import CONDITION_PACKED, NO_SHARED_CARD_CONDITION
from flexinfer_core.packing import format_gib
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_k8s.convert_model_deployments import idle_timeout_of
from flexinfer_k8s.convert_models import format_quantity
from flexinfer_k8s.field_names import user_fields
from flexinfer_k8s.pods import live_pods, pod_is_ready
from flexinfer_k8s.render.policy import quantity_bytes
from flexinfer_k8s.status_diff import generation_of, merge_conditions
from flexinfer_kube.objects import JSON, get_path, int_or, name_of, namespace_of


def gpu_group_state_from_k8s(
    group: Mapping[str, Any],
    *,
    model_deployments: Mapping[str, Mapping[str, Any]],
    member_pods: Mapping[str, Sequence[JSON]],
    conflicts: Mapping[str, str] | None = None,
    caches_not_ready: Collection[str] = (),
) -> GpuGroupState:
    """A GPUGroup with its members' ModelDeployments, pods and the proxy's demand.

    `conflicts` maps a listed member the decision leaves out to the reason: its
    GPUGroup membership is in conflict (flexinfer_core.membership), or its own spec
    cannot be read (`InvalidSpec`, see `unreadable_members`). The decision leaves out a
    member in `caches_not_ready` too (its ModelCache is not complete: a pod would mount
    a partial copy). A value of the group's own that no decision can use raises
    `InvalidFieldError` naming the GPUGroup's field.
    """
    spec = get_path(group, "spec") or {}
    status = get_path(group, "status") or {}
    annotations = get_path(group, "metadata", "annotations") or {}
    policy = spec.get("scalingPolicy") or {}
    anti = spec.get("antiThrashing") or {}
    recorded = {
        str(s.get("name")): s for s in status.get("modelStatuses") or [] if isinstance(s, Mapping)
    }
    members = []
    for index, entry in enumerate(spec.get("models") or []):
        name = str(entry.get("name") or "")
        if not name:
            continue
        md = model_deployments.get(name)
        demand = parse_demand(annotations.get(demand_annotation_key(name))) or DemandReport(0)
        pods = live_pods(member_pods.get(name, ()))
        row = recorded.get(name) or {}
        conflict = (conflicts or {}).get(name, "")
        try:
            members.append(
                GpuGroupMember(
                    name=name,
                    priority=int_or(entry.get("priority"), Policy.PRIORITY),
                    queued=demand.queued,
                    oldest_waiting=demand.oldest_waiting,
                    reported_at=demand.reported_at,
                    in_flight=demand.in_flight,
                    last_request=parse_rfc3339(get_path(md, "status", "lastAccessTime")),
                    # A member left out of the decision is never asked how long it idles
                    # (its own spec may be what cannot be read).
                    idle_timeout=(
                        idle_timeout_of(md)
                        if md is not None and not conflict
                        else Policy.IDLE_TIMEOUT
                    ),
                    preempted_at=parse_rfc3339(row.get("preemptedAt")),
                    preempted_by=str(row.get("preemptedBy") or ""),
                    # Recorded Active: it holds a seat on the card (read only by the
                    # packing, docs/election.md 3, so that a packed set is kept as written).
                    seated=row.get("state") == MemberState.ACTIVE.value,
                    exists=md is not None,
                    conflict=conflict,
                    cache_ready=name not in caches_not_ready,
                    has_pods=bool(pods),
                    ready=any(pod_is_ready(p) for p in pods),
                    vram_estimate=_bytes(
                        entry.get("vramEstimate"), f"spec.models[{index}].vramEstimate"
                    ),
                )
            )
        except InvalidFieldError as error:
            if error.attribute != "priority":
                raise
            raise error.renamed(f"spec.models[{index}].priority", entry.get("priority")) from None
    with user_fields(group, GPU_GROUP_FIELDS):
        return GpuGroupState(
            name=name_of(group),
            namespace=namespace_of(group) or "default",
            members=tuple(members),
            vram_budget=_bytes(spec.get("vramBudget"), "spec.vramBudget"),
            current_model=str(status.get("activeModel") or "") or None,
            last_swap_time=parse_rfc3339(status.get("lastSwapTime")),
            last_swap_reason=str(status.get("lastSwapReason") or ""),
            swap_count=int_or(status.get("swapCount"), 0),
            preemption_policy=str(policy.get("preemptionPolicy") or _STATE.preemption_policy),
            drain_timeout=_seconds(
                policy, "spec.scalingPolicy.drainTimeoutSeconds", _STATE.drain_timeout
            ),
            anti_thrashing=AntiThrashing(
                enabled=bool(anti.get("enabled", _ANTI.enabled)),
                hysteresis_window=_seconds(
                    anti, "spec.antiThrashing.hysteresisWindowSeconds", _ANTI.hysteresis_window
                ),
                request_queue_threshold=int_or(
                    anti.get("requestQueueThreshold"), _ANTI.request_queue_threshold
                ),
                minimum_run_duration=_seconds(
                    anti,
                    "spec.antiThrashing.minimumRunDurationSeconds",
                    _ANTI.minimum_run_duration,
                ),
                cooldown_after_preemption=_seconds(
                    anti,
                    "spec.antiThrashing.cooldownAfterPreemptionSeconds",
                    _ANTI.cooldown_after_preemption,
                ),
            ),
        )


# The GPUGroup's own defaults are those of the core's classes (the CRD says the same;
# tests/test_crd_defaults.py checks): used for an object read without them.
_ANTI = AntiThrashing()
_STATE = GpuGroupState(name="defaults")
# Where each `GpuGroupState` (and `AntiThrashing`) attribute is written on a GPUGroup.
GPU_GROUP_FIELDS = {
    "request_queue_threshold": "spec.antiThrashing.requestQueueThreshold",
    "swap_count": "status.swapCount",
}


def _bytes(value: Any, field: str) -> int | None:
    """A quantity of bytes (docs/election.md 1.7); None when absent."""
    if value is None or value == "":
        return None
    return quantity_bytes(str(value), field=field)


def _seconds(block: Mapping[str, Any], path: str, default: timedelta) -> timedelta:
    value = block.get(path.rsplit(".", 1)[1])
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return seconds_window(value, field=path)


def unreadable_members(
    model_deployments: Mapping[str, Mapping[str, Any]],
) -> dict[str, InvalidFieldError]:
    """The member ModelDeployments whose own spec the decision cannot read, with why
    (their field named): the group leaves them out, like a membership conflict."""
    problems: dict[str, InvalidFieldError] = {}
    for name, md in model_deployments.items():
        try:
            idle_timeout_of(md)
        except InvalidFieldError as error:
            problems[name] = error
    return problems


def _packed(
    group: Mapping[str, Any],
    decision: GpuGroupDecision,
    state: GpuGroupState | None,
    packing: GpuGroupPacking | None,
) -> tuple[list[Condition], JSON | None, dict[str, str | None]]:
    """The `Packed` condition, `status.vram` and each member's footprint of a GPUGroup
    that sets `spec.vramBudget` (or once did), docs/election.md 3, "Packing". `packing`:
    the decision's packing as it reads once written (`settled_packing`), None when the
    cluster cannot put two servers on one card (no `--gpu-device-class`): its members
    then take turns, which the condition says. Nothing for a group that never set one."""
    budget = state.vram_budget if state is not None else None
    had = any(
        isinstance(c, Mapping) and c.get("type") == CONDITION_PACKED
        for c in get_path(group, "status", "conditions") or []
    )
    if budget is None or state is None:
        if not had:
            return [], None, {}
        said = "the GPUGroup sets no spec.vramBudget: its members take turns one at a time"
        return [Condition(CONDITION_PACKED, False, reasons.NO_VRAM_BUDGET, said)], None, {}
    footprints = {
        m.name: None if m.vram_estimate is None else format_quantity(m.vram_estimate)
        for m in state.members
    }
    holder = state.member(decision.active_model) if decision.active_model else None
    used = packing.used if packing is not None and packing.used else None
    if used is None and holder is not None:
        used = holder.vram_estimate  # alone: what it takes, when known
    vram: JSON = {
        "budget": format_quantity(budget),
        "used": format_quantity(used) if used else None,
    }
    condition: Condition
    if packing is None:
        condition = NO_SHARED_CARD_CONDITION
    elif holder is None:
        condition = Condition(
            CONDITION_PACKED,
            False,
            reasons.QUEUED,
            f"no member holds the card; the budget is {format_gib(budget)} GiB",
        )
    elif not packing.used:
        condition = Condition(
            CONDITION_PACKED, False, reasons.EXCLUSIVE, packing.seat(holder.name).message
        )
    else:
        fits = f"fits: {format_gib(packing.used)} of {format_gib(budget)} GiB used"
        words = [
            f"{', '.join(packing.holders)} hold the card together: {fits}"
            if packing.packed
            else f"{holder.name} holds the card: {fits}"
        ]
        words += [
            seat.message
            for seat in packing.seats
            if seat.reason == reasons.WAITING_FOR_VRAM and seat.message
        ]
        condition = Condition(
            CONDITION_PACKED,
            True,
            reasons.CO_RESIDENT if packing.packed else reasons.FITS,
            "; ".join(words),
        )
    return [condition], vram, footprints


def gpu_group_status(
    group: Mapping[str, Any],
    decision: GpuGroupDecision,
    *,
    now: datetime,
    state: GpuGroupState | None = None,
    packing: GpuGroupPacking | None = None,
) -> JSON:
    """The GPUGroup status the decision describes (everything the controller owns);
    `state`: the group as read, for its VRAM budget and footprints; `packing`: how a
    budgeted group's members share the card (`settled_packing`), None when they cannot
    (no shared card: they take turns)."""
    generation = generation_of(group)
    packed, vram, footprints = _packed(group, decision, state, packing)
    draining = decision.phase is GpuGroupPhase.DRAINING
    ready = decision.phase is GpuGroupPhase.ACTIVE
    status: JSON = {
        "phase": decision.phase.value,
        "message": decision.message,
        "activeModel": decision.active_model or "",
        "pendingModel": decision.active_model if draining else None,
        "drainStartedAt": format_rfc3339(decision.last_swap_time) if draining else None,
        "lastSwapTime": format_rfc3339(decision.last_swap_time),
        "lastSwapReason": decision.last_swap_reason or None,
        "swapCount": decision.swap_count,
        "modelStatuses": [
            {
                "name": s.name,
                "state": s.state.value,
                "queuedRequests": s.queued_requests,
                "queuedSince": format_rfc3339(s.queued_since),
                "preemptedAt": format_rfc3339(s.preempted_at),
                "preemptedBy": s.preempted_by or None,
                **({"footprint": footprints.get(s.name)} if footprints else {}),
            }
            for s in decision.member_statuses
        ],
        "conditions": merge_conditions(
            get_path(group, "status", "conditions"),
            [Condition("Ready", ready, decision.reason, decision.message), *packed],
            now=now,
            generation=generation,
        ),
    }
    if vram is not None or packed:
        status["vram"] = vram
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def unreadable_group_status(
    group: Mapping[str, Any], problem: SpecProblem, *, now: datetime
) -> JSON:
    """The status of a GPUGroup whose own spec cannot be read: `Failed` and `Ready=False`
    saying which field and why; what it recorded of its members is left as it is."""
    generation = generation_of(group)
    status: JSON = {
        "phase": GpuGroupPhase.FAILED.value,
        "message": problem.message,
        "conditions": merge_conditions(
            get_path(group, "status", "conditions"),
            problem.conditions,
            now=now,
            generation=generation,
        ),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status
