"""Standalone ModelDeployments on a real control plane (docs/election.md 4): idle ones
scale to zero on the timer, a recorded request wakes them, minReplicas holds."""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import time
from typing import Any

import pytest

from flexinfer_kube.resources import MODEL_DEPLOYMENTS
from tests.polling import wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    cluster,
    controller,
    crds,
    kubectl,
    now_text,
    on_kwok,
)

pytestmark = pytest.mark.k8s


def add_standalone(
    c: Cluster, name: str, *, replicas: int, min_replicas: int, idle_seconds: int
) -> None:
    c.api.create(
        MODEL_DEPLOYMENTS,
        c.namespace,
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": name},
            "spec": {
                "backend": "vllm",
                "model": f"test/{name}",
                "replicas": replicas,
                "minReplicas": min_replicas,
                "idleTimeoutSeconds": idle_seconds,
                "coldStartTimeoutSeconds": 10,
                **on_kwok(),
            },
        },
    )


def request(c: Cluster, name: str) -> None:
    """What the proxy does for a request: record it in status.lastAccessTime."""
    c.api.patch(
        MODEL_DEPLOYMENTS,
        c.namespace,
        name,
        {"status": {"lastAccessTime": now_text()}},
        subresource="status",
    )


def md_status(c: Cluster, name: str) -> dict[str, Any]:
    return dict(c.api.get(MODEL_DEPLOYMENTS, c.namespace, name).get("status") or {})


def ready_reason(c: Cluster, name: str) -> str:
    conditions = md_status(c, name).get("conditions") or []
    return next((x["reason"] for x in conditions if x["type"] == "Ready"), "")


def idle_at_zero(c: Cluster, name: str) -> bool:
    status = md_status(c, name)
    return (
        status.get("phase") == "Idle"
        and status.get("readyReplicas") == 0
        and ready_reason(c, name) == "IdleScaleToZero"
        and c.replicas(name) == 0
        and not c.pods(name)
    )


def test_idle_scales_to_zero_and_a_request_wakes_it(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    add_standalone(c, "solo", replicas=2, min_replicas=0, idle_seconds=8)
    with controller(local_cluster, c.namespace) as running:  # type: ignore[arg-type]
        # Never used: stays at zero, and says so.
        wait_until(lambda: idle_at_zero(c, "solo"), what="solo Idle before any request")

        request(c, "solo")
        wait_until(lambda: c.replicas("solo") == 2, what="solo scaled to replicas on demand")
        wait_until(
            lambda: (
                md_status(c, "solo").get("phase") == "Running"
                and ready_reason(c, "solo") == "InUse"
            ),
            what="solo Running and InUse",
        )

        # No further write from the test: the timer at lastAccessTime + 8 s does it.
        wait_until(lambda: idle_at_zero(c, "solo"), what="solo scaled to zero after idling")
        reasons = [e["reason"] for e in c.events("solo")]
        assert "DemandScaleUp" in reasons
        assert "IdleScaleToZero" in reasons

        # Settled and idle: the controller writes nothing more.
        before = running.writes()
        time.sleep(2)
        assert running.writes() == before

        request(c, "solo")
        wait_until(lambda: c.replicas("solo") == 2, what="solo woken again from zero")
        wait_until(
            lambda: md_status(c, "solo").get("readyReplicas", 0) >= 1, what="solo ready again"
        )


def test_min_replicas_never_goes_to_zero(local_cluster: object, cluster: Cluster) -> None:
    c = cluster
    add_standalone(c, "warm", replicas=1, min_replicas=1, idle_seconds=2)
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        wait_until(lambda: c.replicas("warm") == 1, what="warm scaled to minReplicas unused")
        request(c, "warm")
        wait_until(lambda: ready_reason(c, "warm") == "InUse", what="warm InUse")
        # The idle timeout lapses on the timer; minReplicas keeps the pod.
        wait_until(
            lambda: ready_reason(c, "warm") == "IdleMinReplicas", what="warm idle at minReplicas"
        )
        assert c.replicas("warm") == 1
        wait_until(
            lambda: md_status(c, "warm").get("phase") == "Running", what="warm Running while idle"
        )
        assert c.ready_pods("warm")
