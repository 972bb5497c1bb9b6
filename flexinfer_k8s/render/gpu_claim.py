"""One card for a budgeted group: the shared ResourceClaim its members' pods reference.

With the device plugin a pod's `amd.com/gpu: 1` is a whole GPU for that pod alone, so
two members of a group can never sit on one card. A group with a VRAM budget
(docs/election.md 1.7) holds its card as one ResourceClaim (Dynamic Resource
Allocation, `resource.k8s.io/v1`) for one device of the DeviceClass the administrator
names (`--gpu-device-class`, e.g. `gpu.amd.com`, the class AMD's DRA driver installs),
and every member's pod references that claim instead of requesting `amd.com/gpu`: the
scheduler allocates the device once and puts every pod that uses the claim on it.

The claim is the group's own: in the group's namespace (a pod can only name a claim of
its own namespace), named from the group alone (`claim_name`), labelled managed by
flexinfer, and owned by the GPUGroup (its controller) or by every member Model of a
shared group (none of them its controller), so it goes with the last of them. A
tenant has no field that names a claim: the renderer writes the only reference.

Without a device class, for a member that is not one AMD GPU (`sharing_problem`), or
for a group without a budget, nothing here is used and the pod requests its GPU as
before: such a group runs one member at a time. Pure: values in, manifests out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flexinfer_k8s.render.workload import Kind, Vendor, Workload
from flexinfer_kube.objects import JSON, get_path, name_of
from flexinfer_kube.resources import GPU_GROUPS, MODELS

POD_CLAIM = "gpu"
"""The name of the claim in the pod (`spec.resourceClaims[].name`, the container's
`resources.claims[].name`) and of the claim's one device request."""
MAX_NAME = 253
"""A ResourceClaim's name is a DNS subdomain."""


@attrs.frozen
class SharedCard:
    """A group whose members may share one card (it has a VRAM budget): what the renderer
    needs of the group beyond the member itself. Built by `shared_card_of_models` or
    `shared_card_of_gpu_group`."""

    owners: tuple[JSON, ...]
    """The claim's ownerReferences."""


def shared_card_of_models(models: Iterable[Mapping[str, Any]]) -> SharedCard:
    """A shared group of Models (`spec.gpu.shared`): the claim is owned by every member,
    none its controller, in name order (the same list whichever member renders it)."""
    owners = sorted(
        (
            {
                "apiVersion": MODELS.api_version,
                "kind": MODELS.kind,
                "name": name_of(model),
                "uid": str(get_path(model, "metadata", "uid") or ""),
            }
            for model in models
        ),
        key=lambda owner: (owner["name"], owner["uid"]),
    )
    return SharedCard(owners=tuple(owners))


def shared_card_of_gpu_group(group: Mapping[str, Any]) -> SharedCard:
    """A GPUGroup: the claim is the group's, the GPUGroup its controller."""
    owner = {
        "apiVersion": GPU_GROUPS.api_version,
        "kind": GPU_GROUPS.kind,
        "name": name_of(group),
        "uid": str(get_path(group, "metadata", "uid") or ""),
        "controller": True,
    }
    return SharedCard(owners=(owner,))


def claim_name(kind: Kind, group: str) -> str:
    """The group's claim: `flexinfer-gpu-shared-<group>` for a shared group of Models,
    `flexinfer-gpu-gpugroup-<group>` for a GPUGroup (both may have the same name in one
    namespace); a name too long for the API ends in a digest of the whole."""
    word = "shared" if kind is Kind.MODEL else "gpugroup"
    name = f"flexinfer-gpu-{word}-{group}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - 11].rstrip('.-')}-{digest}"


def sharing_problem(workload: Workload, device_class: str) -> str:
    """Why the pods of `workload`, a member of a budgeted group, cannot share its card
    (a sentence), or "" when they can."""
    if not workload.group:
        return f"{workload.kind.value} {workload.name} is in no group"
    if not device_class:
        return (
            "the controller has no --gpu-device-class: without a Dynamic Resource "
            "Allocation driver for the GPUs (AMD's installs the DeviceClass gpu.amd.com) "
            "two pods cannot hold one card, so the group runs one member at a time"
        )
    if workload.vendor is not Vendor.AMD or workload.gpu_count != 1:
        what = (
            "no GPU"
            if workload.vendor is Vendor.CPU or workload.gpu_count == 0
            else f"{workload.gpu_count} {workload.vendor.value} GPU(s)"
        )
        return (
            f"{workload.kind.value} {workload.name} asks for {what}: only a member on one "
            f"AMD GPU shares the group's card (device class {device_class}), so it runs "
            "alone on a card of its own"
        )
    return ""


def claim_manifest(
    workload: Workload, card: SharedCard, *, device_class: str, labels: Mapping[str, str]
) -> JSON:
    """The group's ResourceClaim: one device of `device_class`, in the group's namespace."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": claim_name(workload.kind, workload.group),
            "namespace": workload.namespace,
            "labels": {**labels, "app.kubernetes.io/component": "shared-gpu"},
            "ownerReferences": [dict(owner) for owner in card.owners],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": POD_CLAIM,
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    }
                ]
            }
        },
    }


def pod_claims(workload: Workload) -> list[JSON]:
    """The pod's `spec.resourceClaims`: the group's claim, by name, in the pod's own
    namespace (a pod cannot name another's)."""
    return [{"name": POD_CLAIM, "resourceClaimName": claim_name(workload.kind, workload.group)}]


def container_claims() -> list[JSON]:
    """The server container's `resources.claims`."""
    return [{"name": POD_CLAIM}]
