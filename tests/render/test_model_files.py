"""Where a serving pod finds its model: the `/models` layout, a ModelDeployment's plain
model, a Model's implied ModelCache, and the smaller rendering rules of the same issue
(GGUF under vLLM and Ollama, valueFrom env, tensor parallelism, a GPUGroup's nodes).

Expected values come from the seeds' manifests and the backends' documented flags,
never from the renderer.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.model_files import (
    LAYOUT_SCRIPT,
    cache_serves_plain_model,
    implied_cache_manifest,
)
from flexinfer_k8s.render.source import parse_source
from flexinfer_k8s.render.workload import workload_from_model, workload_from_model_deployment
from tests.render.host_dirs import host_dir
from tests.render.test_backends import cache, env, md, model, pod, render, server

SEED_MODEL = "Qwen3-8B-abliterated-q4f32_1-MLC"


def seed_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """Seed 002's ModelDeployment and ModelCache, as the document writes them."""
    deployment = md(
        "qwen3-8b-abliterated", backend="mlc-llm", model=SEED_MODEL,
        mlcllm={"mode": "server",
                "modelLibPath": f"/models/{SEED_MODEL}/lib_rocm_gfx1100.so",
                "jitPolicy": "OFF"},
    )
    holding = cache("qwen3-8b-abliterated-mlc", storageStrategy="SharedPVC",
                    existingClaimName="mlc-models-nfs", modelPath=SEED_MODEL,
                    source="huggingface://huihui-ai/Qwen3-8B-abliterated", storageSize="20Gi")
    return deployment, holding


def test_seed_002s_pair_serves_the_compiled_model_on_the_claim() -> None:
    deployment, holding = seed_pair()
    assert cache_serves_plain_model(holding, SEED_MODEL)
    rendered = render(deployment, holding)
    c = server(rendered)
    assert c["args"][:2] == ["serve", f"/models/{SEED_MODEL}"]
    assert c["args"][c["args"].index("--model-lib") + 1] == (
        f"/models/{SEED_MODEL}/lib_rocm_gfx1100.so")
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    # The user's directory, read-only, at /models/<modelPath>; /models itself is ours.
    assert mounts["model-cache"] == {"name": "model-cache", "mountPath": f"/models/{SEED_MODEL}",
                                     "readOnly": True, "subPath": SEED_MODEL}
    assert mounts["models-root"]["mountPath"] == "/models"
    volumes = {v["name"]: v for v in pod(rendered)["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {
        "claimName": "mlc-models-nfs", "readOnly": True}
    assert volumes["models-root"] == {"name": "models-root", "emptyDir": {}}
    # A compiled library and a local model: nothing to download or compile.
    assert rendered.backend_cache_claim is None


def test_the_layout_links_the_model_directory_so_both_library_paths_name_one_file(
    tmp_path: Path,
) -> None:
    """Run the layout script itself on a directory shaped like the seed's claim."""
    root = tmp_path / "models"
    model_dir = root / SEED_MODEL
    model_dir.mkdir(parents=True)
    (model_dir / "lib_rocm_gfx1100.so").write_bytes(b"\x7fELF compiled")
    (model_dir / "mlc-chat-config.json").write_text("{}")
    (model_dir / SEED_MODEL).write_text("an entry named like its directory")
    before = sorted((p.name, p.read_bytes()) for p in model_dir.iterdir())
    script = LAYOUT_SCRIPT.replace("cd /models", f"cd {root}")
    subprocess.run(["sh", "-c", script, "models-layout", SEED_MODEL], check=True)
    assert (root / "lib_rocm_gfx1100.so").read_bytes() == b"\x7fELF compiled"
    assert (root / "lib_rocm_gfx1100.so").resolve() == (model_dir / "lib_rocm_gfx1100.so")
    assert (root / "mlc-chat-config.json").is_symlink()
    # The directory itself is not replaced by its entry of the same name, and the
    # model directory is untouched.
    assert (root / SEED_MODEL).is_dir() and not (root / SEED_MODEL).is_symlink()
    assert sorted((p.name, p.read_bytes()) for p in model_dir.iterdir()) == before
    # Idempotent: a restarted init container finds its links and succeeds.
    subprocess.run(["sh", "-c", script, "models-layout", SEED_MODEL], check=True)


def test_the_layout_init_container_writes_only_to_the_pods_own_models_directory() -> None:
    deployment, holding = seed_pair()
    p = pod(render(deployment, holding))
    (layout,) = p["initContainers"]
    assert layout["name"] == "models-layout"
    assert layout["command"][-1] == SEED_MODEL
    mounts = {m["name"]: m for m in layout["volumeMounts"]}
    assert mounts["model-cache"]["readOnly"] is True
    assert mounts["model-cache"]["mountPath"] == f"/models/{SEED_MODEL}"
    assert mounts["models-root"] == {"name": "models-root", "mountPath": "/models"}


def test_the_split_example_finds_its_library_at_the_root_of_models() -> None:
    deployment = md("qwen3-8b-abliterated", backend="mlc-llm", model=SEED_MODEL,
                    nodeSelector={"kubernetes.io/hostname": "cblevins-5930k"},
                    mlcllm={"mode": "server", "modelLibPath": "/models/lib_rocm_gfx1100.so"})
    _, holding = seed_pair()
    c = server(render(deployment, holding))
    assert c["args"][c["args"].index("--model-lib") + 1] == "/models/lib_rocm_gfx1100.so"


def test_a_library_under_models_outside_the_model_directory_is_refused() -> None:
    # Seed 002's 128k-context block names another model's directory.
    deployment, holding = seed_pair()
    deployment["spec"]["mlcllm"]["modelLibPath"] = (
        "/models/Qwen2.5-7B-abliterated-v2-q4f32_1-MLC/lib_rocm_gfx1100.so")
    with pytest.raises(InvalidFieldError, match=r"spec.mlcllm.modelLibPath: '/models/Qwen2.5-7B"
                                                r".*outside the model's directory /models/Qwen3"):
        render(deployment, holding)


def test_a_gguf_file_is_mounted_by_itself_without_a_layout() -> None:
    rendered = render(model(backend="llama-cpp", source="pvc://models/gguf/coder-q4.gguf"))
    p = pod(rendered)
    assert "initContainers" not in p
    mounts = {m["name"]: m for m in server(rendered)["volumeMounts"]}
    assert mounts["model-source"] == {"name": "model-source", "mountPath": "/models/coder-q4.gguf",
                                      "readOnly": True, "subPath": "gguf/coder-q4.gguf"}
    assert server(rendered)["args"][:2] == ["-m", "/models/coder-q4.gguf"]


def test_a_directory_source_is_checked_to_be_a_directory() -> None:
    rendered = render(md(backend="mlc-llm", model="file:///srv/models/qwen-mlc",
                         mlcllm={"modelLibPath": "/models/lib.so"}))
    volumes = {v["name"]: v for v in pod(rendered)["volumes"]}
    mount = next(m for m in server(rendered)["volumeMounts"] if m["name"] == "model-source")
    assert host_dir(volumes["model-source"], mount, rendered.host_volumes) == (
        "/srv/models/qwen-mlc")


# --- a ModelDeployment's plain model, without a matching ModelCache -------------------------


@pytest.mark.parametrize(
    ("backend", "name", "first_args"),
    [
        ("mlc-llm", "Qwen3-32B-q4f16_1-MLC", ["serve", "HF://mlc-ai/Qwen3-32B-q4f16_1-MLC"]),
        ("mlc-llm", "someone/Model-MLC", ["serve", "HF://someone/Model-MLC"]),
        ("vllm", "Qwen/Qwen3-4B", ["--model", "Qwen/Qwen3-4B"]),
        ("llama-cpp", "Qwen/Coder-GGUF:Q8_0", ["--hf-repo", "Qwen/Coder-GGUF:Q8_0"]),
        ("ollama", "llama3.2:1b", ["serve"]),
    ],
)
def test_a_plain_model_follows_the_backends_own_download_convention(
    backend: str, name: str, first_args: list[str]
) -> None:
    c = server(render(md(backend=backend, model=name)))
    assert c["args"][: len(first_args)] == first_args


def test_a_vllm_path_inside_its_image_is_passed_as_it_is_and_fetches_nothing() -> None:
    rendered = render(md(backend="vllm", model="/opt/models/qwen"))
    assert server(rendered)["args"][:2] == ["--model", "/opt/models/qwen"]
    assert rendered.backend_cache_claim is None


@pytest.mark.parametrize(("backend", "name"), [("mlc-llm", "qwen3-8b"), ("vllm", "Qwen3-4B")])
def test_a_plain_model_nobody_can_fetch_names_the_field_to_add(backend: str, name: str) -> None:
    with pytest.raises(InvalidFieldError, match=rf"spec.model: '{name}' names no ModelCache in "
                                                r"namespace ns.*add spec.modelCacheRef"):
        render(md(backend=backend, model=name))


def test_a_cache_matches_a_plain_model_by_its_model_path_or_its_name() -> None:
    assert cache_serves_plain_model(cache("c", modelPath="/a/b/"), "a/b")
    assert cache_serves_plain_model(cache("a-b"), "a-b")
    assert not cache_serves_plain_model(cache("a-b", modelPath="x"), "a-b")


# --- a Model's spec.cache.strategy without modelCacheRef ------------------------------


def implied(**spec: Any) -> dict[str, Any]:
    workload = workload_from_model(model("qwen3-8b", backend="mlc-llm",
                                         source="HF://mlc-ai/Qwen3-8B-q4f16_1-MLC", **spec))
    return implied_cache_manifest(workload, owner={"kind": "Model", "uid": "uid-1"}, labels={})


def test_a_strategy_without_a_reference_implies_a_model_cache_owned_by_the_model() -> None:
    manifest = implied(cache={"strategy": "Memory"},
                       nodeSelector={"kubernetes.io/hostname": "gpu-node-1"})
    assert manifest["kind"] == "ModelCache"
    assert manifest["metadata"]["name"] == "qwen3-8b-cache"
    assert manifest["metadata"]["ownerReferences"] == [{"kind": "Model", "uid": "uid-1"}]
    assert manifest["spec"] == {"source": "HF://mlc-ai/Qwen3-8B-q4f16_1-MLC",
                                "storageStrategy": "Memory",
                                "nodeSelector": {"kubernetes.io/hostname": "gpu-node-1"}}
    shared = implied(cache={"strategy": "SharedPVC"})
    assert shared["spec"] == {"source": "HF://mlc-ai/Qwen3-8B-q4f16_1-MLC",
                              "storageStrategy": "SharedPVC"}


def test_a_ram_copy_without_a_node_names_the_field_to_add_and_why() -> None:
    # Seed 000: "Enable spec.cache.strategy: Memory" on its Model, which names no node.
    with pytest.raises(InvalidFieldError) as error:
        implied(cache={"strategy": "Memory"})
    assert str(error.value).startswith("spec.nodeSelector: {} names no node")
    assert "add spec.nodeSelector: {kubernetes.io/hostname: <node>}" in str(error.value)
    assert "/dev/shm" in str(error.value)


# --- the smaller ones ---------------------------------------------------------------------


def test_vllm_refuses_a_hugging_face_gguf_file_naming_the_field() -> None:
    for source in ("HF://Qwen/Coder-GGUF/coder-q4_k_m.gguf", "HF://Qwen/Coder-GGUF:Q4_K_M"):
        with pytest.raises(InvalidFieldError, match=rf"spec.source: '{source}' names a GGUF file.*"
                                                    r"ModelCache.*--tokenizer"):
            render(model(backend="vllm", source=source))
    # From a cache, vLLM gets the local file.
    c = server(render(model(backend="vllm", source="HF://Qwen/Coder-GGUF/coder-q4_k_m.gguf",
                            cache={"modelCacheRef": "g"}),
                      cache("g", source="HF://Qwen/Coder-GGUF/coder-q4_k_m.gguf")))
    assert c["args"][:2] == ["--model", "/models/g/coder-q4_k_m.gguf"]


@pytest.mark.parametrize(
    ("source", "tag"),
    [
        ("HF://bartowski/Qwen-GGUF/Qwen-Q8_0.gguf", "hf.co/bartowski/Qwen-GGUF:Q8_0"),
        ("HF://Qwen/Coder-GGUF/qwen2.5-coder-7b-instruct-q4_k_m.gguf",
         "hf.co/Qwen/Coder-GGUF:q4_k_m"),
        ("HF://org/R-GGUF/model.IQ4_XS.gguf", "hf.co/org/R-GGUF:IQ4_XS"),
        ("HF://org/R-GGUF:Q5_K_S", "hf.co/org/R-GGUF:Q5_K_S"),
        ("HF://org/R-GGUF", "hf.co/org/R-GGUF"),
    ],
)
def test_ollama_keeps_the_quantisation_of_a_hugging_face_gguf(source: str, tag: str) -> None:
    rendered = render(model(backend="ollama", source=source))
    assert rendered.served_name == tag
    (pull,) = pod(rendered)["initContainers"]
    assert f"ollama pull {tag}" in pull["command"][-1]


def test_ollama_refuses_a_file_whose_quantisation_it_cannot_tell() -> None:
    with pytest.raises(InvalidFieldError, match=r"spec.source: 'HF://org/R/model.gguf'.*:<quant>"):
        render(model(backend="ollama", source="HF://org/R/model.gguf"))


def test_ollama_pulls_into_its_backend_cache_once() -> None:
    rendered = render(model("small", backend="ollama", source="ollama://llama3.2:1b"))
    (pull,) = pod(rendered)["initContainers"]
    assert pull["volumeMounts"] == [{"name": "backend-cache", "mountPath": "/var/cache/flexinfer"}]
    assert "ollama show llama3.2:1b" in pull["command"][-1]  # no pull when it is there
    assert env(server(rendered))["OLLAMA_MODELS"] == "/var/cache/flexinfer/ollama"
    assert rendered.backend_cache_claim["metadata"]["name"] == "small-backend-cache"


def test_env_takes_values_from_secrets_config_maps_and_the_pod() -> None:
    entries = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode",
                                                           "optional": True}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "PLAIN", "value": "1"},
        # The user's entry replaces a backend's variable of the same name.
        {"name": "LLAMA_CACHE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
    ]
    for resource in (model(backend="llama-cpp", source="HF://o/r", env=entries),
                     md(backend="llama-cpp", model="o/r", env=entries)):
        got = {e["name"]: e for e in server(render(resource))["env"]}
        for entry in entries:
            assert got[entry["name"]] == entry
        assert list(got).count("LLAMA_CACHE") == 1
    with pytest.raises(InvalidFieldError, match=r"spec.env\[0\].valueFrom"):
        workload_from_model(model(env=[{"name": "X", "valueFrom": {}}]))


def test_more_than_one_gpu_renders_tensor_parallelism_where_the_backend_needs_it() -> None:
    vllm = server(render(model(source="HF://org/repo", gpu={"count": 2})))
    assert vllm["args"][vllm["args"].index("--tensor-parallel-size") + 1] == "2"
    assert vllm["resources"]["limits"]["amd.com/gpu"] == "2"
    own = server(render(model(source="HF://org/repo", gpu={"count": 2},
                              extraArgs=["--tensor-parallel-size", "1"])))
    assert own["args"].count("--tensor-parallel-size") == 1
    mlc = server(render(md(backend="mlc-llm", model="file:///srv/m",
                           resources={"limits": {"amd.com/gpu": "4"}},
                           mlcllm={"overrides": {"prefillChunkSize": 512}})))
    assert mlc["args"][mlc["args"].index("--overrides") + 1] == (
        "prefill_chunk_size=512;tensor_parallel_shards=4")
    one = server(render(model(source="HF://org/repo")))
    assert "--tensor-parallel-size" not in one["args"]
    # llama.cpp splits layers over every GPU it sees by default: nothing to add.
    llama = server(render(model(backend="llama-cpp", source="HF://o/r", gpu={"count": 2})))
    assert "--split-mode" not in llama["args"] and "--tensor-split" not in llama["args"]


def test_a_gpu_groups_node_selector_reaches_its_members_pods() -> None:
    workload = workload_from_model_deployment(
        md(nodeSelector={"disk": "nvme"}), group="gpus",
        group_node_selector=(("kubernetes.io/hostname", "gpu-node-1"),))
    assert dict(workload.node_selector) == {"disk": "nvme",
                                            "kubernetes.io/hostname": "gpu-node-1"}
    with pytest.raises(InvalidFieldError, match=r"spec.nodeSelector\[kubernetes.io/hostname\]: "
                                                r"'other'.*GPUGroup gpus"):
        workload_from_model_deployment(
            md(nodeSelector={"kubernetes.io/hostname": "other"}), group="gpus",
            group_node_selector=(("kubernetes.io/hostname", "gpu-node-1"),))


def test_a_quant_tag_parses_and_a_gguf_file_names_its_quantisation() -> None:
    tagged = parse_source("HF://org/R-GGUF:Q8_0", field="f")
    assert (tagged.repo, tagged.quant, tagged.path) == ("org/R-GGUF", "Q8_0", "")
    assert parse_source("HF://org/R/sub/x-f16.gguf", field="f").gguf_quant == "f16"
    assert parse_source("HF://org/R/x.gguf", field="f").gguf_quant == ""
