"""The informer cache without a cluster: ordering by resourceVersion, write-through."""

from __future__ import annotations

from typing import Any

from flexinfer_kube.informers import Store
from flexinfer_kube.resources import MODELS


def obj(name: str, version: int, *, namespace: str = "ns", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace,
                         "resourceVersion": str(version)}, **extra}


def test_a_watch_event_older_than_our_own_write_is_dropped() -> None:
    store = Store(MODELS)
    store.apply_event("ADDED", obj("a", 1, status={"phase": "Ready"}))
    store.write_through(obj("a", 5, status={"phase": "Preempted"}))
    assert store.apply_event("MODIFIED", obj("a", 3, status={"phase": "Ready"})) is None
    assert store.get("ns", "a")["status"]["phase"] == "Preempted"  # type: ignore[index]
    change = store.apply_event("MODIFIED", obj("a", 5, status={"phase": "Preempted"}))
    assert change is not None  # the same version from the server replaces ours


def test_a_relist_replaces_its_namespace_and_reports_the_differences() -> None:
    store = Store(MODELS)
    store.apply_event("ADDED", obj("a", 1))
    store.apply_event("ADDED", obj("gone", 2))
    store.apply_event("ADDED", obj("other", 3, namespace="elsewhere"))
    store.write_through(obj("a", 9))
    changes = store.replace([obj("a", 7), obj("new", 8)], namespace="ns")
    names = {(old and old["metadata"]["name"], new and new["metadata"]["name"])
             for old, new in changes}
    assert names == {("gone", None), (None, "new")}
    assert store.get("ns", "a")["metadata"]["resourceVersion"] == "9"  # type: ignore[index]
    assert store.get("elsewhere", "other") is not None  # another namespace's informer


def test_delete_removes_and_reports_once() -> None:
    store = Store(MODELS)
    store.apply_event("ADDED", obj("a", 1))
    assert store.apply_event("DELETED", obj("a", 2)) is not None
    assert store.apply_event("DELETED", obj("a", 2)) is None
    assert store.objects() == []
