"""Status documents as merge patches: conditions merged in, and "would this change anything".

`merge_conditions` replaces the conditions the controller owns and keeps the others,
preserving `lastTransitionTime` while a condition's status holds; `recorded_conditions`
reads them back. `status_differs` tells whether a merge patch would change the stored
status, so that a reconcile that changes nothing writes nothing. Pure functions over
JSON; callers pass `now`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from flexinfer_core import Condition
from flexinfer_core.timestamps import format_rfc3339
from flexinfer_kube.objects import JSON, get_path


def merge_conditions(
    existing: Any,
    wanted: Iterable[Condition],
    *,
    now: datetime,
    generation: int | None,
    turned_at: Mapping[str, datetime] | None = None,
) -> list[JSON]:
    """The full conditions list: ours replaced in place, others kept, new ones appended,
    transition times preserved. Keeping the order makes merges by different writers
    (the election and the workload reconciler share a Model's conditions) agree, so
    neither sees the other's write as a change to undo. A condition that turns is
    stamped `now`, or the time `turned_at` gives for its type (a change written
    later than it happened)."""
    current = [c for c in existing or [] if isinstance(c, Mapping)]
    turned = turned_at or {}
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
            else format_rfc3339(turned.get(condition.type, now).replace(microsecond=0))
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


def generation_of(obj: Mapping[str, Any]) -> int | None:
    """`metadata.generation` when it is an integer (what `observedGeneration` records)."""
    generation = (obj.get("metadata") or {}).get("generation")
    return generation if isinstance(generation, int) else None


def recorded_conditions(obj: Mapping[str, Any], types: Iterable[str]) -> tuple[Condition, ...]:
    """The object's conditions of `types` as it records them (without transition times)."""
    wanted = set(types)
    out = []
    for item in get_path(obj, "status", "conditions") or []:
        if not isinstance(item, Mapping) or item.get("type") not in wanted:
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
