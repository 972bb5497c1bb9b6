"""A budgeted group's members share one card through the group's ResourceClaim
(docs/rendering.md, "One card for a packed group"): with the cluster's DRA device class
their pods reference the group's claim instead of requesting `amd.com/gpu`; without a
budget or without the class, rendering is exactly today's.

Expected manifests are written from the `resource.k8s.io/v1` API and the Pod spec, never
taken from the renderer's output."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from flexinfer_k8s.render.gpu_claim import (
    SharedCard,
    claim_name,
    shared_card_of_gpu_group,
    shared_card_of_models,
    sharing_problem,
)
from flexinfer_k8s.render.workload import (
    Kind,
    workload_from_model,
    workload_from_model_deployment,
)
from flexinfer_k8s.render.workloads import RenderSettings, render_workload
from tests.render.test_backends import SETTINGS, md, model, pod, server

DRA = attrs.evolve(SETTINGS, gpu_device_class="gpu.amd.com")
GPU = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
"""test_backends' policy's GPU-node taint, tolerated."""


def member(name: str, group: str = "chat", namespace: str = "ns", **spec: Any) -> dict[str, Any]:
    obj = model(name, gpu={"shared": group, **spec.pop("gpu", {})}, **spec)
    obj["metadata"].update(namespace=namespace, uid=f"uid-{namespace}-{name}")
    return obj


def render(obj: dict[str, Any], card: SharedCard | None,
           settings: RenderSettings = DRA) -> Any:
    return render_workload(
        workload_from_model(obj), cache=None, settings=settings, shared_card=card
    )


def test_a_budgeted_members_pod_references_the_groups_claim_instead_of_a_gpu() -> None:
    a, b = member("a"), member("b")
    rendered = render(a, shared_card_of_models([b, a]))
    p, c = pod(rendered), server(rendered)
    assert p["resourceClaims"] == [
        {"name": "gpu", "resourceClaimName": "flexinfer-gpu-shared-chat"}
    ]
    assert c["resources"] == {"claims": [{"name": "gpu"}]}  # no amd.com/gpu at all
    # Still a GPU pod: it tolerates the GPU nodes and gets the ROCm device groups.
    assert p["tolerations"] == [GPU]
    assert p["securityContext"]["supplementalGroups"] == [44, 109]
    assert rendered.gpu_claim == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "flexinfer-gpu-shared-chat",
            "namespace": "ns",
            "labels": {
                "app.kubernetes.io/managed-by": "flexinfer",
                "app.kubernetes.io/component": "shared-gpu",
                "ai.flexinfer/group": "chat",
                "ai.flexinfer/kind": "Model",
            },
            # Every member owns it (none controls it): it goes with the last of them.
            "ownerReferences": [
                {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "name": "a",
                 "uid": "uid-ns-a"},
                {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "name": "b",
                 "uid": "uid-ns-b"},
            ],
        },
        "spec": {"devices": {"requests": [{
            "name": "gpu",
            "exactly": {"deviceClassName": "gpu.amd.com", "allocationMode": "ExactCount",
                        "count": 1},
        }]}},
    }


def test_every_member_renders_the_same_claim_and_references_it() -> None:
    members = [member("a"), member("b"), member("c", backend="llama-cpp",
                                                source="file:///m.gguf")]
    card = shared_card_of_models(members)
    rendered = [render(m, card) for m in members]
    assert all(r.gpu_claim == rendered[0].gpu_claim for r in rendered)
    assert {pod(r)["resourceClaims"][0]["resourceClaimName"] for r in rendered} == {
        rendered[0].gpu_claim["metadata"]["name"]
    }


def _without_settings_noise(rendered: Any) -> Any:
    return (rendered.deployment, rendered.service, rendered.network_policy)


@pytest.mark.parametrize(
    ("card", "settings"),
    [(None, DRA), (SharedCard(owners=()), SETTINGS)],
    ids=["no-budget", "no-device-class"],
)
def test_without_a_budget_or_without_the_device_class_rendering_is_todays(
    card: SharedCard | None, settings: RenderSettings
) -> None:
    obj = member("a")
    today = render_workload(workload_from_model(obj), cache=None, settings=SETTINGS)
    rendered = render(obj, card, settings)
    assert _without_settings_noise(rendered) == _without_settings_noise(today)
    assert server(rendered)["resources"] == {
        "requests": {"amd.com/gpu": "1"}, "limits": {"amd.com/gpu": "1"}
    }
    assert "resourceClaims" not in pod(rendered)
    assert rendered.gpu_claim is None


@pytest.mark.parametrize(
    ("gpu", "said"),
    [
        ({"vendor": "nvidia"}, "asks for 1 nvidia GPU(s): only a member on one AMD GPU"),
        ({"count": 2}, "asks for 2 amd GPU(s)"),
        ({"count": 0}, "asks for no GPU"),
    ],
)
def test_a_member_not_on_one_amd_gpu_keeps_its_own_request(
    gpu: dict[str, Any], said: str
) -> None:
    obj = member("a", gpu=gpu)
    rendered = render(obj, shared_card_of_models([obj]))
    assert "resourceClaims" not in pod(rendered)
    assert rendered.gpu_claim is None
    assert said in sharing_problem(workload_from_model(obj), "gpu.amd.com")


def test_without_the_device_class_the_reason_names_the_flag() -> None:
    said = sharing_problem(workload_from_model(member("a")), "")
    assert "--gpu-device-class" in said and "one member at a time" in said
    assert sharing_problem(workload_from_model(member("a")), "gpu.amd.com") == ""


def test_a_gpu_groups_claim_is_the_groups_own_and_the_group_controls_it() -> None:
    group = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
             "metadata": {"name": "night", "namespace": "ns", "uid": "uid-g"}}
    workload = workload_from_model_deployment(md("d"), group="night")
    rendered = render_workload(workload, cache=None, settings=DRA,
                               shared_card=shared_card_of_gpu_group(group))
    assert pod(rendered)["resourceClaims"] == [
        {"name": "gpu", "resourceClaimName": "flexinfer-gpu-gpugroup-night"}
    ]
    assert rendered.gpu_claim["metadata"]["ownerReferences"] == [
        {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup", "name": "night",
         "uid": "uid-g", "controller": True}
    ]
    assert rendered.gpu_claim["metadata"]["labels"]["ai.flexinfer/kind"] == "ModelDeployment"


def test_claim_names_are_per_kind_deterministic_and_valid_when_long() -> None:
    assert claim_name(Kind.MODEL, "x") != claim_name(Kind.MODEL_DEPLOYMENT, "x")
    long_group = "g" * 250
    name = claim_name(Kind.MODEL_DEPLOYMENT, long_group)
    assert len(name) <= 253 and name == claim_name(Kind.MODEL_DEPLOYMENT, long_group)
    assert name != claim_name(Kind.MODEL_DEPLOYMENT, "g" * 249)


def test_a_tenant_reaches_only_its_own_groups_claim_in_its_own_namespace() -> None:
    """Claims are namespaced and a pod names one of its own namespace only; the name
    comes from the group alone, and no tenant field adds or changes a reference."""
    mine = member("a", namespace="team-a")
    # Same group name, another namespace; and every pod field a tenant may set.
    theirs = member("b", namespace="team-b", podLabels={"team": "b"},
                    podAnnotations={"flexinfer.test/ready-delay": "1s"},
                    tolerations=[GPU])
    for obj in (mine, theirs):
        rendered = render(obj, shared_card_of_models([obj]))
        namespace = obj["metadata"]["namespace"]
        assert rendered.deployment["metadata"]["namespace"] == namespace
        assert rendered.gpu_claim["metadata"]["namespace"] == namespace
        assert pod(rendered)["resourceClaims"] == [
            {"name": "gpu", "resourceClaimName": rendered.gpu_claim["metadata"]["name"]}
        ]
        assert server(rendered)["resources"]["claims"] == [{"name": "gpu"}]
        owners = rendered.gpu_claim["metadata"]["ownerReferences"]
        assert [o["uid"] for o in owners] == [obj["metadata"]["uid"]]
