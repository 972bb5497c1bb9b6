"""The second real server: an Ollama Model runs as a real `ollama serve` on the process
node and answers through the proxy.

The user's Ollama store (created with `ollama create tiny` from a Modelfile
`FROM tiny.gguf`, our tiny random-weight GGUF) is already on a claim; a SharedPVC
ModelCache names that claim and an Ollama Model serves from it. The process node runs
the rendered container: `ollama serve` with `OLLAMA_HOST` moved to the pod's loopback
address and `OLLAMA_MODELS` mapped onto the claim's directory. The proxy routes a chat
completion for the Model's name to it (rewriting the model to Ollama's tag).
"""

# The fixtures come from tests.e2e.test_real_tokens; parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_devcluster.processes import terminate_group
from flexinfer_devcluster.processnode import (
    PROCESS_NODE_SELECTOR,
    PROCESS_NODE_TOLERATION,
    reserve_address,
)
from flexinfer_kube.resources import MODEL_CACHES, MODELS
from tests.e2e.test_real_tokens import (  # noqa: F401  (fixtures)
    POLICY,
    async_test,
    cluster,
    complete,
    proxy,
)
from tests.k8s.harness import Cluster, controller
from tests.polling import wait_until

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def process_node(local_cluster: LocalCluster, llama_server: Path, ollama: Path) -> Iterator[None]:
    local_cluster.add_process_node(ollama=ollama)
    yield
    local_cluster.remove_process_node()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def create_store(ollama: Path, gguf: Path, store: Path, home: Path) -> None:
    """What a user did once: `ollama create tiny` from a Modelfile naming the GGUF, into
    the store `store` (a temporary `ollama serve` on a loopback address of its own)."""
    modelfile = home / "Modelfile"
    modelfile.write_text(f"FROM {gguf}\n")
    reservation = reserve_address(11434)
    host = f"{reservation.address}:11434"
    env = {**os.environ, "HOME": str(home), "OLLAMA_HOST": host, "OLLAMA_MODELS": str(store)}
    server = subprocess.Popen(
        [str(ollama), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(lambda: answers(f"http://{host}/"), what="the temporary ollama serve")
        subprocess.run([str(ollama), "create", "tiny", "-f", str(modelfile)], env=env,
                       check=True, capture_output=True, timeout=120)
    finally:
        terminate_group(server)
        reservation.release()


@async_test
async def test_an_ollama_model_on_a_users_store_answers_through_the_proxy(
    local_cluster: LocalCluster,
    cluster: Cluster,
    proxy: str,
    ollama: Path,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    c = cluster
    (tmp_path / "claim").mkdir()
    (tmp_path / "home").mkdir()
    create_store(ollama, tiny_model, tmp_path / "claim" / "ollama", tmp_path / "home")
    directory = local_cluster.populate_claim(c.namespace, "ollama-models",
                                             directory=tmp_path / "claim")
    manifest = directory / "ollama/manifests/registry.ollama.ai/library/tiny/latest"
    before = manifest.read_bytes()
    c.api.create(MODEL_CACHES, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "ollama-store"},
        "spec": {"source": "ollama://tiny", "storageStrategy": "SharedPVC",
                 "existingClaimName": "ollama-models", "modelPath": "ollama"},
    })
    c.api.create(MODELS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
        "metadata": {"name": "tiny-ollama"},
        "spec": {
            "backend": "ollama", "source": "ollama://tiny",
            "cache": {"modelCacheRef": "ollama-store"},
            "gpu": {"shared": "ollama", "swapCooldown": "0s"},
            "serverless": {"idleTimeout": "5m", "coldStartTimeout": "60s"},
            "nodeSelector": dict(PROCESS_NODE_SELECTOR),
            "tolerations": [dict(PROCESS_NODE_TOLERATION)],
        },
    })
    # Once the proxy has listed the models (before, it asks to retry: proxy_starting).
    await asyncio.to_thread(wait_until, lambda: answers(f"{proxy}/readyz"),
                            what="the proxy ready")
    with controller(local_cluster, c.namespace, policy=POLICY):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=200)) as session:
            status, text, _ = await complete(session, proxy, "tiny-ollama", stream=False)
            assert status == 200, text
            assert text.strip(), "no tokens came back"
            status, streamed, _ = await complete(session, proxy, "tiny-ollama", stream=True)
            assert status == 200, streamed
            assert streamed.strip()
        [pod] = c.ready_pods("tiny-ollama")
        assert pod["spec"]["nodeName"] == local_cluster.process_node.name
        pid = local_cluster.process_node.pids()[f"{c.namespace}/{pod['metadata']['name']}"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        assert argv == [str(ollama), "serve"]
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
            if "=" in item
        )
        # On all addresses as in a real pod, relayed from the pod's address and port.
        assert environ["OLLAMA_HOST"].startswith("0.0.0.0:")
        assert environ["OLLAMA_MODELS"] == str(directory / "ollama")
    assert manifest.read_bytes() == before  # served from the user's store, not rewritten
