"""Groups as the controller recorded them in status, shaped as JSON for people.

One shaping, read alike by `flexinfer status -o json` (its `recorded` list) and the
proxy's live page (`GET /status.json`): per shared group (Models with `spec.gpu.shared`)
and per GPUGroup, who holds the card, each member's phase, `sharedGroup` state, queue
position, message and conditions, exactly as the controller wrote them. Nothing is
decided here: a phase this module has never heard of (a new member state) is shown as
it is, so the page follows what the controller writes without a change here.

The holders are the members the status calls `Active`, or while no member is called
so, the one the latest eviction names (`card_holders`). A group with a VRAM budget
(docs/election.md 1.7) may be held by several members at once: when every `Active`
member's `Packed` condition is True and their footprints (`status.vram.footprint`)
together fit the budget, the reading is a packed one: `packed` is True, `active` lists
them all (the leader first) and `holder` is the leader, the one whose `Active` reason
is not `CoResident`. Otherwise two `Active` members are a swap half written (statuses
are written one after the other): `holder` is None and `active` names both (readers
that follow holders over time skip such a reading). A GPUGroup's holder is its
`status.activeModel`; when its `Packed` condition is True (docs/election.md 3,
"Packing"), every member its `modelStatuses` call `Active` holds the card beside it
(`packed`, the leader first): one status, written at once, never half written.

Pure functions over Kubernetes JSON: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from flexinfer_core import reasons
from flexinfer_core.group import CONDITION_PACKED, latest_eviction
from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_kube.objects import JSON, get_path, gpu_group_member_names, object_key

# What a member's `reason` is read from, first found wins: a shared Model's `Active`
# condition carries the election's explain reason; a GPUGroup member has `Ready` only.
REASON_CONDITIONS = ("Active", "Ready")
# Conditions shown per object; the controller writes two or three, a hostile status
# could carry more (the CRD leaves the list open): a page must not grow with it.
MAX_CONDITIONS = 8
# What `status.vram` quantities are written as (the controller's exact binary units).
_BINARY_UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
                 "Ei": 2**60}  # fmt: skip


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
        # docs/election.md 1.7: what this member takes on the card, as written.
        "footprint": _text(get_path(obj, "status", "vram", "footprint")) or None,
    }


def _eviction_stamp(obj: Mapping[str, Any]) -> datetime | None:
    """When a member was evicted, as its status says: `preemptedAt` while it is
    Preempted, `drainingSince` while it drains; None for any other member."""
    phase = get_path(obj, "status", "phase")
    field = {"Preempted": "preemptedAt", "Draining": "drainingSince"}.get(str(phase))
    if field is None:
        return None
    return parse_rfc3339(get_path(obj, "status", "sharedGroup", field))


def card_holders(models: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The members of one shared group (or one Model alone) that hold its card, as
    their statuses say: those whose `sharedGroup.state` is Active (several in a packed
    group, docs/election.md 1.7: the proxy routes to each). While none says so
    (a new holder's status may follow its handover by the controller's
    --status-coalesce-seconds, docs/controller.md), the member the latest eviction
    names in `preemptedBy`: the evicted member's status is written at the handover."""
    members = list(models)
    active = frozenset(
        str(get_path(m, "metadata", "name"))
        for m in members
        if get_path(m, "status", "sharedGroup", "state") == "Active"
    )
    if active:
        return active
    names = {str(get_path(m, "metadata", "name")) for m in members}
    evictions = [
        (stamp, str(get_path(m, "status", "sharedGroup", "preemptedBy") or ""))
        for m in members
        if (stamp := _eviction_stamp(m)) is not None
    ]
    named = latest_eviction(evictions, names)
    return frozenset() if named is None else frozenset({named[0]})


def _queue_order(member: JSON) -> tuple[int, str]:
    position = member["queuePosition"]
    return (1 << 30 if position is None else position, member["name"])


def _bytes(text: Any) -> int | None:
    """A `status.vram` quantity as the controller writes it (`9728Mi`, `24Gi`, plain
    bytes); None for anything else (then nothing is concluded from it)."""
    if not isinstance(text, str):
        return None
    digits = text.rstrip("KMGTPEi")
    unit = _BINARY_UNITS.get(text[len(digits) :])
    if unit is None or not digits.isdigit():
        return None
    return int(digits) * unit


def _packed(obj: Mapping[str, Any]) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("type") == CONDITION_PACKED and c.get("status") == "True"
        for c in get_path(obj, "status", "conditions") or []
    )


# A GPUGroup's `Packed` reasons that the controller writes only when it can pack it
# (`--gpu-device-class` and a budget) and its leader does not hold the card alone.
_SIDE_BY_SIDE = frozenset({reasons.CO_RESIDENT, reasons.FITS, reasons.QUEUED})


def gpu_group_packs(group: Mapping[str, Any]) -> bool:
    """Whether a GPUGroup's status says its members that fit start side by side on the
    card (docs/election.md 3, "Packing"): its condition `Packed` reads `CoResident`,
    `Fits` or `Queued` (nobody holds it yet). Not when the members take turns
    (`NoSharedCard`, `NoVramBudget`, no condition) or the leader holds the card alone
    (`Exclusive`)."""
    return any(
        isinstance(c, Mapping)
        and c.get("type") == CONDITION_PACKED
        and c.get("reason") in _SIDE_BY_SIDE
        for c in get_path(group, "status", "conditions") or []
    )


def packed_leader(models: Iterable[Mapping[str, Any]], holding: frozenset[str]) -> str | None:
    """The leader of a packed reading of one group's statuses (docs/election.md 1.7), or
    None when the reading is not one: several members hold the card, each says
    `Packed` True, their footprints are known and together within the budget their
    statuses give, and exactly one is not `CoResident` (that one leads). Anything
    else with several `Active` members is a change written halfway."""
    holders = [m for m in models if str(get_path(m, "metadata", "name")) in holding]
    if len(holders) < 2 or not all(_packed(m) for m in holders):
        return None
    sizes = [_bytes(get_path(m, "status", "vram", "footprint")) for m in holders]
    budgets = {_bytes(get_path(m, "status", "vram", "budget")) for m in holders}
    if None in sizes or len(budgets) != 1 or (budget := budgets.pop()) is None:
        return None
    if sum(s for s in sizes if s is not None) > budget:
        return None
    leaders = [
        str(get_path(m, "metadata", "name"))
        for m in holders
        if _reason(conditions_of(m)) != reasons.CO_RESIDENT
    ]
    return leaders[0] if len(leaders) == 1 else None


def _vram(objs: list[Mapping[str, Any]], first: str | None) -> JSON | None:
    """The group's budget and what its holders take of it, as `first`'s status (else
    any member's) says; None when no member's status has `vram`."""
    recorded = [
        vram
        for obj in sorted(objs, key=lambda o: str(get_path(o, "metadata", "name")) != first)
        if isinstance(vram := get_path(obj, "status", "vram"), Mapping)
    ]
    if not recorded:
        return None
    return {
        "budget": _text(recorded[0].get("budget")) or None,
        "used": _text(recorded[0].get("used")) or None,
    }


def shared_group_rows(models: Iterable[Mapping[str, Any]]) -> list[JSON]:
    """Per (namespace, `spec.gpu.shared`) of the Models given: holders and members."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for model in models:
        group = _text(get_path(model, "spec", "gpu", "shared"))
        if group:
            groups.setdefault((object_key(model)[0], group), []).append(model)
    rows = []
    for (namespace, group), objs in sorted(groups.items()):
        holding = card_holders(objs)
        leader = packed_leader(objs, holding)
        rows_of = [member_row(obj) for obj in objs]
        members = sorted(
            rows_of,
            key=lambda m: (m["name"] not in holding, m["name"] != leader, *_queue_order(m)),
        )
        active = [m["name"] for m in members if m["name"] in holding]
        holder = active[0] if len(active) == 1 else leader
        rows.append(
            {
                "kind": "SharedGroup",
                "namespace": namespace,
                "name": group,
                "holder": holder,
                "active": active,
                "packed": leader is not None,
                "vram": _vram(objs, holder),
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
        row["footprint"] = _text(recorded.get("footprint")) or None
        rows.append(row)
    leader = _text(get_path(group, "status", "activeModel"))
    vram = get_path(group, "status", "vram")
    # A packed GPUGroup (docs/election.md 3, "Packing"): every member it records Active
    # holds the card, its activeModel leads; the status is one object, written at once,
    # so no half-written reading needs telling apart.
    seated = [row["name"] for row in rows if row["state"] == "Active" and row["name"] != leader]
    packed = bool(leader) and bool(seated) and _packed(group)
    return {
        "kind": "GPUGroup",
        "namespace": namespace,
        "name": name,
        "holder": leader or None,
        "active": ([leader, *seated] if packed else [leader]) if leader else [],
        "packed": packed,
        "vram": {
            "budget": _text(vram.get("budget")) or None,
            "used": _text(vram.get("used")) or None,
        }
        if isinstance(vram, Mapping)
        else None,
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
