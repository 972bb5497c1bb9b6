"""Which rendered pods tolerate the GPU nodes' taints (docs/resources.md, "Tolerations"):
those that request a GPU or are pinned by a nodeSelector, exactly the policy's taints,
never a wildcard, after the tenant's own."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_k8s.render.cache import CacheImages, cache_from_k8s, download_job
from flexinfer_k8s.render.finetune import finetune_job
from flexinfer_k8s.render.policy import admin_policy_from_yaml
from flexinfer_k8s.render.workloads import RenderSettings
from tests.render.test_backends import SETTINGS, cache, md, model, pod, render

DEDICATED_GPU = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
"""The built-in policy's GPU-node taint, tolerated (the Jobs below render under it)."""
GPU = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
"""The GPU-node taint of test_backends' policy (`gpu:NoSchedule`, no value), tolerated."""
NODE = {"kubernetes.io/hostname": "gpu-1"}
TWO_TAINTS = admin_policy_from_yaml(
    "gpuNodeTaints:\n"
    "  - {key: nvidia.com/gpu, effect: NoSchedule}\n"
    "  - {key: dedicated, value: gpu, effect: NoExecute}\n"
)


def job_pod(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"])


@pytest.mark.parametrize(
    ("resource", "tolerated"),
    [
        (model(), True),  # gpu.count defaults to 1
        (md(), True),
        (model(gpu={"vendor": "nvidia"}), True),
        (model(gpu={"count": 0}), False),  # a CPU server may run anywhere
        (model(gpu={"count": 0}, nodeSelector=NODE), True),  # pinned: where the GPUs are
        (md(image="my/vllm:1", resources={"limits": {"amd.com/gpu": "0"}}), False),
        (md(image="my/vllm:1", resources={"limits": {"amd.com/gpu": "0"}}, nodeSelector=NODE),
         True),
    ],
    ids=["model", "model-deployment", "nvidia", "cpu", "cpu-pinned", "md-cpu", "md-pinned"],
)
def test_serving_pods_that_need_a_gpu_node_tolerate_its_taint(
    resource: dict[str, Any], tolerated: bool
) -> None:
    assert pod(render(resource)).get("tolerations") == ([GPU] if tolerated else None)


def test_a_pod_pinned_to_a_node_bound_cache_tolerates_too() -> None:
    memory = cache("ram", storageStrategy="Memory", nodeSelector=NODE)
    p = pod(render(model(gpu={"count": 0}, cache={"modelCacheRef": "ram"}), memory))
    assert p["nodeSelector"] == NODE  # inherited from the cache
    assert p["tolerations"] == [GPU]


def test_exactly_the_policys_taints_never_a_wildcard_and_no_repeats() -> None:
    settings = RenderSettings(images=SETTINGS.images, policy=TWO_TAINTS)
    mine = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}
    p = pod(render(model(tolerations=[mine]), settings=settings))
    assert p["tolerations"] == [
        mine,  # the tenant's, already one of the policy's: not repeated
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert all(t.get("key") for t in p["tolerations"])


@pytest.mark.parametrize(
    ("spec", "tolerated"),
    [
        ({"storageStrategy": "SharedPVC"}, False),  # a claim: any node may fill it
        ({"storageStrategy": "NodeLocal", "nodeSelector": NODE}, True),
        ({"storageStrategy": "Memory", "nodeSelector": NODE}, True),
        ({"storageStrategy": "Memory", "existingClaimName": "nfs"}, False),
    ],
    ids=["shared-pvc", "node-local", "memory", "memory-on-a-claim"],
)
def test_download_jobs_of_node_bound_caches_tolerate(spec: dict[str, Any], tolerated: bool) -> None:
    job = download_job(cache_from_k8s(cache("c", **spec)), CacheImages())
    assert job_pod(job).get("tolerations") == ([DEDICATED_GPU] if tolerated else None)
    configured = download_job(cache_from_k8s(cache("c", **spec)), CacheImages(), policy=TWO_TAINTS)
    assert len(job_pod(configured).get("tolerations") or []) == (2 if tolerated else 0)


def test_finetune_jobs_tolerate_the_gpu_nodes() -> None:
    obj = cache("tune", storageStrategy="NodeLocal", nodeSelector=NODE,
                finetune={"dataset": "file:///data/x.jsonl", "image": "trainer:1"})
    job = finetune_job(cache_from_k8s(obj), obj, default_image="")
    assert job_pod(job)["tolerations"] == [DEDICATED_GPU]
    claim = cache("tune", finetune={"image": "trainer:1"})  # no selector, but a GPU request
    job = finetune_job(cache_from_k8s(claim), claim, default_image="", policy=TWO_TAINTS)
    assert [t["key"] for t in job_pod(job)["tolerations"]] == ["nvidia.com/gpu", "dedicated"]
