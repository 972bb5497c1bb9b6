"""Small readers of Kubernetes JSON (plain dicts, as the API returns them).

A path lookup that tolerates missing or mistyped levels, an object's name,
namespace and key, an integer field read with its default, and the two fields
GPUGroup membership is decided from (`spec.models[].name` of a GPUGroup,
`spec.gpuGroupRef` of a ModelDeployment), read alike by the controller and the
proxy. No decisions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

JSON = dict[str, Any]
Key = tuple[str, str]


def get_path(obj: Mapping[str, Any] | None, *path: str) -> Any:
    """`obj[path[0]][path[1]]...`, or None where a level is missing or not a mapping."""
    value: Any = obj
    for part in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def name_of(obj: Mapping[str, Any]) -> str:
    return str(get_path(obj, "metadata", "name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str(get_path(obj, "metadata", "namespace") or "")


def object_key(obj: Mapping[str, Any]) -> Key:
    """(namespace, name)."""
    return (namespace_of(obj), name_of(obj))


def gpu_group_member_names(group: Mapping[str, Any]) -> tuple[str, ...]:
    """The ModelDeployments a GPUGroup lists in `spec.models[].name`, in its order."""
    entries = get_path(group, "spec", "models")
    if not isinstance(entries, list):
        return ()
    names = (get_path(entry, "name") for entry in entries)
    return tuple(str(name) for name in names if name)


def gpu_group_listings(groups: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """GPUGroup name -> the names it lists, for the groups of one namespace."""
    return {name_of(group): gpu_group_member_names(group) for group in groups}


def gpu_group_ref(model_deployment: Mapping[str, Any]) -> str:
    """A ModelDeployment's `spec.gpuGroupRef` ("" for none)."""
    return str(get_path(model_deployment, "spec", "gpuGroupRef") or "")


def int_or(value: Any, default: int) -> int:
    """`value` if it is an integer (a bool is not), else `default`."""
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value
