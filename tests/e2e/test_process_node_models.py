"""Models as a homelab cluster runs them, on the process node, through the controller.

A Memory cache over a claim the user already filled: the rendered flash loader (an init
container) runs for real as its own shell script, copies the GGUF from the claim into
the node's RAM directory, and the real llama-server serves it; the claim's bytes are
untouched. A server that rejects a flag crash-loops for real and the Model reads Failed
with the server's own last words, not Loading until the cold-start timeout; fixed, it
serves again.
"""

# The fixtures come from tests.e2e.test_real_tokens; parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_devcluster.processnode import PROCESS_NODE_SELECTOR, PROCESS_NODE_TOLERATION
from flexinfer_k8s.render.cache_dir import COMPLETE_MARKER
from flexinfer_kube.resources import MODEL_CACHES, MODELS
from tests.devcluster.chat import chat
from tests.e2e.test_real_tokens import cluster  # noqa: F401  (fixture)
from tests.k8s.harness import Cluster, controller
from tests.polling import wait_until

pytestmark = pytest.mark.k8s
TIMEOUT = 180.0  # real servers on 2 shared cores: a generous bound, not a timing


@pytest.fixture(scope="module")
def process_node(local_cluster: LocalCluster, llama_server: Path) -> Iterator[None]:
    local_cluster.add_process_node()
    yield
    local_cluster.remove_process_node()


def model_body(name: str, model_file: Path, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "backend": "llama-cpp",
        "source": f"file://{model_file}",
        "serverless": {"minReplicas": 1, "coldStartTimeout": "60s"},
        "llamacpp": {"ctxSize": 256},
        "nodeSelector": dict(PROCESS_NODE_SELECTOR),
        "tolerations": [dict(PROCESS_NODE_TOLERATION)],
    }
    body.update(spec)
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
            "metadata": {"name": name}, "spec": body}


def ready_condition(c: Cluster, name: str) -> dict[str, Any]:
    conditions = c.status(name).get("conditions") or []
    return next((dict(x) for x in conditions if x.get("type") == "Ready"), {})


def test_a_memory_cache_on_a_users_claim_is_flash_loaded_and_served(
    local_cluster: LocalCluster, cluster: Cluster, tiny_model: Path
) -> None:
    c = cluster
    weights = tiny_model.read_bytes()
    claim = local_cluster.populate_claim(
        c.namespace,
        "models-nfs",
        files={"tiny/tiny.gguf": weights, f"tiny/{COMPLETE_MARKER}": ""},
    )
    c.api.create(MODEL_CACHES, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "ram"},
        "spec": {"source": f"file://{tiny_model}", "storageStrategy": "Memory",
                 "existingClaimName": "models-nfs", "modelPath": "tiny"},
    })
    c.api.create(MODELS, c.namespace,
                 model_body("cached", tiny_model, cache={"modelCacheRef": "ram"}))
    with controller(local_cluster, c.namespace):
        wait_until(lambda: c.status("cached").get("phase") == "Ready",
                   what="the cache-backed Model to be Ready", timeout=TIMEOUT)
        [pod] = c.ready_pods("cached")
        assert pod["spec"]["nodeName"] == local_cluster.process_node.name
        assert [i["name"] for i in pod["spec"]["initContainers"]] == ["flash-loader"]
        [loader] = pod["status"]["initContainerStatuses"]
        assert loader["state"]["terminated"]["exitCode"] == 0
        answer = chat(f"http://{pod['status']['podIP']}:8000", "cached", stream=False,
                      max_tokens=8)
        assert answer["content"].strip()
    # The loader's copy is in the node's RAM directory, marker last; the user's claim is
    # as it was, byte for byte.
    ram = local_cluster.process_node.host_path(f"/dev/shm/flexinfer/{c.namespace}/ram")
    assert (ram / "tiny.gguf").read_bytes() == weights
    assert (ram / COMPLETE_MARKER).is_file()
    assert sorted(p.name for p in (claim / "tiny").iterdir()) == [COMPLETE_MARKER, "tiny.gguf"]
    assert (claim / "tiny" / "tiny.gguf").read_bytes() == weights


def test_a_server_that_rejects_a_flag_is_failed_saying_why_until_it_is_fixed(
    local_cluster: LocalCluster, cluster: Cluster, tiny_model: Path
) -> None:
    c = cluster
    c.api.create(MODELS, c.namespace,
                 model_body("rejected", tiny_model, extraArgs=["--no-such-flag"]))
    with controller(local_cluster, c.namespace):
        wait_until(lambda: c.status("rejected").get("phase") == "Failed",
                   what="the crash-looping Model to be Failed", timeout=TIMEOUT)
        ready = ready_condition(c, "rejected")
        assert (ready["status"], ready["reason"]) == ("False", "CrashLoopBackOff")
        assert "invalid argument: --no-such-flag" in ready["message"]
        assert "container server keeps restarting" in ready["message"]
        assert "invalid argument: --no-such-flag" in c.status("rejected")["message"]
        # Fixed, it serves: Failed is read from the pods, never kept.
        c.api.patch(MODELS, c.namespace, "rejected", {"spec": {"extraArgs": []}})
        wait_until(lambda: c.status("rejected").get("phase") == "Ready",
                   what="the fixed Model to be Ready", timeout=TIMEOUT)
        assert ready_condition(c, "rejected")["status"] == "True"
