"""GPU leases on a real control plane: GPULease, the legacy ConfigMap, expiry without a
write, fail-open when leases cannot be read, and the finetune lease lifecycle."""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_core.timestamps import format_rfc3339 as format_time
from flexinfer_kube.resources import CONFIG_MAPS, GPU_LEASES, JOBS, MODEL_CACHES, Resource
from tests.polling import wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    PodTimeline,
    cluster,
    controller,
    crds,
    kubectl,
    metric_value,
)

pytestmark = pytest.mark.k8s

CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False)
CLUSTER_ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False
)


def lease(name: str, *, group: str = "g", owner: str = "trainer",
          expires: datetime | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"group": group, "owner": owner, "node": "kwok-gpu-0"}
    if expires is not None:
        spec["expiresAt"] = format_time(expires.replace(microsecond=0))
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "GPULease",
            "metadata": {"name": name}, "spec": spec}


def keep_demanding(c: Cluster, name: str) -> bool:
    c.demand(name)
    return c.status(name).get("phase") == "Ready"


def test_a_gpu_lease_parks_every_member_until_deleted_or_expired(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("a")
    c.add_model("b")
    c.demand("a")
    with controller(local_cluster, c.namespace) as ctl:  # type: ignore[arg-type]
        c.wait_serving("a")
        c.api.create(GPU_LEASES, c.namespace, lease("train"))
        a = c.wait_parked("a")
        c.wait_parked("b")
        assert a["sharedGroup"]["preemptedBy"] == "gpu-lease/trainer"
        assert a["phase"] == "Preempted"
        ready = {x["type"]: x for x in a["conditions"]}["Ready"]
        assert ready["reason"] == "GPULeaseHeld"
        assert "GPULeaseHeld" in {e["reason"] for e in c.events("a")}
        held = wait_until(
            lambda: (c.api.get(GPU_LEASES, c.namespace, "train").get("status") or {}).get(
                "active"
            ),
            what="the lease's status.active",
        )
        assert held is True
        assert c.api.get(GPU_LEASES, c.namespace, "train")["status"]["acquiredAt"]
        text = ctl.scrape()
        labels = {"group": "g", "owner": "trainer", "namespace": c.namespace}
        assert metric_value(text, "flexinfer_gpu_lease_active", **labels) == 1
        assert metric_value(text, "flexinfer_gpu_lease_acquired_total", **labels) == 1
        # Parked while the lease holds, however much demand arrives.
        for _ in range(4):
            c.demand("a")
            assert c.replicas("a") == 0
        c.api.delete(GPU_LEASES, c.namespace, "train")
        wait_until(lambda: keep_demanding(c, "a"), what="a serving after the lease is gone",
                   interval=1.0)
        # A past holder's series goes (one per owner would otherwise pile up).
        assert metric_value(ctl.scrape(), "flexinfer_gpu_lease_active", **labels) is None

        # A lease with a TTL: parks, then lapses with nobody writing anything.
        expires = datetime.now(UTC) + timedelta(seconds=8)
        c.api.create(GPU_LEASES, c.namespace, lease("short", owner="batch", expires=expires))
        c.wait_parked("a")
        wait_until(lambda: keep_demanding(c, "a"), what="a serving after the lease expired",
                   interval=1.0)
        # Expiry took effect through the timer; the status catches up for people.
        wait_until(
            lambda: (c.api.get(GPU_LEASES, c.namespace, "short").get("status") or {}).get(
                "active"
            )
            is False,
            what="the expired lease's status.active to be false",
        )
    timeline.stop()
    assert timeline.violations == []


def test_a_config_map_lease_parks_the_group_too(local_cluster: object, cluster: Cluster) -> None:
    c = cluster
    c.add_model("a")
    c.demand("a")
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        c.wait_serving("a")
        c.api.create(CONFIG_MAPS, c.namespace, {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "gpu-lease-g", "labels": {"ai.flexinfer/gpu-lease": "g"}},
            "data": {"group": "g", "owner": "legacy-job", "node": "kwok-gpu-0"},
        })
        parked = c.wait_parked("a")
        assert parked["sharedGroup"]["preemptedBy"] == "gpu-lease/legacy-job"
        c.api.delete(CONFIG_MAPS, c.namespace, "gpu-lease-g")
        wait_until(lambda: keep_demanding(c, "a"), what="a serving after the ConfigMap is gone",
                   interval=1.0)


def test_unreadable_leases_fail_open_toward_serving(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    user = f"no-leases-{c.namespace}"
    rules = [
        {"apiGroups": ["", "apps", "batch", "events.k8s.io"], "resources": ["*"], "verbs": ["*"]},
        {
            "apiGroups": ["ai.flexinfer"],
            "resources": [
                "models", "models/status", "gpugroups", "gpugroups/status",
                "modelcaches", "modelcaches/status", "modeldeployments",
                "modeldeployments/status",
            ],
            "verbs": ["*"],
        },
    ]
    c.api.create(CLUSTER_ROLES, "", {"apiVersion": "rbac.authorization.k8s.io/v1",
                                     "kind": "ClusterRole", "metadata": {"name": user},
                                     "rules": rules})
    c.api.create(CLUSTER_ROLE_BINDINGS, "", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    })
    try:
        c.add_model("a")
        c.api.create(GPU_LEASES, c.namespace, lease("train"))
        c.demand("a")
        with controller(local_cluster, c.namespace, impersonate=user) as ctl:  # type: ignore[arg-type]
            status = c.wait_serving("a")
            active = next(x for x in status["conditions"] if x["type"] == "Active")
            assert active["message"].startswith(
                "GPU leases could not be read (gpuleases); proceeding as unleased (fail open)"
            )
            text = ctl.scrape()
            errors = metric_value(text, "flexinfer_gpu_lease_read_errors_total",
                                  namespace=c.namespace, source="gpuleases")
            assert errors is not None and errors >= 1
    finally:
        c.api.delete(CLUSTER_ROLE_BINDINGS, "", user)
        c.api.delete(CLUSTER_ROLES, "", user)


def test_finetune_lease_is_taken_before_the_job_and_released_after(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    c.add_model("a")
    c.demand("a")
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        c.wait_serving("a")
        c.api.create(MODEL_CACHES, c.namespace, {
            "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "tuned",
                         "annotations": {"flexinfer.test/complete-delay": "6s"}},
            "spec": {
                "source": "HF://test/base",
                # ReadWriteOnce: what the local-path class can bind (as on k3s and kind).
                "accessModes": ["ReadWriteOnce"],
                "finetune": {"gpuLease": {"group": "g", "ttlSeconds": 120},
                             "timeoutSeconds": 600, "image": "trainer.local/qlora:test"},
            },
        })
        held = wait_until(
            lambda: _get_or_none(c, GPU_LEASES, "tuned-gpu-lease"), what="the finetune lease"
        )
        assert held["spec"]["group"] == "g"
        assert held["spec"]["owner"] == "tuned"
        refs = held["metadata"]["ownerReferences"]
        assert [(r["kind"], r["name"]) for r in refs] == [("ModelCache", "tuned")]
        expires = datetime.fromisoformat(held["spec"]["expiresAt"].replace("Z", "+00:00"))
        assert expires > datetime.now(UTC) + timedelta(seconds=60)
        c.wait_parked("a")
        job = wait_until(lambda: _get_or_none(c, JOBS, "tuned-finetune"), what="the Job")
        assert job["metadata"]["creationTimestamp"] >= held["metadata"]["creationTimestamp"]
        wait_until(
            lambda: _get_or_none(c, GPU_LEASES, "tuned-gpu-lease") is None,
            what="the lease released once the Job completed", timeout=90,
        )
        cache = c.api.get(MODEL_CACHES, c.namespace, "tuned")
        assert cache["status"]["jobName"] == "tuned-finetune"
        wait_until(lambda: keep_demanding(c, "a"), what="a serving after the finetune",
                   interval=1.0)


def _get_or_none(c: Cluster, resource: Resource, name: str) -> dict[str, Any] | None:
    from flexinfer_kube.kubeapi import NotFound

    try:
        return c.api.get(resource, c.namespace, name)
    except NotFound:
        return None
