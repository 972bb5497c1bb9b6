"""Groups as the controller recorded them in status, shaped as JSON for people.

One shaping, read alike by `flexinfer status -o json` (its `recorded` list) and the
proxy's live page (`GET /status.json`): per shared group (Models with `spec.gpu.shared`)
and per GPUGroup, who holds the card, each member's phase, `sharedGroup` state, queue
position, message and conditions, exactly as the controller wrote them. Nothing is
decided here: a phase this module has never heard of (a new member state) is shown as
it is, so the page follows what the controller writes without a change here.

The holder is the one member the status calls `Active` (a GPUGroup's
`status.activeModel`). A swap writes two statuses one after the other, so a reading
between them may show two `Active` members: then `holder` is None and `active` names
both (readers that follow holders over time skip such a reading).

Pure functions over Kubernetes JSON: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flexinfer_kube.objects import JSON, get_path, gpu_group_member_names, object_key

# What a member's `reason` is read from, first found wins: a shared Model's `Active`
# condition carries the election's explain reason; a GPUGroup member has `Ready` only.
REASON_CONDITIONS = ("Active", "Ready")
# Conditions shown per object; the controller writes two or three, a hostile status
# could carry more (the CRD leaves the list open): a page must not grow with it.
MAX_CONDITIONS = 8


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def conditions_of(obj: Mapping[str, Any]) -> list[JSON]:
    """`status.conditions`, each as type/status/reason/message/lastTransitionTime."""
    rows = []
    for item in get_path(obj, "status", "conditions") or []:
        if not isinstance(item, Mapping):
            continue
        rows.append(
            {
                "type": _text(item.get("type")),
                "status": _text(item.get("status")),
                "reason": _text(item.get("reason")),
                "message": _text(item.get("message")),
                "lastTransitionTime": _text(item.get("lastTransitionTime")) or None,
            }
        )
        if len(rows) == MAX_CONDITIONS:
            break
    return rows


def _reason(conditions: list[JSON]) -> str:
    for wanted in REASON_CONDITIONS:
        for condition in conditions:
            if condition["type"] == wanted:
                return str(condition["reason"])
    return ""


def member_row(obj: Mapping[str, Any]) -> JSON:
    """One Model or ModelDeployment as its status says (kind from the object)."""
    conditions = conditions_of(obj)
    shared = get_path(obj, "status", "sharedGroup") or {}
    return {
        "name": object_key(obj)[1],
        "kind": _text(obj.get("kind")),
        "phase": _text(get_path(obj, "status", "phase")) or None,
        "state": _text(get_path(shared, "state")) or None,
        "queuePosition": _int_or_none(get_path(shared, "queuePosition")),
        "preemptedBy": _text(get_path(shared, "preemptedBy")) or None,
        "reason": _reason(conditions),
        "message": _text(get_path(obj, "status", "message")),
        "conditions": conditions,
    }


def _holder_then_queue(member: JSON) -> tuple[bool, int, str]:
    position = member["queuePosition"]
    unplaced = 1 << 30
    return (member["state"] != "Active", unplaced if position is None else position, member["name"])


def shared_group_rows(models: Iterable[Mapping[str, Any]]) -> list[JSON]:
    """Per (namespace, `spec.gpu.shared`) of the Models given: holder and members."""
    groups: dict[tuple[str, str], list[JSON]] = {}
    for model in models:
        group = _text(get_path(model, "spec", "gpu", "shared"))
        if group:
            groups.setdefault((object_key(model)[0], group), []).append(member_row(model))
    rows = []
    for (namespace, group), members in sorted(groups.items()):
        members.sort(key=_holder_then_queue)
        active = [m["name"] for m in members if m["state"] == "Active"]
        holder = active[0] if len(active) == 1 else None
        rows.append(
            {
                "kind": "SharedGroup",
                "namespace": namespace,
                "name": group,
                "holder": holder,
                "active": active,
                "phase": next((m["phase"] for m in members if m["name"] == holder), None),
                "reason": next((m["reason"] for m in members if m["name"] == holder), ""),
                "message": next((m["message"] for m in members if m["name"] == holder), ""),
                "members": members,
            }
        )
    return rows


def gpu_group_row(group: Mapping[str, Any], members: Mapping[str, Mapping[str, Any]]) -> JSON:
    """A GPUGroup's status, its listed members (`members`: name → ModelDeployment, those
    of its namespace) each with what the group and its own status say."""
    namespace, name = object_key(group)
    conditions = conditions_of(group)
    by_name = {
        _text(s.get("name")): s
        for s in get_path(group, "status", "modelStatuses") or []
        if isinstance(s, Mapping)
    }
    rows = []
    for member in gpu_group_member_names(group):
        # A member listed but not (yet) seen has the same fields, empty.
        unseen = {"kind": "ModelDeployment", "metadata": {"name": member}}
        row = member_row(members.get(member) or unseen)
        recorded = by_name.get(member) or {}
        row["state"] = _text(recorded.get("state")) or None
        row["queuedRequests"] = _int_or_none(recorded.get("queuedRequests"))
        row["queuedSince"] = _text(recorded.get("queuedSince")) or None
        row["preemptedBy"] = _text(recorded.get("preemptedBy")) or None
        rows.append(row)
    active = _text(get_path(group, "status", "activeModel"))
    return {
        "kind": "GPUGroup",
        "namespace": namespace,
        "name": name,
        "holder": active or None,
        "active": [active] if active else [],
        "phase": _text(get_path(group, "status", "phase")) or None,
        "reason": _reason(conditions),
        "message": _text(get_path(group, "status", "message")),
        "conditions": conditions,
        "lastSwapTime": _text(get_path(group, "status", "lastSwapTime")) or None,
        "lastSwapReason": _text(get_path(group, "status", "lastSwapReason")) or None,
        "swapCount": _int_or_none(get_path(group, "status", "swapCount")),
        "members": rows,
    }


def recorded_groups(
    *,
    models: Iterable[Mapping[str, Any]],
    gpu_groups: Iterable[Mapping[str, Any]],
    model_deployments: Iterable[Mapping[str, Any]],
) -> list[JSON]:
    """Every shared group, then every GPUGroup, each sorted by (namespace, name)."""
    deployments: dict[str, dict[str, Mapping[str, Any]]] = {}
    for md in model_deployments:
        namespace, name = object_key(md)
        deployments.setdefault(namespace, {})[name] = md
    rows = shared_group_rows(models)
    for group in sorted(gpu_groups, key=object_key):
        rows.append(gpu_group_row(group, deployments.get(object_key(group)[0], {})))
    return rows
