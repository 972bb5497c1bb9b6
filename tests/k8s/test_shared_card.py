"""What the controller reads of a budgeted group's card (`flexinfer_k8s.shared_card`)."""

from __future__ import annotations

from typing import Any

from flexinfer_k8s.render.gpu_claim import (
    claim_manifest,
    shared_card_of_gpu_group,
    shared_card_of_models,
)
from flexinfer_k8s.render.workload import workload_from_model, workload_from_model_deployment
from flexinfer_k8s.render.workloads import GROUP_LABEL, KIND_LABEL, MANAGED_BY
from flexinfer_k8s.shared_card import (
    budgeted,
    cannot_share,
    claim_owner_problem,
    deployment_cannot_share,
    device_class_of,
    gpu_group_budgeted,
    in_use,
)


def model(name: str, **gpu: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
        "spec": {"backend": "vllm", "source": "HF://o/r", "gpu": {"shared": "g", **gpu}},
    }


def ours(*members: dict[str, Any]) -> dict[str, Any]:
    return claim_manifest(
        workload_from_model(members[0]),
        shared_card_of_models(members),
        device_class="gpu.amd.com",
        labels={**MANAGED_BY, GROUP_LABEL: "g", KIND_LABEL: "Model"},
    )


def test_a_group_is_budgeted_when_any_member_sets_a_budget() -> None:
    assert not budgeted([model("a"), model("b")])
    assert budgeted([model("a"), model("b", vramBudget="24Gi")])


def test_only_a_member_on_one_amd_gpu_shares_the_card() -> None:
    assert cannot_share(model("a"), "gpu.amd.com") == ""
    assert "2 amd GPU(s)" in cannot_share(model("a", count=2), "gpu.amd.com")
    assert "nvidia" in cannot_share(model("a", vendor="nvidia"), "gpu.amd.com")
    assert "--gpu-device-class" in cannot_share(model("a"), "")
    assert "cannot be read" in cannot_share(model("a", vendor="intel"), "gpu.amd.com")


def test_a_claim_is_ours_only_when_labelled_for_the_group_and_owned_by_a_member() -> None:
    chat, embed = model("chat"), model("embed")
    claim = ours(chat, embed)
    assert claim_owner_problem(claim, group="g", member_uids={"uid-chat"}) == ""
    # Someone else's claim of that name.
    foreign = {**claim, "metadata": {"name": claim["metadata"]["name"], "namespace": "team"}}
    said = claim_owner_problem(foreign, group="g", member_uids={"uid-chat"})
    assert "ResourceClaim team/flexinfer-gpu-shared-g exists and was not created" in said
    # Ours, but for another group's label.
    assert "not created" in claim_owner_problem(claim, group="h", member_uids={"uid-chat"})
    # Ours, but its owners are gone (members deleted and made again).
    assert "earlier members" in claim_owner_problem(claim, group="g", member_uids={"uid-new"})


def test_the_device_class_and_whether_a_pod_holds_the_claim() -> None:
    claim = ours(model("chat"))
    assert device_class_of(claim) == "gpu.amd.com"
    assert not in_use(claim)
    assert in_use({**claim, "status": {"reservedFor": [{"resource": "pods", "name": "p"}]}})


def gpu_group(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
            "metadata": {"name": "night", "namespace": "team", "uid": "uid-night"},
            "spec": {"models": [{"name": "d"}], **spec}}  # fmt: skip


def deployment(name: str, **resources: Any) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "spec": {"backend": "vllm", "model": "o/r", **resources}}  # fmt: skip


def test_a_gpu_group_is_budgeted_by_its_own_spec_vram_budget() -> None:
    assert not gpu_group_budgeted(gpu_group())
    assert not gpu_group_budgeted(None)
    assert gpu_group_budgeted(gpu_group(vramBudget="24Gi"))


def test_only_a_gpu_group_member_on_one_amd_gpu_shares_the_card() -> None:
    assert deployment_cannot_share(deployment("d"), "gpu.amd.com", group="night") == ""
    nvidia = deployment("d", resources={"limits": {"nvidia.com/gpu": 1}})
    assert "1 nvidia GPU(s)" in deployment_cannot_share(nvidia, "gpu.amd.com", group="night")
    assert "--gpu-device-class" in deployment_cannot_share(deployment("d"), "", group="night")


def test_a_gpu_group_claim_is_ours_only_when_labelled_for_it_and_owned_by_the_group() -> None:
    group = gpu_group(vramBudget="24Gi")
    claim = claim_manifest(
        workload_from_model_deployment(deployment("d"), group="night"),
        shared_card_of_gpu_group(group),
        device_class="gpu.amd.com",
        labels={**MANAGED_BY, GROUP_LABEL: "night", KIND_LABEL: "ModelDeployment"},
    )
    ok = claim_owner_problem(claim, group="night", member_uids={"uid-night"}, gpu_group=True)
    assert ok == ""
    # A shared group of Models named alike does not own it, nor it theirs.
    assert "not created" in claim_owner_problem(claim, group="night", member_uids={"uid-night"})
    # The GPUGroup deleted and made again: the claim is the earlier one's.
    said = claim_owner_problem(claim, group="night", member_uids={"uid-new"}, gpu_group=True)
    assert "belongs to an earlier GPUGroup night" in said
    foreign = {**claim, "metadata": {"name": claim["metadata"]["name"], "namespace": "team"}}
    said = claim_owner_problem(foreign, group="night", member_uids={"uid-night"}, gpu_group=True)
    assert "was not created by flexinfer for GPUGroup night" in said
