"""A budgeted group's one card, as the controller reads it from the cluster.

docs/election.md 1.7 and 3 and docs/rendering.md ("One card for a packed group"). With
the controller's `--gpu-device-class`, a shared group of Models whose members set a
VRAM budget, or a GPUGroup that sets `spec.vramBudget`, holds its card as one
ResourceClaim (`render.gpu_claim`) that every member's pod references. This module says
which groups are budgeted (`budgeted`, `gpu_group_budgeted`), which members' pods
cannot share the claim (`cannot_share`, `deployment_cannot_share`: their footprint then
counts as the whole card), and whether a live claim of the group's name is flexinfer's
own for this group (`claim_owner_problem`): a claim flexinfer did not create is never
taken over or changed. Pure: objects in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.gpu_claim import sharing_problem
from flexinfer_k8s.render.workload import workload_from_model, workload_from_model_deployment
from flexinfer_k8s.render.workloads import GROUP_LABEL, KIND_LABEL, MANAGED_BY
from flexinfer_kube.objects import get_path, name_of, namespace_of
from flexinfer_kube.resources import GPU_GROUPS, MODEL_DEPLOYMENTS, MODELS

COMPONENT = "shared-gpu"
"""The claim's `app.kubernetes.io/component` label (`render.gpu_claim`)."""


def budgeted(models: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a member of the group sets `spec.gpu.vramBudget`, as the core reads a
    budgeted group (`decide_group`): agreed or not, its members' pods reference the
    group's claim, so a budget changed on one member does not restart the others."""
    return any(get_path(model, "spec", "gpu", "vramBudget") not in (None, "") for model in models)


def cannot_share(model: Mapping[str, Any], device_class: str) -> str:
    """Why a member's pods cannot reference its group's claim (a sentence), or "" when
    they can. A spec the renderer cannot read cannot share either."""
    try:
        workload = workload_from_model(model)
    except InvalidFieldError as error:
        return f"Model {name_of(model)}'s spec cannot be read: {error}"
    return sharing_problem(workload, device_class)


def gpu_group_budgeted(group: Mapping[str, Any] | None) -> bool:
    """Whether a GPUGroup sets `spec.vramBudget`: its members' pods then reference the
    group's claim (with the controller's device class), whoever holds the card."""
    return get_path(group, "spec", "vramBudget") not in (None, "")


def deployment_cannot_share(md: Mapping[str, Any], device_class: str, *, group: str) -> str:
    """Why a GPUGroup member's pods cannot reference the group's claim (a sentence), or
    "" when they can; as `cannot_share` for a ModelDeployment of GPUGroup `group`."""
    try:
        workload = workload_from_model_deployment(md, group=group)
    except InvalidFieldError as error:
        return f"ModelDeployment {name_of(md)}'s spec cannot be read: {error}"
    return sharing_problem(workload, device_class)


def claim_owner_problem(
    claim: Mapping[str, Any],
    *,
    group: str,
    member_uids: set[str],
    gpu_group: bool = False,
) -> str:
    """Why the live claim `claim`, named as `group`'s, is not flexinfer's claim for the
    group (a sentence naming it), or "" when it is: labelled managed by flexinfer for
    this group, and owned by at least one of `member_uids` (a shared group of Models:
    its current members; `gpu_group`: the GPUGroup itself, whose members are
    ModelDeployments)."""
    name = f"ResourceClaim {namespace_of(claim)}/{name_of(claim)}"
    what = f"GPUGroup {group}" if gpu_group else f"shared group {group}"
    labels = get_path(claim, "metadata", "labels") or {}
    wanted = {
        **MANAGED_BY,
        GROUP_LABEL: group,
        KIND_LABEL: MODEL_DEPLOYMENTS.kind if gpu_group else MODELS.kind,
        "app.kubernetes.io/component": COMPONENT,
    }
    if any(labels.get(key) != value for key, value in wanted.items()):
        return (
            f"{name} exists and was not created by flexinfer for {what}: its "
            "members' pods would use a device someone else allocates, so nothing is applied; "
            "delete or rename that claim"
        )
    owner_kind = GPU_GROUPS.kind if gpu_group else MODELS.kind
    owners = {
        str(ref.get("uid"))
        for ref in get_path(claim, "metadata", "ownerReferences") or []
        if ref.get("kind") == owner_kind
    }
    if not owners & member_uids:
        whose = f"an earlier GPUGroup {group}" if gpu_group else f"earlier members of {what}"
        return f"{name} belongs to {whose} (waiting for the garbage collector to remove it)"
    return ""


def device_class_of(claim: Mapping[str, Any]) -> str:
    """The DeviceClass a claim's requests name (the first request's; ours have one)."""
    for request in get_path(claim, "spec", "devices", "requests") or []:
        return str(get_path(request, "exactly", "deviceClassName") or "")
    return ""


def in_use(claim: Mapping[str, Any]) -> bool:
    """Whether a pod holds the claim (the scheduler reserved it for one)."""
    return bool(get_path(claim, "status", "reservedFor"))
