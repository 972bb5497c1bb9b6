"""From Kubernetes objects to routable entries: readiness, endpoints, cold start, groups."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from flexinfer_kube.recorded_status import gpu_group_packs
from flexinfer_proxy.directory import ModelKind
from flexinfer_proxy.kube_directory import (
    entry_from_object,
    owned_by,
    rendered_for,
    service_endpoint,
)

MODEL = ModelKind.MODEL
DEPLOYMENT = ModelKind.MODEL_DEPLOYMENT


def obj(name: str = "m", *, spec: Any = None, status: Any = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec or {},
        "status": status or {},
    }


def service(*ports: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "m", "namespace": "ns"}, "spec": {"ports": list(ports)}}


@pytest.mark.parametrize(
    ("kind", "status", "ready"),
    [
        (MODEL, {"phase": "Ready"}, True),
        (MODEL, {"phase": "Loading"}, False),
        # Draining: it finishes what it has, new requests wait (docs/election.md 1.6).
        (MODEL, {"phase": "Draining"}, False),
        (MODEL, {}, False),
        (DEPLOYMENT, {"readyReplicas": 1}, True),
        (DEPLOYMENT, {"readyReplicas": 0, "phase": "Running"}, False),
        (DEPLOYMENT, {"phase": "Running"}, True),
        (DEPLOYMENT, {"phase": "Idle"}, False),
        # A GPUGroup member that drains (docs/election.md 1.6), its pod still ready.
        (DEPLOYMENT, {"readyReplicas": 1, "phase": "Draining"}, False),
    ],
)
def test_readiness(kind: ModelKind, status: dict[str, Any], ready: bool) -> None:
    assert entry_from_object(kind, obj(status=status), service=None).ready is ready


@pytest.mark.parametrize(
    ("svc", "status", "override", "endpoint"),
    [
        (None, {}, None, "http://m.ns.svc:8000/v1"),
        # status.endpoint(s) are for people: never a URL (docs/rendering.md).
        (None, {"endpoint": "http://elsewhere:9000/v1"}, None, "http://m.ns.svc:8000/v1"),
        (None, {"endpoints": ["http://elsewhere:9000/v1"]}, None, "http://m.ns.svc:8000/v1"),
        (service({"name": "http", "port": 8080}), {}, None, "http://m.ns.svc:8080/v1"),
        (service({"name": "x", "port": 1}, {"port": 8000}), {}, None, "http://m.ns.svc:8000/v1"),
        (service({"name": "x", "port": 1}), {}, None, "http://m.ns.svc:1/v1"),
        (service({"port": 8080}), {}, "http://127.0.0.1:1/v1", "http://127.0.0.1:1/v1"),
    ],
)
def test_endpoint_precedence(
    svc: dict[str, Any] | None, status: dict[str, Any], override: str | None, endpoint: str
) -> None:
    made = entry_from_object(MODEL, obj(status=status), service=svc, override=override)
    assert made.endpoint == endpoint


def test_model_cold_start_and_a_bad_duration_falls_back_to_the_default() -> None:
    slow = obj(spec={"serverless": {"coldStartTimeout": "2m30s"}})
    assert entry_from_object(MODEL, slow, service=None).cold_start_timeout == timedelta(seconds=150)
    bad = obj(spec={"serverless": {"coldStartTimeout": "soon"}})
    assert entry_from_object(MODEL, bad, service=None).cold_start_timeout == timedelta(seconds=60)


def test_a_deployment_in_a_gpugroup_reports_its_queue() -> None:
    groups = {"g": ("m",), "other": ("x",)}
    member = entry_from_object(
        DEPLOYMENT,
        obj(spec={"gpuGroupRef": "g", "coldStartTimeoutSeconds": 90}),
        service=None,
        gpu_groups=groups,
    )
    assert (member.gpu_group, member.cold_start_timeout, member.reports_queue) == (
        "g",
        timedelta(seconds=90),
        True,
    )
    alone = entry_from_object(DEPLOYMENT, obj("solo"), service=None, gpu_groups=groups)
    assert (alone.gpu_group, alone.reports_queue) == (None, False)
    assert entry_from_object(MODEL, obj(), service=None).created == 1767225600


def test_listed_in_a_gpugroup_without_a_ref_is_a_member() -> None:
    # The group that lists it governs it (flexinfer_core.membership), as in the
    # controller; before, the proxy looked only at gpuGroupRef and never queued for it.
    listed = entry_from_object(DEPLOYMENT, obj(), service=None, gpu_groups={"g": ("m",)})
    assert (listed.gpu_group, listed.reports_queue) == ("g", True)


@pytest.mark.parametrize(
    ("ref", "groups"),
    [
        ("g", {}),  # names a group that does not exist
        ("g", {"g": ("x",)}),  # names a group that does not list it
        ("other", {"g": ("m",), "other": ()}),  # listed by g, names another
        ("", {"g": ("m",), "other": ("m",)}),  # listed by two
    ],
)
def test_a_deployment_in_a_membership_conflict_reports_to_no_group(
    ref: str, groups: dict[str, tuple[str, ...]]
) -> None:
    made = entry_from_object(
        DEPLOYMENT, obj(spec={"gpuGroupRef": ref}), service=None, gpu_groups=groups
    )
    assert (made.gpu_group, made.reports_queue) == (None, False)


def test_a_service_without_ports_gives_no_endpoint() -> None:
    assert service_endpoint(service()) is None


def test_served_name_labels_priority_and_the_holders_services() -> None:
    """A Model advertises its labels while its status says it holds the card; a
    Service annotation left from an older controller says nothing about a Model."""
    made = entry_from_object(
        MODEL,
        obj(
            spec={"serviceLabels": ["chat", "code"], "gpu": {"priority": 300}},
            status={"servedModelName": "Qwen/Qwen2.5-7B", "sharedGroup": {"state": "Active"}},
        ),
        service={
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"ports": [{"name": "http", "port": 8000}]},
        },
    )
    assert (made.served_name, made.backend_model) == ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B")
    assert (made.service_labels, made.active_services) == (("chat", "code"), ("chat", "code"))
    stale = {"metadata": {"annotations": {"ai.flexinfer/active-services": "chat"}}}
    queued = obj(spec={"serviceLabels": ["chat"]}, status={"sharedGroup": {"state": "Queued"}})
    assert entry_from_object(MODEL, queued, service=stale).active_services == ()
    assert made.priority == 300
    same = entry_from_object(MODEL, obj(status={"servedModelName": "m"}), service=None)
    assert (same.served_name, same.backend_model) == (None, "m")
    deployment = entry_from_object(DEPLOYMENT, obj(spec={"priority": 7}), service=None)
    assert deployment.priority == 7


@pytest.mark.parametrize(
    ("kind", "status", "node"),
    [
        (MODEL, {"phase": "Ready", "nodeName": "gpu-1"}, "gpu-1"),
        # Scaled to 0: still the node it last served on.
        (MODEL, {"phase": "Preempted", "nodeName": "gpu-1"}, "gpu-1"),
        (MODEL, {"phase": "Idle"}, None),  # never placed
        (MODEL, {"nodeName": ""}, None),
        (MODEL, {"nodeName": 7}, None),
        # The controller writes no node on a ModelDeployment: a stray field is not read.
        (DEPLOYMENT, {"readyReplicas": 1, "nodeName": "gpu-1"}, None),
    ],
)
def test_a_models_node_is_where_it_last_served(
    kind: ModelKind, status: dict[str, Any], node: str | None
) -> None:
    assert entry_from_object(kind, obj(status=status), service=None).node == node


def _rendered(kind: str = "Model", **metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "m",
            "namespace": "ns",
            "labels": {
                "app.kubernetes.io/managed-by": "flexinfer",
                "ai.flexinfer/model": "m",
                "ai.flexinfer/kind": kind,
            },
            "ownerReferences": [{"kind": kind, "name": "m", "uid": "u1", "controller": True}],
            **metadata,
        }
    }


def test_a_rendered_service_is_known_by_its_labels_and_owner() -> None:
    model = {**obj(), "metadata": {**obj()["metadata"], "uid": "u1"}}
    assert rendered_for(_rendered()) == ("ns", MODEL, "m")
    assert rendered_for(_rendered("ModelDeployment")) == ("ns", DEPLOYMENT, "m")
    assert rendered_for(_rendered(labels={"ai.flexinfer/model": "m"})) is None
    assert owned_by(_rendered(), model, MODEL)
    assert not owned_by(_rendered(), model, DEPLOYMENT)
    recreated = {**model, "metadata": {**model["metadata"], "uid": "u2"}}
    assert not owned_by(_rendered(), recreated, MODEL), "a Service left by a deleted Model"
    assert not owned_by(_rendered(ownerReferences=[]), model, MODEL)


@pytest.mark.parametrize(
    ("reason", "side_by_side"),
    [
        ("CoResident", True),  # several hold the card
        ("Fits", True),  # one holds it, room beside it
        ("Queued", True),  # nobody holds it yet, but the controller can pack it
        ("Exclusive", False),  # the leader takes the card alone: the others wait
        ("NoSharedCard", False),  # no --gpu-device-class: one member at a time
        ("NoVramBudget", False),
        (None, False),  # no Packed condition: a group without a budget
    ],
)
def test_a_member_of_a_packed_gpu_group_starts_side_by_side(
    reason: str | None, side_by_side: bool
) -> None:
    """docs/election.md 3, "Packing": the group's condition `Packed` says whether its
    members that fit start together (the proxy's wait estimate counts on it)."""
    conditions = [] if reason is None else [{"type": "Packed", "status": "True", "reason": reason}]
    group = {"metadata": {"name": "card", "namespace": "ns"}, "status": {"conditions": conditions}}
    assert gpu_group_packs(group) is side_by_side
    member = obj(spec={"gpuGroupRef": "card"})
    packing = {"card"} if gpu_group_packs(group) else set()
    made = entry_from_object(
        DEPLOYMENT, member, service=None, gpu_groups={"card": ("m",)}, packing_groups=packing
    )
    assert (made.gpu_group, made.side_by_side) == ("card", side_by_side)
