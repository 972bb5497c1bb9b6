"""Which pods flexinfer renders tolerate the GPU nodes' taints, and how.

GPU nodes are tainted (`dedicated=gpu:NoSchedule` on a typical homelab, the seeds'
nodes among them); the administrator lists those taints in the policy
(`gpuNodeTaints`, `render.policy`). The rule: a pod flexinfer renders tolerates exactly
those taints when it belongs on a GPU node, that is when

- one of its containers (init containers included) requests or limits a GPU
  (`amd.com/gpu`, `nvidia.com/gpu`): a serving pod with `gpu.count` > 0, a finetune
  Job's pod; or
- it references a ResourceClaim: the serving pod of a group whose members share one
  card through the group's claim (`render.gpu_claim`), which stands for its GPU; or
- it is pinned to nodes by a `nodeSelector`: a serving pod with `spec.nodeSelector` or
  one inherited from a node-bound ModelCache, the download Job of a NodeLocal or
  Memory cache, any Job that must run where a node's directory is.

Any other pod (a shared claim's download, a CPU-only server without a selector) gets no
automatic toleration and lands on the untainted nodes. The tolerations are the taints'
own (key, value and effect; `Exists` only for a taint without a value), never a
wildcard, and come after the tenant's own tolerations without repeating one. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flexinfer_k8s.render.policy import AdminPolicy
from flexinfer_k8s.render.workload import GPU_RESOURCES
from flexinfer_kube.objects import JSON

DEFAULT_ADMIN_POLICY = AdminPolicy()
"""The built-in policy (no `--policy FILE`): `dedicated=gpu:NoSchedule`."""


def _requests_gpu(containers: Iterable[Mapping[str, Any]]) -> bool:
    for container in containers:
        resources = container.get("resources") or {}
        for field in ("requests", "limits"):
            amounts = resources.get(field) or {}
            if any(
                key in GPU_RESOURCES and str(value) not in ("0", "")
                for key, value in amounts.items()
            ):
                return True
    return False


def belongs_on_gpu_node(pod: Mapping[str, Any]) -> bool:
    """Whether a pod spec requests a GPU (a GPU resource or a ResourceClaim) or is
    pinned to nodes by a nodeSelector."""
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    return (
        _requests_gpu(containers)
        or bool(pod.get("resourceClaims"))
        or bool(pod.get("nodeSelector"))
    )


def with_gpu_node_tolerations(
    tolerations: Iterable[Mapping[str, Any]], policy: AdminPolicy
) -> list[JSON]:
    """The tenant's `tolerations`, then each of the policy's GPU-node tolerations that is
    not among them already."""
    merged = [dict(t) for t in tolerations]
    for toleration in policy.gpu_node_tolerations():
        if toleration not in merged:
            merged.append(toleration)
    return merged


def tolerate_gpu_nodes(pod: JSON, policy: AdminPolicy) -> JSON:
    """Add the GPU nodes' tolerations to the pod spec `pod` when it belongs on one
    (the module's rule); returns the same dict."""
    if not belongs_on_gpu_node(pod):
        return pod
    tolerations = with_gpu_node_tolerations(pod.get("tolerations") or [], policy)
    if tolerations:
        pod["tolerations"] = tolerations
    return pod
