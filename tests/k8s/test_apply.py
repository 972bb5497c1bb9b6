"""The writer without a cluster: conflicts re-read and ask for a new decision,
write-through keeps the cache at least as new as our writes."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from flexinfer_k8s import apply as apply_module
from flexinfer_k8s.apply import RetryNow, Writer
from flexinfer_kube.informers import Store
from flexinfer_kube.kubeapi import Conflict, NotFound
from flexinfer_kube.resources import DEPLOYMENTS, EVENTS, MODELS, Resource


class FakeApi:
    """Answers like the API server would, from a dict of objects; records requests."""

    def __init__(self, objects: dict[str, dict[str, Any]], *, conflict: bool = False) -> None:
        self.managers: list[str | None] = []
        self.objects = objects
        self.conflict = conflict
        self.calls: list[tuple[str, str, Any]] = []

    def patch(self, resource: Resource, namespace: str, name: str, body: Any,
              *, subresource: str | None = None,
              field_manager: str | None = None) -> dict[str, Any]:
        self.calls.append(("PATCH", f"{name}/{subresource or ''}", body))
        self.managers.append(field_manager)
        if self.conflict:
            raise Conflict(409, "the object has been modified")
        if name not in self.objects:
            raise NotFound(404, "not found")
        obj = self.objects[name]
        version = int(obj["metadata"]["resourceVersion"]) + 1
        obj["metadata"]["resourceVersion"] = str(version)
        if subresource == "scale":
            obj["spec"]["replicas"] = body["spec"]["replicas"]
            return {"metadata": {"name": name, "resourceVersion": str(version)},
                    "spec": body["spec"]}
        obj.setdefault("status", {}).update(body.get("status") or {})
        return obj

    def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(("GET", name, None))
        if name not in self.objects:
            raise NotFound(404, "not found")
        return self.objects[name]


def model(version: int, phase: str) -> dict[str, Any]:
    return {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": str(version)},
            "status": {"phase": phase}}


def test_a_conflict_rereads_the_object_and_asks_for_a_new_decision() -> None:
    stores = {MODELS: Store(MODELS)}
    stores[MODELS].write_through(model(1, "Ready"))
    api = FakeApi({"a": model(4, "Ready")}, conflict=True)
    writer = Writer(api, stores)  # type: ignore[arg-type]
    with pytest.raises(RetryNow):
        writer.patch_status(MODELS, model(1, "Ready"), {"phase": "Preempted"})
    _, _, body = api.calls[0]
    assert body["metadata"] == {"resourceVersion": "1"}  # conditional on what was decided
    assert ("GET", "a", None) in api.calls
    assert stores[MODELS].get("ns", "a")["metadata"]["resourceVersion"] == "4"  # type: ignore[index]


def test_status_and_scale_are_written_through_to_the_cache() -> None:
    deployment = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "7"},
                  "spec": {"replicas": 1}}
    stores = {MODELS: Store(MODELS), DEPLOYMENTS: Store(DEPLOYMENTS)}
    stores[DEPLOYMENTS].write_through(dict(deployment))
    api = FakeApi({"a": {"metadata": dict(deployment["metadata"]), "spec": {"replicas": 1}}})
    writer = Writer(api, stores)  # type: ignore[arg-type]
    assert writer.scale("ns", "a", 0)
    cached = stores[DEPLOYMENTS].get("ns", "a")
    assert cached is not None
    assert cached["spec"]["replicas"] == 0
    assert cached["metadata"]["resourceVersion"] == "8"
    assert not writer.scale("ns", "missing", 0)  # NotFound is an outcome, not an error
    # Scale writes have a field manager of their own: `spec.replicas` is theirs, never
    # the renderer's (whose applies leave it out and must not reset it).
    assert api.managers == ["flexinfer-scale", "flexinfer-scale"]


class SlowEvents:
    """An API server whose Event POSTs wait until the test lets them through."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.sending = threading.Event()  # a POST has begun
        self.posted: list[str] = []

    def create(self, resource: Resource, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        assert resource is EVENTS
        self.sending.set()
        self.gate.wait(10)
        self.posted.append(body["reason"])
        return body


NOW = datetime(2026, 12, 6, tzinfo=UTC)
INVOLVED = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "1"}}


def test_events_in_background_leave_the_worker_at_once_and_keep_their_order() -> None:
    api = SlowEvents()
    writer = Writer(api, {}, events_in_background=True)  # type: ignore[arg-type]
    for reason in ("Preempted", "Promoted", "GPULeaseHeld"):
        writer.event(INVOLVED, reason=reason, message="m", now=NOW)  # returns: not sent yet
    assert api.posted == []
    api.gate.set()
    writer.stop_events(timeout=10)  # sends what waits, then ends the sender
    assert api.posted == ["Preempted", "Promoted", "GPULeaseHeld"]


def test_events_past_the_pending_limit_are_dropped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(apply_module, "MAX_PENDING_EVENTS", 2)
    api = SlowEvents()
    writer = Writer(api, {}, events_in_background=True)  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, logger="flexinfer.apply")
    writer.event(INVOLVED, reason="One", message="m", now=NOW)
    assert api.sending.wait(10)  # the sender holds it; two more may wait
    for reason in ("Two", "Three", "Four"):
        writer.event(INVOLVED, reason=reason, message="m", now=NOW)
    api.gate.set()
    writer.stop_events(timeout=10)
    assert api.posted == ["One", "Two", "Three"]
    dropped = [r for r in caplog.records if r.getMessage() == "could not record event"]
    assert [r.fields["reason"] for r in dropped] == ["Four"]  # type: ignore[attr-defined]


def test_without_the_background_an_event_is_sent_before_event_returns() -> None:
    api = SlowEvents()
    api.gate.set()
    writer = Writer(api, {})  # type: ignore[arg-type]
    writer.event(INVOLVED, reason="Preempted", message="m", now=NOW)
    assert api.posted == ["Preempted"]
