"""Does a live object already hold what we would apply? (so an unchanged reconcile writes nothing)

`holds(wanted, live)`: every field `wanted` sets has that value in `live`, which may
have more (API-server defaults, fields users or other controllers add). Lists of
named items (containers, env, ports, volumes, mounts, owner references) are matched
by name, other lists position by position; an empty wanted value matches a missing
one (the API server omits empty fields); quantities compare by value ("1Gi" ==
"1024Mi"). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from kubernetes.utils import quantity

_parse_quantity: Any = quantity.parse_quantity  # untyped in the client

QUANTITY_KEYS = frozenset({"requests", "limits", "sizeLimit", "storage"})


def holds(wanted: Any, live: Any, *, quantities: bool = False) -> bool:
    if wanted in (None, "", {}, []) and live in (None, "", {}, [], False):
        return True
    if isinstance(wanted, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(
            holds(value, live.get(key), quantities=quantities or key in QUANTITY_KEYS)
            for key, value in wanted.items()
        )
    if isinstance(wanted, Sequence) and not isinstance(wanted, str):
        if not isinstance(live, Sequence) or isinstance(live, str):
            return False
        return _list_holds(wanted, live, quantities=quantities)
    if wanted == live:
        return True
    return quantities and _same_quantity(wanted, live)


def _key(item: Any) -> Any:
    if isinstance(item, Mapping) and "name" in item:
        return (item.get("name"), item.get("mountPath"))
    return None


def _list_holds(wanted: Sequence[Any], live: Sequence[Any], *, quantities: bool) -> bool:
    keys = [_key(item) for item in wanted]
    if all(k is not None for k in keys):
        by_key = {_key(item): item for item in live}
        return all(
            k in by_key and holds(item, by_key[k], quantities=quantities)
            for k, item in zip(keys, wanted, strict=True)
        )
    return len(wanted) == len(live) and all(
        holds(a, b, quantities=quantities) for a, b in zip(wanted, live, strict=True)
    )


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        left: Decimal = _parse_quantity(a)
        right: Decimal = _parse_quantity(b)
    except (ValueError, TypeError):
        return False
    return left == right
