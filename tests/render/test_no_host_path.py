"""No tenant pod mounts a host path: every pod rendered for the examples' and the
seeds' manifests, and for each way a node directory is asked for (NodeLocal and Memory
caches, `file://` sources and datasets), mounts claims only; the one pod with a host
path is the directory Job, in the controller's namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer_devcluster.policy import dev_policy
from flexinfer_k8s.render.cache import CacheImages, cache_from_k8s, cleanup_job, download_job
from flexinfer_k8s.render.finetune import finetune_job
from flexinfer_k8s.render.local_volume import directory_job
from flexinfer_k8s.render.model_files import (
    cache_serves_plain_model,
    implied_cache_manifest,
    implies_cache,
)
from flexinfer_k8s.render.workload import workload_from_model, workload_from_model_deployment
from flexinfer_k8s.render.workloads import RenderSettings, render_workload

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "team-a"
SETTINGS = RenderSettings(policy=dev_policy())
NODE = {"kubernetes.io/hostname": "gpu-node-1"}


def documents(path: Path) -> list[dict[str, Any]]:
    docs = yaml.safe_load_all(path.read_text())
    return [d for d in docs if isinstance(d, dict) and d.get("kind")]


def manifests() -> list[list[dict[str, Any]]]:
    """Each example's documents; the seeds' all together, as test_seeds applies them into
    one namespace in order (a later document of the same name replaces an earlier; a
    fragment is not a manifest)."""
    examples = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if "scenarios" not in p.parts)
    seeds: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted((ROOT / "tests" / "fixtures" / "seeds").glob("*.yaml")):
        if not path.name.endswith(".fragment.yaml"):
            seeds.update({(d["kind"], d["metadata"]["name"]): d for d in documents(path)})
    return [*(documents(path) for path in examples), list(seeds.values())]


def synthetic() -> list[dict[str, Any]]:
    """Every way a tenant asks for a node directory, whether or not a manifest does."""
    def cache(name: str, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
                "metadata": {"name": name}, "spec": spec}

    def model(name: str, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
                "metadata": {"name": name}, "spec": {"backend": "llama-cpp", **spec}}

    own = f"/var/lib/flexinfer/models/{NAMESPACE}"
    return [
        cache("node", source="HF://o/r/m.gguf", storageStrategy="NodeLocal", nodeSelector=NODE),
        cache("ram", source="HF://o/r/m.gguf", storageStrategy="Memory", nodeSelector=NODE),
        cache("ram-claim", source="HF://o/r/m.gguf", storageStrategy="Memory",
              existingClaimName="models", nodeSelector=NODE),
        cache("from-file", source=f"file://{own}/hand/m.gguf", storageStrategy="NodeLocal",
              nodeSelector=NODE),
        cache("tuned", source="HF://o/r", storageStrategy="NodeLocal", nodeSelector=NODE,
              finetune={"image": "trainer.local/t:1",
                        "dataset": "file:///srv/datasets/tickets.jsonl"}),
        model("file-model", source=f"file://{own}/hand/m.gguf", nodeSelector=NODE),
        model("file-anywhere", source="file:///srv/datasets/m.gguf"),
        model("implied-node", source="HF://o/r/m.gguf", nodeSelector=NODE,
              cache={"strategy": "NodeLocal"}),
        model("implied-ram", source="HF://o/r/m.gguf", nodeSelector=NODE,
              cache={"strategy": "Memory"}),
        model("on-node", source="HF://o/r/m.gguf", cache={"modelCacheRef": "node"},
              nodeSelector=NODE),
        model("in-ram", source="HF://o/r/m.gguf", cache={"modelCacheRef": "ram"},
              nodeSelector=NODE),
    ]


def rendered_pods(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what, pod spec) of every pod the controller renders for `docs` in NAMESPACE."""
    for doc in docs:
        doc.setdefault("metadata", {})["namespace"] = NAMESPACE
        doc["metadata"].setdefault("uid", "uid")
    caches = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ModelCache"}
    for doc in docs:
        name = f"{doc['kind']} {doc['metadata']['name']}"
        if doc["kind"] in ("Model", "ModelDeployment"):
            workload = (workload_from_model(doc) if doc["kind"] == "Model"
                        else workload_from_model_deployment(doc))
            cache_obj = caches.get(workload.cache_ref) or next(
                (c for c in caches.values()
                 if doc["kind"] == "ModelDeployment" and cache_serves_plain_model(
                     c, workload.model)), None)
            if implies_cache(workload):
                cache_obj = implied_cache_manifest(workload, owner={}, labels={})
                cache_obj["metadata"]["uid"] = "uid"
                yield from cache_pods(cache_obj)
            spec = cache_from_k8s(cache_obj) if cache_obj is not None else None
            rendered = render_workload(workload, cache=spec, settings=SETTINGS)
            yield name, rendered.deployment["spec"]["template"]["spec"]
        elif doc["kind"] == "ModelCache":
            yield from cache_pods(doc)


def cache_pods(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    name = f"ModelCache {doc['metadata']['name']}"
    spec = cache_from_k8s(doc)
    images = CacheImages()
    yield f"{name} download", download_job(spec, images, policy=SETTINGS.policy)["spec"][
        "template"]["spec"]
    cleanup = cleanup_job(spec, images, deadline_seconds=60, policy=SETTINGS.policy)
    if cleanup is not None:
        yield f"{name} cleanup", cleanup["spec"]["template"]["spec"]
    if (doc.get("spec") or {}).get("finetune"):
        job = finetune_job(spec, doc, default_image="", policy=SETTINGS.policy)
        yield f"{name} finetune", job["spec"]["template"]["spec"]


def host_paths(pod: dict[str, Any]) -> list[str]:
    return [v["hostPath"]["path"] for v in pod.get("volumes") or [] if "hostPath" in v]


@pytest.mark.parametrize("source", ["manifests", "synthetic"])
def test_no_pod_rendered_into_a_tenants_namespace_mounts_a_host_path(source: str) -> None:
    files = manifests() if source == "manifests" else [synthetic()]
    pods = [pod for docs in files for pod in rendered_pods(docs)]
    assert len(pods) >= 8, [what for what, _ in pods]
    offending = {what: host_paths(pod) for what, pod in pods if host_paths(pod)}
    assert offending == {}
    if source == "synthetic":
        # Each node directory is there, through a claim: the proof it was asked for.
        claims = {v["persistentVolumeClaim"]["claimName"] for _, pod in pods
                  for v in pod.get("volumes") or [] if "persistentVolumeClaim" in v}
        assert {c.split("-")[1] for c in claims if c.startswith("flexinfer-")} == {
            "models", "memory", "host"}


def test_only_the_directory_job_mounts_a_host_path_in_the_controllers_namespace() -> None:
    docs = synthetic()
    specs = [cache_from_k8s({**d, "metadata": {**d["metadata"], "namespace": NAMESPACE}})
             for d in docs if d["kind"] == "ModelCache"]
    volumes = {v for s in specs for v in s.host_volumes(SETTINGS.policy)}
    jobs = [directory_job(v, controller_namespace="flexinfer-system", policy=SETTINGS.policy)
            for v in volumes]
    made = [j for j in jobs if j is not None]
    # The namespace's node root and RAM root are made; an admin's prefix is not.
    assert {tuple(host_paths(j["spec"]["template"]["spec"])) for j in made} == {
        ("/var/lib/flexinfer/models",), ("/dev/shm/flexinfer",)}
    assert {j["metadata"]["namespace"] for j in made} == {"flexinfer-system"}
