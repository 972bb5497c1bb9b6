"""The local cluster's fake DRA driver: AMD's DeviceClass and a ResourceSlice per GPU
node, allocated by the real kube-scheduler (docs/local-cluster.md, "GPUs for Dynamic
Resource Allocation").

Pods sharing one ResourceClaim land on its one device; a claim for a second device of a
one-GPU node stays Pending until the first is released by the resourceclaim controller;
the renderer's shared claim and its members' pods are admitted under Pod Security
"baseline" and scheduled onto one card.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from flexinfer_devcluster import gpudriver
from flexinfer_devcluster.localcluster import GPU_NODE_TOLERATION, KwokNode, LocalCluster
from flexinfer_devcluster.policy import dev_policy
from flexinfer_k8s.render.gpu_claim import shared_card_of_models
from flexinfer_k8s.render.workload import workload_from_model
from flexinfer_k8s.render.workloads import RenderSettings, render_workload
from flexinfer_kube.kubeapi import JSON, KubeApi, NotFound
from flexinfer_kube.objects import get_path
from flexinfer_kube.resources import DEPLOYMENTS, NODES, PODS, RESOURCE_CLAIMS
from tests.k8s.kubectl import create_namespace, delete_namespace, kubectl_for
from tests.polling import wait_until

pytestmark = pytest.mark.k8s


@pytest.fixture
def namespace(local_cluster: LocalCluster) -> Iterator[str]:
    kubectl = kubectl_for(local_cluster)
    name = create_namespace(kubectl, "dra")  # Pod Security "baseline", as for tenants
    wait_until(
        lambda: kubectl.run("get", "serviceaccount", "default", "-n", name).returncode == 0,
        what=f"ServiceAccount {name}/default",
    )
    yield name
    delete_namespace(kubectl, name)


def claim(name: str) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{
            "name": "gpu",
            "exactly": {"deviceClassName": gpudriver.DEVICE_CLASS,
                        "allocationMode": "ExactCount", "count": 1},
        }]}},
    }  # fmt: skip


def claim_pod(name: str, claim_name: str, *, node: str | None = None) -> JSON:
    spec: JSON = {
        "tolerations": [dict(GPU_NODE_TOLERATION)],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        "containers": [
            {
                "name": "c",
                "image": "registry.local/none",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def scheduled(api: KubeApi, namespace: str, name: str) -> str | None:
    return get_path(api.get(PODS, namespace, name), "spec", "nodeName")


def allocation(api: KubeApi, namespace: str, name: str) -> JSON | None:
    return get_path(api.get(RESOURCE_CLAIMS, namespace, name), "status", "allocation")


def unschedulable(api: KubeApi, namespace: str, name: str) -> str | None:
    for condition in get_path(api.get(PODS, namespace, name), "status", "conditions") or []:
        if condition.get("reason") == "Unschedulable":
            return str(condition.get("message"))
    return None


def test_amds_device_class_and_one_slice_per_gpu_node(
    local_cluster: LocalCluster, api: KubeApi
) -> None:
    device_class = api.get(gpudriver.DEVICE_CLASSES, "", "gpu.amd.com")
    assert get_path(device_class, "spec", "selectors") == [
        {"cel": {"expression": "device.driver == 'gpu.amd.com'"}}
    ]
    slices = {
        get_path(s, "spec", "nodeName"): s
        for s in api.list(gpudriver.RESOURCE_SLICES).get("items") or []
    }
    # The GPU nodes, not the CPU node (the process node's has its own test).
    assert {"kwok-gpu-0", "kwok-gpu-1"} <= set(slices)
    assert "kwok-cpu-0" not in slices
    spec = slices["kwok-gpu-0"]["spec"]
    assert spec["driver"] == "gpu.amd.com"
    assert spec["pool"] == {"name": "kwok-gpu-0", "generation": 1, "resourceSliceCount": 1}
    [device] = spec["devices"]
    assert device["name"] == "gpu-0-128"
    assert device["attributes"]["type"] == {"string": "amdgpu"}
    assert device["capacity"]["memory"] == {"value": "24Gi"}
    # Owned by its node, so a removed node takes its devices with it.
    [owner] = slices["kwok-gpu-0"]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Node", "kwok-gpu-0")


def test_a_node_added_later_publishes_as_many_devices_as_gpus(
    local_cluster: LocalCluster, api: KubeApi
) -> None:
    three, cpu = f"dra-three-{uuid.uuid4().hex[:6]}", f"dra-cpu-{uuid.uuid4().hex[:6]}"
    local_cluster.add_node(KwokNode(name=three, gpus=3))
    local_cluster.add_node(KwokNode(name=cpu, gpus=0))
    try:
        body = api.get(gpudriver.RESOURCE_SLICES, "", gpudriver.slice_name(three))
        names = [d["name"] for d in body["spec"]["devices"]]
        assert names == ["gpu-0-128", "gpu-1-129", "gpu-2-130"]
        slices = api.list(gpudriver.RESOURCE_SLICES).get("items") or []
        assert cpu not in {get_path(s, "spec", "nodeName") for s in slices}
    finally:
        for node in (three, cpu):
            api.delete(NODES, "", node)
    # The garbage collector follows the owner reference.
    wait_until(
        lambda: not _exists(api, gpudriver.slice_name(three)),
        what=f"the slice of deleted node {three} collected",
    )


def _exists(api: KubeApi, slice_name: str) -> bool:
    try:
        api.get(gpudriver.RESOURCE_SLICES, "", slice_name)
    except NotFound:
        return False
    return True


def test_pods_sharing_a_claim_share_its_device_and_a_second_device_waits(
    api: KubeApi, namespace: str
) -> None:
    node = "kwok-gpu-0"  # one GPU
    api.create(RESOURCE_CLAIMS, namespace, claim("card"))
    api.create(PODS, namespace, claim_pod("first", "card", node=node))
    assert wait_until(lambda: scheduled(api, namespace, "first"), what="pod first") == node
    # The second pod of the claim goes where the claim's device is, beside the first.
    api.create(PODS, namespace, claim_pod("second", "card"))
    assert wait_until(lambda: scheduled(api, namespace, "second"), what="pod second") == node
    allocated = api.get(RESOURCE_CLAIMS, namespace, "card")["status"]
    [result] = allocated["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (
        "gpu.amd.com", node, "gpu-0-128"
    )
    assert sorted(r["name"] for r in allocated["reservedFor"]) == ["first", "second"]

    # Another claim for a device of that one-GPU node: none is left.
    api.create(RESOURCE_CLAIMS, namespace, claim("another"))
    api.create(PODS, namespace, claim_pod("third", "another", node=node))
    message = wait_until(
        lambda: unschedulable(api, namespace, "third"), what="pod third refused"
    )
    assert "cannot allocate all claims" in message, message
    assert allocation(api, namespace, "another") is None

    # Both pods gone: the resourceclaim controller releases the device, and it is the
    # third pod's.
    for name in ("first", "second"):
        api.request("DELETE", PODS.path(namespace, name), body={"gracePeriodSeconds": 0})
    wait_until(lambda: allocation(api, namespace, "card") is None, what="card released")
    assert wait_until(lambda: scheduled(api, namespace, "third"), what="pod third") == node


def _unowned(manifest: JSON) -> JSON:
    # The owners (Models) are not created here; the garbage collector would delete what
    # names an owner that does not exist.
    body = copy.deepcopy(manifest)
    body["metadata"].pop("ownerReferences", None)
    return body


def _model(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        # No backend-cache claim to create beside it (an emptyDir instead).
        "spec": {"backend": "vllm", "source": "HF://org/repo", "gpu": {"shared": "pack"},
                 "backendCache": {"enabled": False}},
    }


def test_rendered_members_of_a_budgeted_group_are_admitted_and_share_one_card(
    api: KubeApi, namespace: str
) -> None:
    settings = RenderSettings(policy=dev_policy(), gpu_device_class=gpudriver.DEVICE_CLASS)
    models = [_model("chat", namespace), _model("embed", namespace)]
    card = shared_card_of_models(models)
    rendered = [
        render_workload(workload_from_model(m), cache=None, settings=settings, shared_card=card)
        for m in models
    ]
    assert rendered[0].gpu_claim is not None
    api.create(RESOURCE_CLAIMS, namespace, _unowned(rendered[0].gpu_claim))
    for each in rendered:
        # Created (so admitted under Pod Security "baseline") with one replica.
        api.create(DEPLOYMENTS, namespace, _unowned(each.deployment))

    def pods_scheduled() -> list[JSON] | None:
        pods = api.list(PODS, namespace).get("items") or []
        nodes = [get_path(p, "spec", "nodeName") for p in pods]
        return pods if len(pods) == 2 and all(nodes) else None

    pods = wait_until(pods_scheduled, what="both members' pods scheduled")
    nodes = {get_path(p, "spec", "nodeName") for p in pods}
    assert len(nodes) == 1 and next(iter(nodes)).startswith("kwok-gpu-")
    name = rendered[0].gpu_claim["metadata"]["name"]
    status = api.get(RESOURCE_CLAIMS, namespace, name)["status"]
    assert len(status["allocation"]["devices"]["results"]) == 1
    assert len(status["reservedFor"]) == 2


def test_a_class_naming_amd_gpu_serves_its_requests_on_a_node_with_only_the_driver() -> None:
    """What docs/rendering.md advises where only the DRA driver runs: a DeviceClass with
    `extendedResourceName: amd.com/gpu` lets today's `amd.com/gpu: 1` pods (groups without
    a budget) use the driver's devices. A cluster of its own: the class would change how
    the shared cluster's nodes are counted."""
    with LocalCluster(name="flexinfer-dra-extended", nodes=[]) as cluster:
        api = KubeApi(cluster.new_api_client())
        extended = copy.deepcopy(dict(gpudriver.DEVICE_CLASS_MANIFEST))
        extended["metadata"] = {"name": "gpu-extended.example"}
        extended["spec"]["extendedResourceName"] = "amd.com/gpu"
        api.create(gpudriver.DEVICE_CLASSES, "", extended)
        # No amd.com/gpu capacity (no device plugin); one device of the driver.
        cluster.add_node(KwokNode(name="dra-only", gpus=0))
        gpudriver.publish(api, "dra-only", 1)
        wait_until(
            lambda: get_path(api.get(gpudriver.RESOURCE_SLICES, "", "dra-only-gpu.amd.com"),
                             "spec", "devices"),
            what="the slice",
        )
        for name in ("first", "second"):
            api.create(PODS, "default", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "image": "registry.local/none",
                                         "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            })  # fmt: skip
        assert wait_until(lambda: scheduled(api, "default", "first"), what="first") == "dra-only"
        # The one device is the first pod's alone: the second waits.
        message = wait_until(lambda: unschedulable(api, "default", "second"), what="second")
        assert "cannot allocate all claims" in message, message
        assert not scheduled(api, "default", "second")
