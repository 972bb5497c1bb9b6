"""The CRDs on a real API server: install, examples, defaults, rejections, columns.

Everything goes through kubectl, as a user would: the messages asserted here are the
ones a user sees.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer_devcluster.localcluster import LocalCluster

from .kubectl import (
    CRD_NAMES,
    ROOT,
    Kubectl,
    create_namespace,
    delete_namespace,
    install_crds,
    kubectl_for,
)

pytestmark = pytest.mark.k8s

EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
EXAMPLES = [p for p in EXAMPLES if "scenarios" not in p.parts]


@pytest.fixture(scope="module")
def kubectl(local_cluster: LocalCluster) -> Kubectl:
    return kubectl_for(local_cluster)


@pytest.fixture(scope="module")
def crds_installed(local_cluster: LocalCluster) -> None:
    install_crds(local_cluster)


@pytest.fixture(scope="module")
def namespace(kubectl: Kubectl, crds_installed: None) -> Iterator[str]:
    name = create_namespace(kubectl, "crds")
    yield name
    delete_namespace(kubectl, name)


# (kind, name) in examples/ -> fields the example leaves out, with the value the API
# server must fill in.
EXPECTED_DEFAULTS: dict[tuple[str, str], dict[str, Any]] = {
    ("Model", "qwen-coder"): {
        "spec.gpu.priority": 100,
        # Not defaulted: left out, the controller's --default-swap-cooldown applies.
        "spec.gpu.swapCooldown": None,
        "spec.gpu.vendor": "amd",
        "spec.gpu.count": 1,
        "spec.gpu.forcePromotion": False,
        "spec.gpu.default": False,
        "spec.gpu.drainTimeout": "60s",
        "spec.serverless.enabled": True,
        "spec.serverless.minReplicas": 0,
        "spec.serverless.idleTimeout": "5m",
        "spec.serverless.coldStartTimeout": "60s",
    },
    ("Model", "qwen-chat"): {
        "spec.gpu.priority": 200,
        "spec.gpu.swapCooldown": None,
        "spec.serverless.idleTimeout": "10m",
        "spec.serverless.coldStartTimeout": "60s",
    },
    ("GPUGroup", "homelab-rx7900xt"): {
        "spec.scalingPolicy.drainTimeoutSeconds": 30,
        "spec.antiThrashing.enabled": True,
    },
    # The packed group: the quantities are kept as written, nothing fills them in.
    ("Model", "small-chat"): {
        "spec.gpu.vramBudget": "22Gi",
        "spec.gpu.vramEstimate": "3Gi",
        "spec.gpu.priority": 200,
        "spec.llamacpp.nGpuLayers": 999,
    },
    ("Model", "small-coder"): {"spec.llamacpp.nGpuLayers": 999, "spec.gpu.swapCooldown": None},
    ("Model", "small-helper"): {
        "spec.gpu.priority": 100,
        "spec.gpu.vramEstimate": "2Gi",
        "spec.llamacpp": None,
    },
    ("ModelDeployment", "qwen3-8b-chat"): {
        "spec.replicas": 1,
        "spec.coldStartTimeoutSeconds": 60,
        "spec.healthCheck.initialDelaySeconds": 120,
        "spec.healthCheck.periodSeconds": 30,
        "spec.healthCheck.timeoutSeconds": 10,
        "spec.healthCheck.failureThreshold": 3,
    },
    ("ModelDeployment", "qwen3-4b-tools"): {
        "spec.healthCheck.initialDelaySeconds": 120,
        "spec.healthCheck.failureThreshold": 3,
        "spec.priority": 50,
    },
    ("ModelCache", "qwen-support-lora"): {
        "spec.storageSize": "50Gi",
        "spec.finetune.mode": "qlora",
        "spec.finetune.epochs": 2,
        "spec.finetune.batchSize": 4,
        "spec.finetune.learningRate": "2e-4",
        "spec.finetune.maxSeqLen": 2048,
        "spec.finetune.timeoutSeconds": 21600,
        "spec.finetune.gpuLease.ttlSeconds": 3600,
    },
    ("ModelCache", "qwen3-8b-ram"): {"spec.storageStrategy": "Memory"},
    ("ModelCache", "qwen-chat-weights"): {"spec.storageStrategy": "SharedPVC"},
    ("ModelCache", "qwen-coder-gguf"): {"spec.storageStrategy": "SharedPVC"},
    ("ModelCache", "qwen3-8b-weights"): {"spec.storageSize": "50Gi"},
    ("ModelCache", "qwen3-8b-mlc"): {"spec.storageSize": "50Gi"},
    ("ModelDeployment", "qwen3-8b-serverless"): {
        "spec.minReplicas": 0,
        "spec.idleTimeoutSeconds": 300,
        "spec.priority": 100,
        "spec.mlcllm.mode": "local",
    },
    ("ModelDeployment", "qwen3-8b-long-context"): {
        "spec.idleTimeoutSeconds": 300,
        "spec.backendCache.enabled": True,
        "spec.backendCache.size": "50Gi",
        "spec.priority": 100,
        "spec.healthCheck.initialDelaySeconds": 180,
        "spec.healthCheck.periodSeconds": 30,
        "spec.mlcllm.overrides.maxNumSequence": 2,
        "spec.mlcllm.overrides.gpuMemoryUtilization": "0.9",
    },
    ("GPULease", "homelab-gpu-maintenance"): {"spec.group": "homelab-gpu"},
    # The packed GPUGroup: its quantities are kept as written; its members' own priority
    # is the CRD's default (the group's entry wins), their llama.cpp layers all offloaded.
    ("GPUGroup", "small-card-gg"): {
        "spec.vramBudget": "22Gi",
        "spec.models[0].vramEstimate": "3Gi",
        "spec.models[2].vramEstimate": "14Gi",
        "spec.models[2].priority": 300,
    },
    ("ModelDeployment", "gg-chat"): {
        "spec.replicas": 1,
        "spec.priority": 100,
        "spec.coldStartTimeoutSeconds": 60,
        "spec.llamacpp.nGpuLayers": 999,
        "spec.healthCheck.failureThreshold": 3,
    },
    ("ModelDeployment", "gg-coder"): {"spec.priority": 100, "spec.llamacpp.ctxSize": 8192},
    ("ModelDeployment", "gg-reviewer"): {"spec.priority": 100, "spec.minReplicas": 0},
}

# Defaults of a GPUGroup whose blocks are left out entirely: `default: {}` on the
# block makes the server create it and then fill in its fields.
GPUGROUP_BLOCK_DEFAULTS = {
    "spec.models[0].priority": 100,
    "spec.scalingPolicy.strategy": "Exclusive",
    "spec.scalingPolicy.preemptionPolicy": "Graceful",
    "spec.scalingPolicy.drainTimeoutSeconds": 60,
    "spec.antiThrashing.enabled": True,
    "spec.antiThrashing.hysteresisWindowSeconds": 10,
    "spec.antiThrashing.requestQueueThreshold": 3,
    "spec.antiThrashing.minimumRunDurationSeconds": 30,
    "spec.antiThrashing.cooldownAfterPreemptionSeconds": 60,
}

PRINTER_COLUMNS = {
    "models": [
        "NAME", "BACKEND", "SHARED", "PRIORITY", "PHASE", "STATE", "QUEUE", "REASON",
        "LASTACTIVE", "AGE",
    ],
    "gpuleases": ["NAME", "GROUP", "OWNER", "NODE", "EXPIRES", "AGE"],
    "gpugroups": ["NAME", "PHASE", "ACTIVE", "REASON", "SWAPS", "AGE"],
    "modelcaches": ["NAME", "STRATEGY", "PATH", "READY", "SOURCE"],
    "modeldeployments": [
        "NAME", "BACKEND", "MODEL", "GROUP", "PHASE", "REASON", "LASTACCESS", "AGE",
    ],
}  # fmt: skip


def field(document: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted path such as `spec.models[0].priority`, None if absent."""
    value: Any = document
    for part in dotted.split("."):
        name, _, index = part.partition("[")
        if not isinstance(value, dict) or name not in value:
            return None
        value = value[name]
        if index:
            value = value[int(index.rstrip("]"))]
    return value


def model(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "backend": "mlc-llm",
        "source": "HF://mlc-ai/Qwen2.5-7B-Instruct-q4f16_1-MLC",
    }
    base.update(spec)
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": "bad-model"},
        "spec": base,
    }


def model_deployment(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"backend": "mlc-llm", "model": "HF://mlc-ai/Qwen3-8B-q4f16_1-MLC"}
    base.update(spec)
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "bad-deployment"},
        "spec": base,
    }


def model_cache(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"source": "HF://Qwen/Qwen2.5-7B-Instruct"}
    base.update(spec)
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelCache",
        "metadata": {"name": "bad-cache"},
        "spec": base,
    }


def gpu_group(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"models": [{"name": "a"}, {"name": "b"}]}
    base.update(spec)
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPUGroup",
        "metadata": {"name": "bad-group"},
        "spec": base,
    }


def without_source() -> dict[str, Any]:
    manifest = model()
    del manifest["spec"]["source"]
    return manifest


VRAM = "between 1Mi and 1Ti"


def estimate(value: Any) -> dict[str, Any]:
    return model(gpu={"vramEstimate": value})


# (id, manifest, the field the message must name, another fragment of the message)
INVALID: list[tuple[str, Callable[[], dict[str, Any]], str, str]] = [
    ("priority-1001", lambda: model(gpu={"priority": 1001}), "spec.gpu.priority", "1000"),
    (
        "ttl-30",
        lambda: model_cache(finetune={"gpuLease": {"group": "5930k-textgen", "ttlSeconds": 30}}),
        "spec.finetune.gpuLease.ttlSeconds",
        "60",
    ),
    ("swap-cooldown-3x", lambda: model(gpu={"swapCooldown": "3x"}), "spec.gpu.swapCooldown", "3x"),
    ("default-not-boolean", lambda: model(gpu={"default": "yes"}), "spec.gpu.default", "boolean"),
    (
        "max-num-sequence-0",
        lambda: model_deployment(mlcllm={"overrides": {"maxNumSequence": 0}}),
        "spec.mlcllm.overrides.maxNumSequence",
        "1",
    ),
    (
        "eleven-service-labels",
        lambda: model(serviceLabels=[f"label-{i}" for i in range(11)]),
        "spec.serviceLabels",
        "10",
    ),
    (
        "eleven-service-labels-deployment",
        lambda: model_deployment(serviceLabels=[f"label-{i}" for i in range(11)]),
        "spec.serviceLabels",
        "10",
    ),
    ("unknown-backend", lambda: model(backend="tgi"), "spec.backend", "tgi"),
    ("missing-source", without_source, "spec.source", "Required value"),
    ("unknown-scheme", lambda: model(source="s3://bucket/model"), "spec.source", "s3://"),
    (
        "cache-unknown-scheme",
        lambda: model_cache(source="s3://bucket/model"),
        "spec.source",
        "s3://",
    ),
    ("gpu-count-9", lambda: model(gpu={"count": 9}), "spec.gpu.count", "8"),
    (
        "swap-cooldown-721h",
        lambda: model(gpu={"swapCooldown": "99999999999h"}),
        "spec.gpu.swapCooldown",
        "720h",
    ),
    ("drain-timeout-2h", lambda: model(gpu={"drainTimeout": "2h"}), "spec.gpu.drainTimeout", "1h"),
    (
        "drain-timeout-soon",
        lambda: model(gpu={"drainTimeout": "soon"}),
        "spec.gpu.drainTimeout",
        "soon",
    ),
    (
        "idle-timeout-721h",
        lambda: model(serverless={"idleTimeout": "721h"}),
        "spec.serverless.idleTimeout",
        "720h",
    ),
    (
        "idle-seconds-10e12",
        lambda: model_deployment(idleTimeoutSeconds=10**12),
        "spec.idleTimeoutSeconds",
        "2592000",
    ),
    ("replicas-3e9", lambda: model_deployment(replicas=3_000_000_000), "spec.replicas", "100"),
    (
        "lease-ttl-2e62",
        lambda: model_cache(finetune={"gpuLease": {"group": "g", "ttlSeconds": 2**62}}),
        "spec.finetune.gpuLease.ttlSeconds",
        "2592000",
    ),
    ("env-without-name", lambda: model(env=[{"value": "x"}]), "spec.env[0].name", "Required"),
    (
        "thirty-three-extra-args",
        lambda: model_deployment(extraArgs=["--x"] * 33),
        "spec.extraArgs",
        "32",
    ),
    (
        "toleration-operator",
        lambda: model(tolerations=[{"key": "gpu", "operator": "Maybe"}]),
        "spec.tolerations[0].operator",
        "Maybe",
    ),
    (
        "vllm-utilization-1.5",
        lambda: model(vllm={"gpuMemoryUtilization": "1.5"}),
        "spec.vllm.gpuMemoryUtilization",
        "1.5",
    ),
    ("ctx-size-64", lambda: model(llamacpp={"ctxSize": 64}), "spec.llamacpp.ctxSize", "128"),
    ("shm-size", lambda: model_deployment(shmSize="lots"), "spec.shmSize", "lots"),
    (
        "finetune-gpus-9",
        lambda: model_cache(finetune={"gpu": {"count": 9}}),
        "spec.finetune.gpu.count",
        "8",
    ),
    (
        "gpu-in-model-resources",
        lambda: model(resources={"limits": {"amd.com/gpu": "1"}}),
        "spec.resources.limits",
        "gpu.count",
    ),
    (
        "utilization-1.5",
        lambda: model_deployment(mlcllm={"overrides": {"gpuMemoryUtilization": "1.5"}}),
        "spec.mlcllm.overrides.gpuMemoryUtilization",
        "1.5",
    ),
    (
        "min-above-replicas",
        lambda: model_deployment(replicas=1, minReplicas=2),
        "spec.minReplicas",
        "must not exceed replicas",
    ),
    (
        "cold-start-5",
        lambda: model_deployment(coldStartTimeoutSeconds=5),
        "spec.coldStartTimeoutSeconds",
        "10",
    ),
    ("no-members", lambda: gpu_group(models=[]), "spec.models", "1"),
    (
        "duplicate-member",
        lambda: gpu_group(models=[{"name": "a"}, {"name": "a"}]),
        "spec.models[1]",
        "Duplicate",
    ),
    (
        "member-name-too-long",
        lambda: gpu_group(models=[{"name": "m" * 64}]),
        "spec.models[0].name",
        "63",
    ),
    (
        "drain-301",
        lambda: gpu_group(scalingPolicy={"drainTimeoutSeconds": 301}),
        "spec.scalingPolicy.drainTimeoutSeconds",
        "300",
    ),
    ("vram-budget-words", lambda: model(gpu={"vramBudget": "24 GB"}), "spec.gpu.vramBudget", "GB"),
    ("vram-budget-2Ti", lambda: model(gpu={"vramBudget": "2Ti"}), "spec.gpu.vramBudget", VRAM),
    ("vram-budget-int-0", lambda: model(gpu={"vramBudget": 0}), "spec.gpu.vramBudget", VRAM),
    ("vram-estimate-sign", lambda: estimate("-4Gi"), "spec.gpu.vramEstimate", "-4Gi"),
    ("vram-estimate-milli", lambda: estimate("100m"), "spec.gpu.vramEstimate", VRAM),
    ("vram-estimate-long", lambda: estimate("1" * 33), "spec.gpu.vramEstimate", "32"),
    ("group-vram-budget-1Ki", lambda: gpu_group(vramBudget="1Ki"), "spec.vramBudget", VRAM),
    (
        "group-member-vram-estimate",
        lambda: gpu_group(models=[{"name": "a", "vramEstimate": "4 GiB"}]),
        "spec.models[0].vramEstimate",
        "4 GiB",
    ),
    (
        "lease-without-group",
        lambda: {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "GPULease",
            "metadata": {"name": "bad-lease"},
            "spec": {"owner": "me"},
        },
        "spec.group",
        "Required value",
    ),
]  # fmt: skip


@pytest.mark.parametrize("name", CRD_NAMES)
def test_crd_is_established(kubectl: Kubectl, crds_installed: None, name: str) -> None:
    crd = kubectl.json("get", "crd", name)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    assert crd["status"]["acceptedNames"]["kind"] == crd["spec"]["names"]["kind"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_applies_and_reads_back_with_defaults(
    kubectl: Kubectl, crds_installed: None, namespace: str, path: Path
) -> None:
    kubectl.ok("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    kubectl.ok("apply", "-n", namespace, "-f", str(path))
    with path.open(encoding="utf-8") as stream:
        documents = [doc for doc in yaml.safe_load_all(stream) if doc]
    for document in documents:
        kind, name = document["kind"], document["metadata"]["name"]
        stored = kubectl.json("get", "-n", namespace, f"{kind.lower()}.ai.flexinfer/{name}")
        for dotted, expected in EXPECTED_DEFAULTS[(kind, name)].items():
            assert field(stored, dotted) == expected, f"{kind}/{name} {dotted}"
        # Nothing the example says was pruned.
        assert_contains(stored["spec"], document["spec"], f"{kind}/{name}.spec")


def assert_contains(stored: Any, sent: Any, where: str) -> None:
    if isinstance(sent, dict):
        assert isinstance(stored, dict), where
        for key, value in sent.items():
            assert key in stored, f"{where}.{key} was pruned"
            assert_contains(stored[key], value, f"{where}.{key}")
    elif isinstance(sent, list):
        assert isinstance(stored, list) and len(stored) == len(sent), where
        for index, (left, right) in enumerate(zip(stored, sent, strict=True)):
            assert_contains(left, right, f"{where}[{index}]")
    else:
        assert stored == sent, where


def test_rendering_fields_are_kept_and_defaulted(
    kubectl: Kubectl, crds_installed: None, namespace: str
) -> None:
    sent = {
        "env": [{"name": "HSA_OVERRIDE_GFX_VERSION", "value": "11.0.0"}],
        "podLabels": {"team": "a"},
        "podAnnotations": {"flexinfer.test/ready-delay": "2s"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "shmSize": "4Gi",
        "extraArgs": ["--verbose"],
        "vllm": {"gpuMemoryUtilization": "0.85", "maxModelLen": 8192},
        "llamacpp": {"ctxSize": 2048},
    }
    for manifest, kind in (
        (model(source="ollama://llama3.2:1b", backend="ollama", **sent), "mdl"),
        (model_deployment(image="my/image:1", **sent), "modeldeployment"),
    ):
        manifest["metadata"]["name"] = "rendering-fields"
        kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
        stored = kubectl.json("get", "-n", namespace, f"{kind}/rendering-fields")
        assert_contains(stored["spec"], manifest["spec"], f"{kind}.spec")
        assert stored["spec"]["llamacpp"] == {"ctxSize": 2048, "nGpuLayers": 999}
    cache = model_cache(source="pvc://models/qwen", downloadImage="mirror/copy:1",
                        finetune={"gpu": {"vendor": "nvidia"}})
    cache["metadata"]["name"] = "rendering-fields"
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(cache))
    stored = kubectl.json("get", "-n", namespace, "modelcache/rendering-fields")
    assert stored["spec"]["finetune"]["gpu"] == {"vendor": "nvidia", "count": 1}
    assert stored["spec"]["source"] == "pvc://models/qwen"


def test_blocks_left_out_are_defaulted_whole(
    kubectl: Kubectl, crds_installed: None, namespace: str
) -> None:
    group = gpu_group()
    group["metadata"]["name"] = "defaults-only"
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(group))
    stored = kubectl.json("get", "-n", namespace, "gpugroup/defaults-only")
    for dotted, expected in GPUGROUP_BLOCK_DEFAULTS.items():
        assert field(stored, dotted) == expected, dotted
    minimal = model()
    minimal["metadata"]["name"] = "minimal-model"
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(minimal))
    stored = kubectl.json("get", "-n", namespace, "mdl/minimal-model")
    assert stored["spec"]["gpu"] == {
        "vendor": "amd",
        "count": 1,
        "priority": 100,
        "forcePromotion": False,
        "default": False,
        "drainTimeout": "60s",
    }
    assert stored["spec"]["serverless"] == {
        "enabled": True,
        "minReplicas": 0,
        "idleTimeout": "5m",
        "coldStartTimeout": "60s",
    }
    cache = model_cache()
    cache["metadata"]["name"] = "minimal-cache"
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(cache))
    stored = kubectl.json("get", "-n", namespace, "modelcache/minimal-cache")
    assert stored["spec"]["storageStrategy"] == "SharedPVC"
    assert stored["spec"]["storageSize"] == "50Gi"


@pytest.mark.parametrize(
    ("manifest", "field_path", "fragment"),
    [pytest.param(make, path, fragment, id=case) for case, make, path, fragment in INVALID],
)
def test_invalid_spec_is_rejected_naming_the_field(
    kubectl: Kubectl,
    crds_installed: None,
    namespace: str,
    manifest: Callable[[], dict[str, Any]],
    field_path: str,
    fragment: str,
) -> None:
    result = kubectl.run(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(manifest())
    )
    assert result.returncode != 0, result.stdout
    assert "is invalid" in result.stderr, result.stderr
    assert field_path in result.stderr, result.stderr
    assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize(
    "value",
    ["720h", "43200m", "2592000s", "2592000000ms", "2592000000000us", "1000000µs",
     "2592000000000000ns", "1h30m", "0.5h", "719h59m59.999s", "0s"],
)
def test_every_unit_up_to_720h_is_accepted(
    kubectl: Kubectl, crds_installed: None, namespace: str, value: str
) -> None:
    """The digit caps that keep Go from overflowing must not refuse a value within 720h."""
    for field in ({"gpu": {"swapCooldown": value}}, {"serverless": {"idleTimeout": value}}):
        manifest = model(**field)
        result = kubectl.run(
            "create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(manifest)
        )
        assert result.returncode == 0, (value, result.stderr)


@pytest.mark.parametrize("value", ["721h", "43201m", "999999999999999999ns" * 3])
def test_beyond_720h_is_refused_in_any_unit(
    kubectl: Kubectl, crds_installed: None, namespace: str, value: str
) -> None:
    result = kubectl.run(
        "create", "--dry-run=server", "-n", namespace, "-f", "-",
        stdin=json.dumps(model(gpu={"swapCooldown": value})),
    )
    assert result.returncode != 0 and "must be at most 720h" in result.stderr, result.stderr


@pytest.mark.parametrize("value", ["24Gi", "1Mi", "1Ti", "22.5Gi", "24G", 24_000_000_000, "5632Mi"])
def test_vram_quantities_within_bounds_are_kept(
    kubectl: Kubectl, crds_installed: None, namespace: str, value: Any
) -> None:
    for manifest in (
        model(gpu={"shared": "g", "vramBudget": value, "vramEstimate": value}),
        gpu_group(vramBudget=value, models=[{"name": "a", "vramEstimate": value}]),
    ):
        result = kubectl.run(
            "create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
            stdin=json.dumps(manifest),
        )
        assert result.returncode == 0, (value, result.stderr)
        spec = json.loads(result.stdout)["spec"]
        kept = spec["gpu"] if "gpu" in spec else {"vramBudget": spec["vramBudget"]}
        assert kept["vramBudget"] == value


MODEL_STATUS: dict[str, Any] = {
    "phase": "Ready",
    "message": "holds the card: highest priority with demand",
    "observedGeneration": 1,
    "lastActiveTime": "2026-11-29T17:00:00Z",
    "endpoint": "http://status-model.ns.svc:8000/v1",
    "sharedGroup": {
        "groupName": "homelab-gpu",
        "state": "Active",
        "queuePosition": 0,
        "preemptedBy": "",
        "preemptedAt": "2026-11-29T16:00:00Z",
    },
    "vram": {"footprint": "5632Mi", "budget": "24Gi", "used": "9728Mi"},
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Elected",
            "message": "leader of homelab-gpu",
            "lastTransitionTime": "2026-11-29T17:00:01Z",
            "observedGeneration": 1,
        }
    ],
}

GROUP_STATUS: dict[str, Any] = {
    "phase": "Draining",
    "message": "draining a for b",
    "observedGeneration": 1,
    "activeModel": "a",
    "pendingModel": "b",
    "drainStartedAt": "2026-11-29T17:00:00Z",
    "lastSwapTime": "2026-11-29T16:00:00Z",
    "lastSwapReason": "QueueThresholdReached",
    "swapCount": 4,
    "vram": {"budget": "24Gi", "used": "4Gi"},
    "modelStatuses": [
        {"name": "a", "state": "Active", "queuedRequests": 0, "footprint": "4Gi"},
        {
            "name": "b",
            "state": "Queued",
            "queuedRequests": 3,
            "queuedSince": "2026-11-29T16:59:40Z",
            "preemptedAt": "2026-11-29T16:00:00Z",
            "preemptedBy": "a",
        },
    ],
    "conditions": [
        {
            "type": "Swapping",
            "status": "True",
            "reason": "Draining",
            "message": "waiting for a's pods to go",
            "lastTransitionTime": "2026-11-29T17:00:00Z",
        }
    ],
}


def test_status_subresource_keeps_every_controller_field(
    kubectl: Kubectl, crds_installed: None, namespace: str
) -> None:
    manifest = model(gpu={"shared": "homelab-gpu"})
    manifest["metadata"]["name"] = "status-model"
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    kubectl.patch_status(namespace, "model/status-model", {"status": MODEL_STATUS})
    stored = kubectl.json("get", "-n", namespace, "model/status-model")
    assert stored["status"] == MODEL_STATUS
    # The status subresource ignores spec changes, and the main resource ignores status.
    assert stored["spec"]["gpu"]["priority"] == 100

    group = gpu_group()
    group["metadata"]["name"] = "status-group"
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(group))
    kubectl.patch_status(namespace, "gpugroup/status-group", {"status": GROUP_STATUS})
    assert kubectl.json("get", "-n", namespace, "gpugroup/status-group")["status"] == GROUP_STATUS


def test_status_is_validated_too(kubectl: Kubectl, crds_installed: None, namespace: str) -> None:
    manifest = model()
    manifest["metadata"]["name"] = "status-checked"
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    bad_phase = kubectl.patch_status(
        namespace, "model/status-checked", {"status": {"phase": "Running"}}, check=False
    )
    assert bad_phase.returncode != 0
    assert "status.phase" in bad_phase.stderr
    condition = copy.deepcopy(MODEL_STATUS["conditions"][0])
    del condition["reason"]
    no_reason = kubectl.patch_status(
        namespace, "model/status-checked", {"status": {"conditions": [condition]}}, check=False
    )
    assert no_reason.returncode != 0
    assert "status.conditions[0].reason" in no_reason.stderr


def test_gpugroup_takes_demand_annotations(
    kubectl: Kubectl, crds_installed: None, namespace: str
) -> None:
    group = gpu_group()
    group["metadata"]["name"] = "demand-group"
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(group))
    demand = {
        "queued": 3,
        "oldestWaiting": "2026-11-29T17:00:04Z",
        "reportedAt": "2026-11-29T17:00:09Z",
    }
    patch = {"metadata": {"annotations": {"demand.ai.flexinfer/b": json.dumps(demand)}}}
    kubectl.ok(
        "patch", "-n", namespace, "gpugroup/demand-group", "--type=merge", "-p", json.dumps(patch)
    )
    clear = {"metadata": {"annotations": {"demand.ai.flexinfer/b": None}}}
    stored = kubectl.json("get", "-n", namespace, "gpugroup/demand-group")
    assert json.loads(stored["metadata"]["annotations"]["demand.ai.flexinfer/b"]) == demand
    kubectl.ok(
        "patch", "-n", namespace, "gpugroup/demand-group", "--type=merge", "-p", json.dumps(clear)
    )
    stored = kubectl.json("get", "-n", namespace, "gpugroup/demand-group")
    assert "demand.ai.flexinfer/b" not in stored["metadata"].get("annotations", {})


@pytest.fixture(scope="module")
def examples_applied(kubectl: Kubectl, namespace: str) -> None:
    kubectl.ok("apply", "-n", namespace, "-f", str(ROOT / "examples"))


@pytest.mark.parametrize("plural", sorted(PRINTER_COLUMNS))
def test_kubectl_get_shows_the_printer_columns(
    kubectl: Kubectl, examples_applied: None, namespace: str, plural: str
) -> None:
    output = kubectl.ok("get", "-n", namespace, plural)
    header, *rows = output.strip().splitlines()
    assert header.split() == PRINTER_COLUMNS[plural]
    assert rows


def test_printer_columns_show_status_and_short_names(
    kubectl: Kubectl, crds_installed: None, namespace: str
) -> None:
    manifest = model(gpu={"shared": "homelab-gpu", "priority": 250})
    manifest["metadata"]["name"] = "columns-model"
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    status = copy.deepcopy(MODEL_STATUS)
    status["sharedGroup"]["state"] = "Queued"
    status["sharedGroup"]["queuePosition"] = 2
    status["phase"] = "Preempted"
    status["conditions"] = [
        {
            "type": "Active",
            "status": "False",
            "reason": "Preempted",
            "message": "preempted; top holds the GPU (queue position 2)",
            "lastTransitionTime": "2026-11-29T17:00:01Z",
        },
        {
            "type": "Ready",
            "status": "False",
            "reason": "GPULeaseHeld",
            "message": "columns-model gave the GPU to a GPU lease",
            "lastTransitionTime": "2026-11-29T17:00:01Z",
        },
    ]
    kubectl.patch_status(namespace, "model/columns-model", {"status": status})
    row = kubectl.ok("get", "-n", namespace, "mdl", "columns-model", "--no-headers").split()
    # REASON is the Ready condition's, not the first condition's.
    assert row[:8] == [
        "columns-model", "mlc-llm", "homelab-gpu", "250", "Preempted", "Queued", "2",
        "GPULeaseHeld",
    ]  # fmt: skip
    lease = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "GPULease",
        "metadata": {"name": "columns-lease"},
        "spec": {
            "group": "homelab-gpu",
            "owner": "trainer",
            "node": "kwok-node-0",
            "expiresAt": "2031-05-06T07:08:09Z",
        },
    }
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(lease))
    row = kubectl.ok("get", "-n", namespace, "gpulease", "columns-lease", "--no-headers").split()
    assert row[:5] == [
        "columns-lease",
        "homelab-gpu",
        "trainer",
        "kwok-node-0",
        "2031-05-06T07:08:09Z",
    ]


def test_kubectl_get_flexinfer_lists_every_kind(
    kubectl: Kubectl, examples_applied: None, namespace: str
) -> None:
    output = kubectl.ok("get", "flexinfer", "-n", namespace, "-o", "name")
    kinds = {line.split("/")[0] for line in output.split()}
    assert kinds == {
        "model.ai.flexinfer",
        "gpulease.ai.flexinfer",
        "gpugroup.ai.flexinfer",
        "modelcache.ai.flexinfer",
        "modeldeployment.ai.flexinfer",
    }
