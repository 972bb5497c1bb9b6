"""The local cluster's fake GPU driver for Dynamic Resource Allocation (`resource.k8s.io/v1`).

A real cluster gets its GPUs into DRA from a driver's kubelet plugin, which publishes a
ResourceSlice per node. kwok nodes run no kubelet and the process node runs no plugin,
so the local cluster publishes what AMD's DRA driver (github.com/ROCm/k8s-gpu-dra-driver)
would, through the API: its DeviceClass `gpu.amd.com` (selecting every device of the
driver `gpu.amd.com`) and, per GPU node, one ResourceSlice in a pool named after the
node, one device per GPU, named `gpu-<card>-<render node>` as that driver names them,
with its `type: amdgpu` attribute and a `memory` capacity (`GPU_MEMORY`). The slice is
owned by its Node, so it goes with it.

The real kube-scheduler then allocates these devices to ResourceClaims, and the
controller manager's resourceclaim controller releases a claim whose pods are gone. No
device is prepared for a container: kwok pods run nothing, and process-node pods run on
the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from flexinfer_kube.kubeapi import KubeApi, NotFound
from flexinfer_kube.resources import NODES, Resource

DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False)
RESOURCE_SLICES = Resource(
    "resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False
)
FIELD_MANAGER = "flexinfer-fake-gpu-driver"

DRIVER = "gpu.amd.com"
"""The driver name AMD's DRA driver publishes its GPUs under."""
DEVICE_CLASS = "gpu.amd.com"
"""The DeviceClass AMD's driver installs; the controller's `--gpu-device-class` names it."""
GPU_MEMORY = "24Gi"
"""Each fake GPU's `memory` capacity: the homelab card of docs/election.md 1.7."""
FIRST_RENDER_NODE = 128
"""`/dev/dri/renderD128` is a host's first GPU, so its device is `gpu-0-128`."""

DEVICE_CLASS_MANIFEST: Mapping[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DEVICE_CLASS},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == {DRIVER!r}"}}]},
}


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def device_name(index: int) -> str:
    return f"gpu-{index}-{FIRST_RENDER_NODE + index}"


def resource_slice(node: str, node_uid: str, gpus: int) -> dict[str, Any]:
    """The ResourceSlice of node `node` (uid `node_uid`, its owner) with `gpus` devices."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": device_name(index),
                    "attributes": {
                        "type": {"string": "amdgpu"},
                        "productName": {"string": "flexinfer fake GPU"},
                    },
                    "capacity": {"memory": {"value": GPU_MEMORY}},
                }
                for index in range(gpus)
            ],
        },
    }


def install(api: KubeApi) -> None:
    """Create (or re-apply) the DeviceClass, once per cluster."""
    api.apply(
        DEVICE_CLASSES, "", DEVICE_CLASS, dict(DEVICE_CLASS_MANIFEST), field_manager=FIELD_MANAGER
    )


def publish(api: KubeApi, node: str, gpus: int) -> None:
    """Publish node `node`'s `gpus` devices (server-side apply: a slice an earlier node of
    that name left is taken over, owner included); nothing for a node without GPUs."""
    if gpus <= 0:
        return
    uid = str(api.get(NODES, "", node)["metadata"]["uid"])
    body = resource_slice(node, uid, gpus)
    api.apply(RESOURCE_SLICES, "", slice_name(node), body, field_manager=FIELD_MANAGER)


def withdraw(api: KubeApi, node: str) -> None:
    """Delete node `node`'s slice, if any (before the node itself goes)."""
    with contextlib.suppress(NotFound):
        api.delete(RESOURCE_SLICES, "", slice_name(node))
