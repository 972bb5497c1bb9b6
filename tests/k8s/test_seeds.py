"""The product documents' manifests on the local cluster, as a user applies them.

Every YAML block of both documents (tests/fixtures/seeds, byte for byte; the README says
how fragments are merged) is applied in order to `flexinfer-system`, with kwok nodes named
like the documents' nodes and the claim `mlc-models-nfs` holding a compiled model. After
each step the test plays the proxy (a request for every model), waits until what the
step yields has settled (pods Running, Jobs Complete, claims Bound, or a condition that
says why not; at most a minute), prints it, and checks it against what the documents
promise. Run with `-s` to see the listings.
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from flexinfer_devcluster.localcluster import KwokNode, LocalCluster
from flexinfer_kube.kubeapi import KubeApi, NotFound, new_api_client
from flexinfer_kube.resources import (
    DEPLOYMENTS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    Resource,
)
from tests.polling import wait_until

from .harness import controller, crds, kubectl, kwok_nodes, now_text  # noqa: F401  (fixtures)
from .kubectl import Kubectl

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "tests" / "fixtures" / "seeds"
NAMESPACE = "flexinfer-system"
SEED_NODES = ("cblevins-5930k", "cblevins-7900xtx", "gpu-node-1")
VENDOR_LABEL = "flexinfer.ai/gpu.vendor"
COMPILED = "Qwen3-8B-abliterated-q4f32_1-MLC"
CLAIM = "mlc-models-nfs"
MODEL_FILES = {
    "mlc-chat-config.json": b'{"model_type": "qwen3", "quantization": "q4f32_1"}',
    "lib_rocm_gfx1100.so": b"\x7fELF compiled for gfx1100",
    "params_shard_0.bin": bytes(range(256)) * 16,
}
SETTLE_SECONDS = 60
KINDS: dict[str, Resource] = {
    "Model": MODELS,
    "ModelDeployment": MODEL_DEPLOYMENTS,
    "ModelCache": MODEL_CACHES,
}


# --- what a step should yield -----------------------------------------------------------


@attrs.frozen
class Runs:
    """A Model or ModelDeployment with a Running, Ready pod (on `node` when given)."""

    kind: str
    name: str
    node: str = ""
    args: tuple[str, ...] = ()
    """Arguments its server container must carry, in this order (not necessarily adjacent)."""
    claim: str = ""
    """A backend-cache claim it mounts, which must be Bound."""


@attrs.frozen
class Refused:
    """A Model or ModelDeployment the controller refuses: `Rendered=False` with `reason`
    and a message containing `says`."""

    kind: str
    name: str
    reason: str
    says: str


@attrs.frozen
class CacheReady:
    name: str


@attrs.frozen
class CacheRefused:
    """A ModelCache whose `Ready` condition is False with `reason`, saying `says`."""

    name: str
    reason: str
    says: str


@attrs.frozen
class Step:
    title: str
    fixture: str = ""
    patch: tuple[str, str, dict[str, Any]] | None = None
    """Instead of a fixture: (kind, name, merge patch), as a user following prose would."""
    expect: tuple[Any, ...] = ()


def hf(repo: str) -> str:
    return f"HF://{repo}"


STEPS = (
    Step("the compiled model's cache (existing claim)", "002-modelcache.yaml",
         expect=(CacheReady("qwen3-8b-abliterated-mlc"),)),
    Step("a shared-GPU Model from Hugging Face", "000-shared-gpu-model.yaml",
         expect=(Runs("Model", "qwen3-8b", args=("serve", hf("mlc-ai/Qwen3-8B-q4f16_1-MLC")),
                      claim="qwen3-8b-backend-cache"),)),
    Step("its swap cooldown", "000-swap-cooldown.merged.yaml",
         expect=(Runs("Model", "qwen3-8b", claim="qwen3-8b-backend-cache"),)),
    Step("the finetune lease block, which elides its source",
         "000-finetune-gpulease.fragment.yaml",
         expect=(CacheRefused("qwen3-1p7b-lora", "InvalidSpec", "spec.source: '' is required"),)),
    Step("the reference ModelDeployment", "002-modeldeployment.yaml",
         expect=(Runs("ModelDeployment", "qwen3-8b-abliterated", node="cblevins-5930k",
                      args=("serve", f"/models/{COMPILED}", "--model-lib",
                            f"/models/{COMPILED}/lib_rocm_gfx1100.so")),)),
    Step("targeting a specific node", "002-target-node.merged.yaml",
         expect=(Runs("ModelDeployment", "qwen3-8b-abliterated", node="cblevins-5930k"),)),
    Step("targeting any AMD GPU node", "002-any-amd-node.merged.yaml",
         expect=(Runs("ModelDeployment", "qwen3-8b-abliterated"),)),
    Step("pre-compiled, JIT off", "002-precompiled.merged.yaml",
         expect=(Runs("ModelDeployment", "qwen3-8b-abliterated", node="cblevins-5930k"),)),
    Step("split: 8B on cblevins-5930k", "002-split-8b.yaml",
         expect=(Runs("ModelDeployment", "qwen3-8b-abliterated", node="cblevins-5930k",
                      args=("serve", f"/models/{COMPILED}", "--model-lib",
                            "/models/lib_rocm_gfx1100.so")),)),
    Step("the 128k-context settings, which name another model's library",
         "002-128k-context.merged.yaml",
         expect=(Refused("ModelDeployment", "qwen3-8b-abliterated", "InvalidSpec",
                         "spec.mlcllm.modelLibPath"),)),
    Step("split: 32B on cblevins-7900xtx", "002-split-32b.yaml",
         expect=(Runs("ModelDeployment", "qwen3-32b", node="cblevins-7900xtx",
                      args=("serve", hf("mlc-ai/Qwen3-32B-q4f16_1-MLC"), "--mode", "local"),
                      claim="qwen3-32b-backend-cache"),)),
    Step("a RAM-cached model", "002-ram-cache.yaml",
         expect=(CacheReady("qwen3-8b-ram"),
                 Runs("ModelDeployment", "qwen3-8b-chat", node="gpu-node-1"))),
    Step("'Enable spec.cache.strategy: Memory' on the Model, as written",
         patch=("Model", "qwen3-8b", {"spec": {"cache": {"strategy": "Memory"}}}),
         expect=(Refused("Model", "qwen3-8b", "InvalidSpec", "add spec.nodeSelector"),)),
    Step("... with the node the condition asks for",
         patch=("Model", "qwen3-8b",
                {"spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-node-1"}}}),
         expect=(CacheReady("qwen3-8b-cache"),
                 Runs("Model", "qwen3-8b", node="gpu-node-1",
                      args=("serve", "/models/qwen3-8b-cache")))),
)


# --- the cluster the documents assume ----------------------------------------------------


@pytest.fixture(scope="module")
def seed_cluster(local_cluster: LocalCluster, kubectl: Kubectl, crds: None) -> Iterator[KubeApi]:
    # Room for every example at once (the documents' nodes have a card each); an earlier
    # module's node of the same name (test_rendering's gpu-node-1 has one card) is
    # replaced, or the last step's pod stays Pending on a full node.
    nodes = tuple(KwokNode(name=name, gpus=4, labels={VENDOR_LABEL: "AMD"})
                  for name in SEED_NODES)
    with kwok_nodes(local_cluster, nodes):
        if kubectl.run("get", "namespace", NAMESPACE).returncode != 0:
            kubectl.ok("create", "namespace", NAMESPACE)
        api = KubeApi(new_api_client(str(local_cluster.kubeconfig)))
        yield api
        for path in sorted(SEEDS.glob("*.yaml")):
            kubectl.run("delete", "-n", NAMESPACE, "-f", str(path), "--ignore-not-found",
                        "--wait=false")
        kubectl.run("delete", "-n", NAMESPACE, "pvc", CLAIM, "--ignore-not-found",
                    "--wait=false")


def populate_claim(local_cluster: LocalCluster, api: KubeApi, kubectl: Kubectl) -> Path:
    """`mlc-models-nfs` holding the compiled model, as on the documents' NFS share; the
    model directory on the volume is returned."""
    files = {f"{COMPILED}/{name}": content for name, content in MODEL_FILES.items()}
    populate = getattr(local_cluster, "populate_claim", None)
    if populate is not None:  # the local cluster's own way to pre-populate a claim
        return Path(populate(NAMESPACE, CLAIM, files=files, size="20Gi")) / COMPILED
    # Without it: a claim bound to one of the static volumes, written on the host.
    kubectl.ok("apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "resources": {"requests": {"storage": "20Gi"}}},
    }))
    claim = wait_until(
        lambda: (c := get(api, PERSISTENT_VOLUME_CLAIMS, CLAIM)) and
        c.get("status", {}).get("phase") == "Bound" and c,
        what=f"claim {CLAIM} Bound", timeout=60,
    )
    volume = kubectl.json("get", "pv", claim["spec"]["volumeName"])
    root = Path(volume["spec"]["hostPath"]["path"])
    for relative, content in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    return root / COMPILED


# --- reading what a step yields ----------------------------------------------------------


def get(api: KubeApi, resource: Resource, name: str) -> dict[str, Any] | None:
    try:
        return api.get(resource, NAMESPACE, name)
    except NotFound:
        return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


def running_pod(api: KubeApi, kind: str, name: str) -> dict[str, Any] | None:
    pods = api.list(PODS, NAMESPACE, label_selector=f"ai.flexinfer/model={name},"
                                                    f"ai.flexinfer/kind={kind}")
    for pod in pods.get("items") or []:
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in pod.get("status", {}).get("conditions") or [])
        if pod["status"].get("phase") == "Running" and ready and not pod["metadata"].get(
                "deletionTimestamp"):
            return dict(pod)
    return None


def in_order(args: list[str], wanted: tuple[str, ...]) -> bool:
    position = 0
    for arg in args:
        if position < len(wanted) and arg == wanted[position]:
            position += 1
    return position == len(wanted)


def unmet(api: KubeApi, expectation: Any) -> str:
    """Why `expectation` does not hold yet ("" once it does)."""
    if isinstance(expectation, CacheReady):
        cache = get(api, MODEL_CACHES, expectation.name)
        ready = (cache or {}).get("status", {}).get("ready")
        return "" if ready else f"ModelCache {expectation.name} not Ready"
    if isinstance(expectation, CacheRefused):
        ready = condition(get(api, MODEL_CACHES, expectation.name), "Ready")
        if ready.get("status") == "False" and ready.get("reason") == expectation.reason and \
                expectation.says in ready.get("message", ""):
            return ""
        return f"ModelCache {expectation.name} Ready={ready}"
    resource = KINDS[expectation.kind]
    obj = get(api, resource, expectation.name)
    rendered = condition(obj, "Rendered")
    if isinstance(expectation, Refused):
        if rendered.get("status") == "False" and rendered.get("reason") == expectation.reason \
                and expectation.says in rendered.get("message", ""):
            return ""
        return f"{expectation.name} Rendered={rendered}"
    if rendered.get("status") != "True":
        return f"{expectation.name} Rendered={rendered}"
    if rendered.get("observedGeneration") != (obj or {})["metadata"].get("generation"):
        return f"{expectation.name} not rendered from its current spec yet"
    pod = running_pod(api, expectation.kind, expectation.name)
    if pod is None:
        return f"{expectation.name} has no Running pod"
    # The pod runs the current render, not the one before the step.
    template = (get(api, DEPLOYMENTS, expectation.name) or {})["spec"]["template"]["spec"]
    if pod["spec"]["containers"][0].get("args") != template["containers"][0].get("args") or \
            pod["spec"].get("nodeSelector") != template.get("nodeSelector"):
        return f"{expectation.name} still runs its earlier pod"
    if expectation.node and pod["spec"].get("nodeName") != expectation.node:
        return f"{expectation.name} runs on {pod['spec'].get('nodeName')}"
    server = pod["spec"]["containers"][0]
    if not in_order(server.get("args") or [], expectation.args):
        return f"{expectation.name} args {server.get('args')}"
    if expectation.claim:
        claim = get(api, PERSISTENT_VOLUME_CLAIMS, expectation.claim)
        if (claim or {}).get("status", {}).get("phase") != "Bound":
            return f"claim {expectation.claim} not Bound"
        mounted = {v.get("persistentVolumeClaim", {}).get("claimName")
                   for v in pod["spec"].get("volumes") or []}
        if expectation.claim not in mounted:
            return f"{expectation.name} does not mount {expectation.claim}"
    return ""


def demand(api: KubeApi, documents: list[dict[str, Any]]) -> None:
    """What the proxy does for a request on each model of the step."""
    for doc in documents:
        name = doc["metadata"]["name"]
        if doc["kind"] == "Model":
            api.patch(MODELS, NAMESPACE, name, {"status": {"lastActiveTime": now_text()}},
                      subresource="status")
        elif doc["kind"] == "ModelDeployment":
            api.patch(MODEL_DEPLOYMENTS, NAMESPACE, name,
                      {"status": {"lastAccessTime": now_text()}}, subresource="status")


def summary(api: KubeApi, kubectl: Kubectl) -> str:
    """The objects flexinfer and the documents made, their phases and conditions."""
    lines = [kubectl.ok("get", "deployments,pods,pvc,jobs", "-n", NAMESPACE, "-o", "wide")]
    for kind, resource in KINDS.items():
        for obj in api.list(resource, NAMESPACE).get("items") or []:
            status = obj.get("status") or {}
            phase = status.get("phase") or ("Ready" if status.get("ready") else "")
            lines.append(f"{kind} {obj['metadata']['name']}: {phase}")
            for item in status.get("conditions") or []:
                lines.append(f"  {item['type']}={item['status']} {item.get('reason')}: "
                             f"{str(item.get('message'))[:240]}")
    return "\n".join(lines)


@contextlib.contextmanager
def step_timer(title: str) -> Iterator[Callable[[], float]]:
    began = time.monotonic()
    yield lambda: time.monotonic() - began
    print(f"# step took {time.monotonic() - began:.0f}s: {title}")


# --- the test ---------------------------------------------------------------------------


def test_every_seed_manifest_applies_and_yields_what_the_documents_promise(
    local_cluster: LocalCluster, kubectl: Kubectl, seed_cluster: KubeApi
) -> None:
    api = seed_cluster
    directory = populate_claim(local_cluster, api, kubectl)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    failures: list[str] = []
    with controller(local_cluster, NAMESPACE):
        for step in STEPS:
            with step_timer(step.title):
                documents: list[dict[str, Any]] = []
                if step.fixture:
                    path = SEEDS / step.fixture
                    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
                    result = kubectl.run("apply", "-n", NAMESPACE, "-f", str(path))
                    assert result.returncode == 0, result.stderr
                else:
                    assert step.patch is not None
                    kind, name, body = step.patch
                    api.patch(KINDS[kind], NAMESPACE, name, body)
                    documents = [{"kind": kind, "metadata": {"name": name}}]
                deadline = time.monotonic() + SETTLE_SECONDS
                missing = [unmet(api, e) for e in step.expect]
                while any(missing) and time.monotonic() < deadline:
                    demand(api, documents)
                    time.sleep(2)
                    missing = [unmet(api, e) for e in step.expect]
                print(f"\n## {step.fixture or step.patch}: {step.title}\n{summary(api, kubectl)}")
                failures += [f"{step.title}: {m}" for m in missing if m]
    # The user's compiled model is where it was, byte for byte.
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    assert not failures, "\n".join(failures)
