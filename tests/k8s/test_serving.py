"""What a Model or ModelDeployment is served with, on the local control plane: the
backend-cache claim that lives exactly while its pod mounts it, a GPUGroup's nodes on
its members' pods, and a `kubectl scale` of a governed Deployment answered by a Warning
Event that names the field to change instead."""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import time
from typing import Any

import pytest

from flexinfer_kube.kubeapi import NotFound
from flexinfer_kube.resources import (
    DEPLOYMENTS,
    GPU_GROUPS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    PERSISTENT_VOLUME_CLAIMS,
)
from tests.polling import hold_while, wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    cluster,
    controller,
    crds,
    kubectl,
    model_body,
    now_text,
    on_kwok,
)
from .kubectl import Kubectl

pytestmark = pytest.mark.k8s


def claim_or_none(c: Cluster, name: str) -> dict[str, Any] | None:
    try:
        claim = c.api.get(PERSISTENT_VOLUME_CLAIMS, c.namespace, name)
    except NotFound:
        return None
    return None if claim["metadata"].get("deletionTimestamp") else claim


def mounted_claims(c: Cluster, name: str) -> set[str]:
    try:
        deployment = c.api.get(DEPLOYMENTS, c.namespace, name)
    except NotFound:
        return set()
    return {v["persistentVolumeClaim"]["claimName"]
            for v in deployment["spec"]["template"]["spec"]["volumes"]
            if "persistentVolumeClaim" in v}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for item in (obj.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


def test_the_backend_cache_claim_lives_while_the_pod_mounts_it(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    body = model_body("dl")  # vLLM downloading HF://test/dl itself
    body["spec"]["backendCache"] = {"size": "3Gi"}
    c.api.create(MODELS, c.namespace, body)
    c.api.create(MODEL_CACHES, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "weights"},
        "spec": {"source": "HF://test/dl", "storageStrategy": "SharedPVC", "storageSize": "1Gi",
                 "accessModes": ["ReadWriteOnce"]},
    })
    # local-path binds a claim for its first pod (WaitForFirstConsumer): the Model runs.
    c.demand("dl")
    with controller(local_cluster, c.namespace):
        claim = wait_until(lambda: claim_or_none(c, "dl-backend-cache"), what="the claim")
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert claim["spec"]["resources"]["requests"]["storage"] == "3Gi"
        (owner,) = claim["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("Model", "dl")
        wait_until(lambda: "dl-backend-cache" in mounted_claims(c, "dl"), what="mounted")
        bound = wait_until(
            lambda: (m if condition(m := c.model("dl"), "BackendCache").get("status") == "True"
                     else None), what="BackendCache=True")
        assert condition(bound, "BackendCache")["reason"] == "ClaimBound"
        # A ModelCache now holds the model: nothing downloads, so the claim goes.
        c.api.patch(MODELS, c.namespace, "dl", {"spec": {"cache": {"modelCacheRef": "weights"}}})
        wait_until(lambda: "dl-backend-cache" not in mounted_claims(c, "dl"), what="unmounted")
        wait_until(lambda: claim_or_none(c, "dl-backend-cache") is None, what="claim deleted")
        assert not condition(c.model("dl"), "BackendCache")


def test_a_gpu_groups_node_selector_reaches_its_members_pods(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    c.api.create(MODEL_DEPLOYMENTS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "member"},
        "spec": {"backend": "vllm", "model": "test/member", **on_kwok()},
    })
    c.api.create(GPU_GROUPS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup", "metadata": {"name": "gg"},
        "spec": {"models": [{"name": "member"}],
                 "nodeSelector": {"kubernetes.io/hostname": "kwok-gpu-1"}},
    })
    with controller(local_cluster, c.namespace):
        def selector() -> dict[str, str] | None:
            try:
                deployment = c.api.get(DEPLOYMENTS, c.namespace, "member")
            except NotFound:
                return None
            found = deployment["spec"]["template"]["spec"].get("nodeSelector") or {}
            return found if found.get("kubernetes.io/hostname") else None

        assert wait_until(selector, what="the group's node on the member")[
            "kubernetes.io/hostname"] == "kwok-gpu-1"
        # The member's own selector is kept beside the group's.
        assert selector() is not None and selector()["type"] == "kwok"  # type: ignore[index]


def test_kubectl_scale_is_answered_by_a_warning_naming_the_governing_field(
    local_cluster: Any, cluster: Cluster, kubectl: Kubectl
) -> None:
    c = cluster
    c.api.create(MODEL_DEPLOYMENTS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "md"},
        "spec": {"backend": "vllm", "model": "test/md", "replicas": 1, **on_kwok()},
    })
    c.api.patch(MODEL_DEPLOYMENTS, c.namespace, "md", {"status": {"lastAccessTime": now_text()}},
                subresource="status")
    with controller(local_cluster, c.namespace):
        wait_until(lambda: c.ready_pods("md"), what="md running")
        assert not [e for e in c.events("md") if e["reason"] == "ReplicasGoverned"]
        kubectl.ok("scale", "-n", c.namespace, "deployment/md", "--replicas=3")
        event = wait_until(
            lambda: next((e for e in c.events("md") if e["reason"] == "ReplicasGoverned"), None),
            what="the Warning Event",
        )
        assert event["type"] == "Warning"
        assert "spec.replicas was set to 3 by kubectl" in event["message"]
        assert "change the ModelDeployment's spec.replicas" in event["message"]
        # The election's write still wins, and the one write is answered once.
        wait_until(lambda: c.replicas("md") == 1, what="replicas back to 1")
        deadline = time.monotonic() + 5
        hold_while(lambda: time.monotonic() < deadline, lambda: len(
            [e for e in c.events("md") if e["reason"] == "ReplicasGoverned"]) == 1,
            what="a single Warning Event")
