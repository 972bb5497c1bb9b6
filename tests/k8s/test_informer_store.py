"""The informer and its cache without a cluster: ordering by resourceVersion,
write-through, handler failures, and what an outage logs."""

from __future__ import annotations

import logging
import time
from typing import Any

from flexinfer_kube.informers import Informer, Store
from flexinfer_kube.kubeapi import Rejected, Transient
from flexinfer_kube.resources import MODELS
from tests.polling import wait_until


def obj(name: str, version: int, *, namespace: str = "ns", **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(version)},
        **extra,
    }


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
    names = {
        (old and old["metadata"]["name"], new and new["metadata"]["name"]) for old, new in changes
    }
    assert names == {("gone", None), (None, "new")}
    assert store.get("ns", "a")["metadata"]["resourceVersion"] == "9"  # type: ignore[index]
    assert store.get("elsewhere", "other") is not None  # another namespace's informer


def test_delete_removes_and_reports_once() -> None:
    store = Store(MODELS)
    store.apply_event("ADDED", obj("a", 1))
    assert store.apply_event("DELETED", obj("a", 2)) is not None
    assert store.apply_event("DELETED", obj("a", 2)) is None
    assert store.objects() == []


class FlakyApi:
    """A KubeApi stand-in: `failures` lists fail (an outage), then lists return `items`;
    watches end at once (the informer lists again)."""

    def __init__(self, failures: int, items: list[dict[str, Any]], error: Exception) -> None:
        self.failures = failures
        self.items = items
        self.error = error
        self.lists = 0

    def list(self, resource: Any, namespace: Any, *, label_selector: Any = None) -> Any:
        self.lists += 1
        if self.lists <= self.failures:
            raise self.error
        return {"metadata": {"resourceVersion": "5"}, "items": [dict(i) for i in self.items]}

    def watch(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return iter(())


def model(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "5"}}


def test_a_handler_that_raises_loses_no_other_notification(caplog: Any) -> None:
    seen: list[str] = []

    def handler(old: Any, new: Any) -> None:
        name = new["metadata"]["name"]
        seen.append(name)
        if name == "a":
            raise RuntimeError("bug in a handler")

    api = FlakyApi(0, [model("a"), model("b"), model("c")], Transient(0, "unused"))
    informer = Informer(
        api,
        MODELS,
        Store(MODELS),
        namespace="ns",  # type: ignore[arg-type]
        on_change=handler,
        max_backoff=0.05,
    )
    informer.start()
    try:
        wait_until(lambda: len(seen) >= 3, what="every notification", timeout=5)
    finally:
        informer.stop()
    assert sorted(seen[:3]) == ["a", "b", "c"]
    assert "change handler failed" in caplog.text


def test_an_outage_logs_one_line_and_is_not_a_refused_lease_read(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="flexinfer.informers")
    api = FlakyApi(20, [model("a")], Transient(0, "connection refused"))
    informer = Informer(
        api,
        MODELS,
        Store(MODELS),
        namespace="ns",  # type: ignore[arg-type]
        on_change=lambda old, new: None,
        max_backoff=0.01,
    )
    informer.start()
    try:
        wait_until(lambda: api.lists > 20 and informer.healthy, what="recovery", timeout=10)
    finally:
        informer.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "listing again"
    ]
    refused = Informer(
        FlakyApi(10**6, [], Rejected(403, "forbidden")),
        MODELS,  # type: ignore[arg-type]
        Store(MODELS),
        namespace="ns",
        on_change=lambda old, new: None,
    )
    refused._set_health(False, Rejected(403, "forbidden"))
    assert not refused.last_error_transient
    informer._set_health(False, Transient(0, "connection refused"))
    assert informer.last_error_transient


def test_indexes_follow_every_change_of_the_store() -> None:
    store = Store(
        MODELS, indexers={"group": lambda o: [str(o.get("group"))] if o.get("group") else []}
    )
    store.apply_event("ADDED", obj("a", 1, group="g1"))
    store.apply_event("ADDED", obj("b", 1, group="g1"))
    store.apply_event("ADDED", obj("c", 1, namespace="other", group="g1"))
    assert sorted(o["metadata"]["name"] for o in store.by_index("group", "g1")) == ["a", "b", "c"]
    store.apply_event("MODIFIED", obj("a", 2, group="g2"))  # moved
    assert [o["metadata"]["name"] for o in store.by_index("group", "g2")] == ["a"]
    store.apply_event("DELETED", obj("b", 3))
    store.forget("other", "c")
    assert store.by_index("group", "g1") == []
    assert [o["metadata"]["name"] for o in store.objects("ns")] == ["a"]
    store.replace([obj("d", 4, group="g2")], namespace="ns")
    assert [o["metadata"]["name"] for o in store.by_index("group", "g2")] == ["d"]
    assert store.objects("other") == []
