"""The renderer per backend and mode: the fields that matter for running the server.

Expected values are written from the backends' documented command lines (and the
issue's list), never produced by the renderer itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.cache import cache_from_k8s
from flexinfer_k8s.render.policy import AdminPolicy, Taint
from flexinfer_k8s.render.workload import workload_from_model, workload_from_model_deployment
from flexinfer_k8s.render.workloads import RenderSettings, render_workload
from tests.render.host_dirs import host_dir

# The administrator of these tests allows the host paths and the image they use
# (tests/render/test_tenant_policy.py checks the default policy).
POLICY = AdminPolicy(host_path_prefixes=("/srv", "/m.gguf"), image_prefixes=("my/",),
                     gpu_node_taints=(Taint("gpu", "", "NoSchedule"),),
                     pod_label_keys=("team",), pod_annotation_keys=("flexinfer.test/*",))
SETTINGS = RenderSettings(images={("mlc-llm", "amd"): "registry.local/mlc-llm:rocm"},  # type: ignore[dict-item]
                          policy=POLICY)


def model(name: str = "m", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"backend": "vllm", "source": "HF://org/repo"}
    body.update(spec)
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1"},
        "spec": body,
    }


def md(name: str = "d", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"backend": "vllm", "model": "Qwen/Qwen3-4B"}
    body.update(spec)
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-2"},
        "spec": body,
    }


def cache(name: str = "c", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"source": "HF://org/repo", "storageStrategy": "SharedPVC"}
    body.update(spec)
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelCache",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-3"},
        "spec": body,
    }


def render(obj: dict[str, Any], cache_obj: dict[str, Any] | None = None,
           settings: RenderSettings = SETTINGS) -> Any:
    workload = (
        workload_from_model(obj) if obj["kind"] == "Model" else workload_from_model_deployment(obj)
    )
    spec = cache_from_k8s(cache_obj) if cache_obj is not None else None
    return render_workload(workload, cache=spec, settings=settings)


def server(rendered: Any) -> dict[str, Any]:
    containers = rendered.deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["server"]
    return dict(containers[0])


def pod(rendered: Any) -> dict[str, Any]:
    return dict(rendered.deployment["spec"]["template"]["spec"])


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or []}


# --- vLLM ----------------------------------------------------------------------------


def test_vllm_serves_under_the_resource_name_on_port_8000() -> None:
    rendered = render(model("chat", vllm={"gpuMemoryUtilization": "0.9", "maxModelLen": 8192}))
    c = server(rendered)
    assert c["image"] == "rocm/vllm:latest"
    assert c["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert c["args"] == [
        "--model", "org/repo", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "chat", "--gpu-memory-utilization", "0.9",
        "--max-model-len", "8192",
    ]
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert rendered.served_name == "chat"
    assert rendered.endpoint == "http://chat.ns.svc:8000/v1"


def test_vllm_renders_only_the_flags_the_user_set() -> None:
    args = server(render(model()))["args"]
    assert args == ["--model", "org/repo", "--host", "0.0.0.0", "--port", "8000",
                    "--served-model-name", "m"]
    assert not [a for a in args if "swap" in a]


def test_a_model_deployment_names_its_model_plainly() -> None:
    args = server(render(md("tools", vllm={"maxNumSeqs": 8})))["args"]
    assert args[:2] == ["--model", "Qwen/Qwen3-4B"]
    assert args[-2:] == ["--max-num-seqs", "8"]


# --- mlc-llm -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["local", "interactive", "server"])
def test_mlc_llm_serve_is_the_subcommand_and_the_mode_a_flag(mode: str) -> None:
    rendered = render(
        model("qwen", backend="mlc-llm", source="HF://mlc-ai/Qwen-q4f16_1-MLC",
              cache={"modelCacheRef": "c"}, mlcllm={"mode": mode}),
        cache("c", source="HF://mlc-ai/Qwen-q4f16_1-MLC"),
    )
    c = server(rendered)
    assert c["command"] == ["python3", "-m", "mlc_llm"]
    assert c["args"] == ["serve", "/models/c", "--host", "0.0.0.0", "--port", "8000",
                         "--mode", mode]
    assert c["image"] == "registry.local/mlc-llm:rocm"
    assert rendered.served_name == "/models/c"


def test_mlc_llm_overrides_carry_only_what_is_set_in_a_fixed_order() -> None:
    c = server(render(md(
        "q", backend="mlc-llm", model="file:///srv/models/qwen-mlc",
        mlcllm={
            "mode": "server", "modelLibPath": "/srv/lib/qwen-rocm.so", "jitPolicy": "OFF",
            "gpuMemoryBytes": 24_000_000_000,
            "overrides": {"maxNumSequence": 2, "maxTotalSeqLength": 131072,
                          "gpuMemoryUtilization": "0.9"},
        },
    )))
    assert c["args"] == [
        "serve", "/models/qwen-mlc", "--host", "0.0.0.0", "--port", "8000",
        "--mode", "server", "--model-lib", "/srv/lib/qwen-rocm.so",
        "--overrides", "max_total_seq_length=131072;max_num_sequence=2;gpu_memory_utilization=0.9",
    ]
    assert env(c)["MLC_JIT_POLICY"] == "OFF"
    assert env(c)["MLC_GPU_SIZE_BYTES"] == "24000000000"


@pytest.mark.parametrize("source", ["HF://mlc-ai/Qwen3-8B-q4f16_1-MLC",
                                    "huggingface://mlc-ai/Qwen3-8B-q4f16_1-MLC"])
def test_mlc_llm_downloads_a_hugging_face_repository_itself_into_its_backend_cache(
    source: str,
) -> None:
    # mlc-llm's serve takes HF://user/repo (and only that spelling) and keeps its
    # downloads and JIT-compiled libraries under MLC_LLM_HOME.
    rendered = render(model("qwen3-8b", backend="mlc-llm", source=source))
    c = server(rendered)
    assert c["args"][:2] == ["serve", "HF://mlc-ai/Qwen3-8B-q4f16_1-MLC"]
    assert rendered.served_name == "HF://mlc-ai/Qwen3-8B-q4f16_1-MLC"
    assert env(c)["MLC_LLM_HOME"] == "/var/cache/flexinfer/mlc-llm"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["backend-cache"] == "/var/cache/flexinfer"
    volumes = {v["name"]: v for v in pod(rendered)["volumes"]}
    assert volumes["backend-cache"]["persistentVolumeClaim"] == {
        "claimName": "qwen3-8b-backend-cache"}
    claim = rendered.backend_cache_claim
    assert claim["metadata"]["name"] == "qwen3-8b-backend-cache"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "50Gi"}}}
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Model", "qwen3-8b", "uid-1")


def test_the_backend_cache_takes_its_size_and_class_or_becomes_an_empty_dir() -> None:
    sized = render(model(backend="mlc-llm", source="HF://mlc-ai/Q-MLC",
                         backendCache={"size": "80Gi", "storageClassName": "local-path"}))
    assert sized.backend_cache_claim["spec"]["resources"]["requests"]["storage"] == "80Gi"
    assert sized.backend_cache_claim["spec"]["storageClassName"] == "local-path"
    off = render(model(backend="mlc-llm", source="HF://mlc-ai/Q-MLC",
                       backendCache={"enabled": False}))
    assert off.backend_cache_claim is None
    volumes = {v["name"]: v for v in pod(off)["volumes"]}
    assert volumes["backend-cache"] == {"name": "backend-cache", "emptyDir": {}}


def test_no_backend_cache_for_a_local_model_with_a_compiled_library() -> None:
    rendered = render(md(backend="mlc-llm", model="file:///srv/m",
                         mlcllm={"modelLibPath": "/models/m/lib.so"}))
    assert rendered.backend_cache_claim is None
    assert "MLC_LLM_HOME" not in env(server(rendered))
    assert "backend-cache" not in {v["name"] for v in pod(rendered)["volumes"]}
    # Without the library mlc-llm compiles one at start: that goes to the cache.
    jit = render(md(backend="mlc-llm", model="file:///srv/m"))
    assert jit.backend_cache_claim is not None
    assert env(server(jit))["MLC_LLM_HOME"] == "/var/cache/flexinfer/mlc-llm"


def test_mlc_llm_refuses_what_it_cannot_run_naming_the_field() -> None:
    with pytest.raises(InvalidFieldError, match=r"spec.source: 'HF://org/repo/sub'.*whole"):
        render(model(backend="mlc-llm", source="HF://org/repo/sub"))
    with pytest.raises(InvalidFieldError, match=r"spec.source: 'ollama://x'.*cannot be served"):
        render(model(backend="mlc-llm", source="ollama://x"))
    # A library under /models with nothing mounted there: the field to add is named.
    with pytest.raises(InvalidFieldError,
                       match=r"spec.mlcllm.modelLibPath: '/models/lib.so'.*spec.modelCacheRef"):
        render(md(backend="mlc-llm", model="Qwen3-8B-q4f32_1-MLC",
                  mlcllm={"modelLibPath": "/models/lib.so"}))
    with pytest.raises(InvalidFieldError, match=r"spec.mlcllm.modelLibPath: '' is required "
                                                r"with jitPolicy OFF"):
        render(md(backend="mlc-llm", model="file:///srv/m", mlcllm={"jitPolicy": "OFF"}))


def test_mlc_llm_has_a_default_image_per_vendor_that_the_flag_replaces() -> None:
    amd = server(render(md(backend="mlc-llm", model="file:///srv/m"),
                        settings=RenderSettings(policy=POLICY)))
    assert amd["image"] == "flexinfer-mlc-llm:rocm6.2"
    nvidia = server(render(md(backend="mlc-llm", model="file:///srv/m",
                              resources={"limits": {"nvidia.com/gpu": "1"}}),
                           settings=RenderSettings(policy=POLICY)))
    assert nvidia["image"] == "flexinfer-mlc-llm:cuda12.4"
    assert amd["image"] != server(render(md(backend="mlc-llm", model="file:///srv/m")))["image"]
    with pytest.raises(InvalidFieldError, match=r"spec.image.*--image mlc-llm="):
        render(model(backend="mlc-llm", source="file:///srv/m", gpu={"vendor": "cpu"}),
               settings=RenderSettings(policy=POLICY))


def test_the_vram_estimate_warns_when_the_kv_cache_alone_cannot_fit() -> None:
    # 2 sequences x 131072 tokens x 55 kB = 14.4 GB of KV cache against 12 GB.
    rendered = render(md(backend="mlc-llm", model="file:///srv/m", mlcllm={
        "gpuMemoryBytes": 12_000_000_000,
        "overrides": {"maxNumSequence": 2, "maxTotalSeqLength": 131072},
    }))
    assert rendered.vram is not None and not rendered.vram.fits
    assert rendered.vram.kv_cache_bytes == 2 * 131072 * 55_000
    assert "14.4 GB" in rendered.vram.message and "12.0 GB" in rendered.vram.message
    roomy = render(md(backend="mlc-llm", model="file:///srv/m", mlcllm={
        "gpuMemoryBytes": 24_000_000_000,
        "overrides": {"maxNumSequence": 2, "maxTotalSeqLength": 131072},
    }))
    assert roomy.vram is not None and roomy.vram.fits
    assert render(md()).vram is None


# --- llama.cpp -----------------------------------------------------------------------


def test_llama_cpp_renders_args_only_for_the_image_entrypoint() -> None:
    rendered = render(model("coder", backend="llama-cpp",
                            source="file:///srv/models/coder-q4.gguf",
                            llamacpp={"ctxSize": 8192}))
    c = server(rendered)
    assert "command" not in c
    assert c["image"] == "ghcr.io/ggml-org/llama.cpp:server-rocm"
    assert c["args"] == [
        "-m", "/models/coder-q4.gguf", "--host", "0.0.0.0", "--port", "8000",
        "--alias", "coder", "--n-gpu-layers", "999", "--ctx-size", "8192",
    ]
    volumes = {v["name"]: v for v in pod(rendered)["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    # The file through a claim on the `local` volume of its directory, never a hostPath.
    assert host_dir(volumes["model-source"], mounts["model-source"],
                    rendered.host_volumes) == "/srv/models/coder-q4.gguf"
    assert mounts["model-source"]["mountPath"] == "/models/coder-q4.gguf"
    assert mounts["model-source"]["readOnly"] is True


def test_llama_cpp_from_a_cache_loads_the_gguf_file_its_source_names() -> None:
    c = server(render(
        model(backend="llama-cpp", source="HF://Qwen/Coder-GGUF/coder-q4_k_m.gguf",
              cache={"modelCacheRef": "gguf"}),
        cache("gguf", source="HF://Qwen/Coder-GGUF/coder-q4_k_m.gguf"),
    ))
    assert c["args"][:2] == ["-m", "/models/gguf/coder-q4_k_m.gguf"]


@pytest.mark.parametrize(
    ("source", "flags"),
    [
        ("HF://Qwen/Coder-GGUF", ["--hf-repo", "Qwen/Coder-GGUF"]),
        ("HF://Qwen/Coder-GGUF:Q8_0", ["--hf-repo", "Qwen/Coder-GGUF:Q8_0"]),
        ("huggingface://Qwen/Coder-GGUF/coder-q4_k_m.gguf",
         ["--hf-repo", "Qwen/Coder-GGUF", "--hf-file", "coder-q4_k_m.gguf"]),
    ],
)
def test_llama_cpp_fetches_a_hugging_face_gguf_itself_into_its_backend_cache(
    source: str, flags: list[str]
) -> None:
    # llama-server's documented flags: -hf/--hf-repo <user>/<model>[:quant], -hff/--hf-file
    # FILE; LLAMA_CACHE is where it keeps what it downloads.
    rendered = render(model("coder", backend="llama-cpp", source=source))
    c = server(rendered)
    assert c["args"][: len(flags)] == flags
    assert "-m" not in c["args"]
    assert env(c)["LLAMA_CACHE"] == "/var/cache/flexinfer/llama.cpp"
    assert rendered.backend_cache_claim["metadata"]["name"] == "coder-backend-cache"


def test_llama_cpp_needs_a_gguf_file() -> None:
    with pytest.raises(InvalidFieldError, match=r"names no .gguf file"):
        render(model(backend="llama-cpp", source="pvc://models/qwen"))
    with pytest.raises(InvalidFieldError, match=r"spec.source: 'HF://Qwen/C/README.md'.*not a "
                                                r"\.gguf file"):
        render(model(backend="llama-cpp", source="HF://Qwen/C/README.md"))
    plain = server(render(md(backend="llama-cpp", model="Qwen/Coder-GGUF:Q4_K_M")))
    assert plain["args"][:2] == ["--hf-repo", "Qwen/Coder-GGUF:Q4_K_M"]
    with pytest.raises(InvalidFieldError, match=r"spec.model: 'coder'.*names no ModelCache"):
        render(md(backend="llama-cpp", model="coder"))


def test_a_cpu_model_requests_no_gpu_and_offloads_no_layers() -> None:
    rendered = render(model(backend="llama-cpp", source="file:///m.gguf",
                            gpu={"vendor": "cpu"}))
    c = server(rendered)
    assert c["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    assert "resources" not in c
    assert c["args"][c["args"].index("--n-gpu-layers") + 1] == "0"
    assert "supplementalGroups" not in pod(rendered)["securityContext"]


# --- Ollama --------------------------------------------------------------------------


def test_ollama_serves_on_8000_and_pulls_before_the_server_starts() -> None:
    rendered = render(model("small", backend="ollama", source="ollama://llama3.2:1b"))
    c = server(rendered)
    assert c["image"] == "ollama/ollama:rocm"
    assert "command" not in c and c["args"] == ["serve"]
    assert env(c)["OLLAMA_HOST"] == "0.0.0.0:8000"
    assert env(c)["OLLAMA_KEEP_ALIVE"] == "-1"
    init = pod(rendered)["initContainers"]
    assert [i["name"] for i in init] == ["ollama-pull"]
    assert init[0]["image"] == "ollama/ollama:rocm"
    assert "ollama pull llama3.2:1b" in init[0]["command"][-1]
    assert rendered.served_name == "llama3.2:1b"  # the proxy rewrites requests to it
    assert c["readinessProbe"]["httpGet"]["path"] == "/"


def test_ollama_pulls_hugging_face_gguf_repositories_by_their_hub_name() -> None:
    rendered = render(model(backend="ollama", source="HF://bartowski/Qwen-GGUF"))
    assert rendered.served_name == "hf.co/bartowski/Qwen-GGUF"


# --- GPUs, images, pass-through ------------------------------------------------------


def test_amd_gpus_are_requested_and_limited_with_the_device_groups() -> None:
    settings = RenderSettings(render_gid=110, policy=POLICY)
    rendered = render(model(gpu={"count": 2}, resources={"requests": {"cpu": "2"}}),
                      settings=settings)
    c = server(rendered)
    assert c["resources"] == {
        "requests": {"cpu": "2", "amd.com/gpu": "2"},
        "limits": {"amd.com/gpu": "2"},
    }
    assert pod(rendered)["securityContext"]["supplementalGroups"] == [44, 110]
    shm = next(v for v in pod(rendered)["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_nvidia_swaps_the_resource_and_the_image() -> None:
    rendered = render(model(gpu={"vendor": "nvidia"}))
    c = server(rendered)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert c["image"] == "vllm/vllm-openai:latest"
    assert "supplementalGroups" not in pod(rendered)["securityContext"]


def test_a_model_deployment_follows_its_resources_for_the_vendor() -> None:
    c = server(render(md(resources={"limits": {"nvidia.com/gpu": "1", "memory": "16Gi"}})))
    assert c["resources"]["limits"] == {"memory": "16Gi", "nvidia.com/gpu": "1"}
    default = server(render(md()))
    assert default["resources"]["limits"] == {"amd.com/gpu": "1"}  # AMD, never NVIDIA


def test_a_controller_image_without_a_vendor_serves_every_vendor() -> None:
    settings = RenderSettings(policy=POLICY, images={("vllm", None): "mirror/vllm:1",
                                      ("vllm", "nvidia"): "mirror/vllm:cuda"})  # type: ignore[dict-item]
    assert server(render(model(), settings=settings))["image"] == "mirror/vllm:1"
    nvidia = render(model(gpu={"vendor": "nvidia"}), settings=settings)
    assert server(nvidia)["image"] == "mirror/vllm:cuda"


def test_a_model_deployment_with_zero_gpus_is_a_cpu_server() -> None:
    c = server(render(md(backend="llama-cpp", model="file:///m.gguf",
                         resources={"limits": {"amd.com/gpu": "0", "cpu": "4"}})))
    assert c["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    assert c["resources"] == {"limits": {"cpu": "4"}}


def test_vllm_refuses_an_ollama_tag() -> None:
    with pytest.raises(InvalidFieldError, match=r"source: 'ollama://llama3.2:1b' is an Ollama"):
        render(model(source="ollama://llama3.2:1b"))


def test_the_server_says_why_it_crashed_in_its_status() -> None:
    assert server(render(model()))["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_server_mode_without_kv_overrides_is_not_estimated() -> None:
    """mlc-llm sizes its KV cache to the card in server mode; only set limits are checked."""
    rendered = render(md(backend="mlc-llm", model="file:///srv/m",
                         mlcllm={"mode": "server", "gpuMemoryBytes": 24_000_000_000}))
    assert rendered.vram is None


def test_spec_image_overrides_the_default() -> None:
    assert server(render(md(image="my/vllm:dev")))["image"] == "my/vllm:dev"
    assert server(render(model(image="my/vllm:dev")))["image"] == "my/vllm:dev"


def test_env_selectors_tolerations_and_pod_metadata_pass_through() -> None:
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    rendered = render(model(
        env=[{"name": "HSA_OVERRIDE_GFX_VERSION", "value": "11.0.0"}],
        nodeSelector={"kubernetes.io/hostname": "gpu-1"},
        tolerations=[toleration],
        podAnnotations={"flexinfer.test/ready-delay": "3s"},
        podLabels={"team": "a"},
        shmSize="2Gi",
    ))
    p = pod(rendered)
    assert env(server(rendered))["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert p["nodeSelector"] == {"kubernetes.io/hostname": "gpu-1"}
    # The tenant's own, which is the policy's GPU-node taint already: not added twice
    # (render.tolerations).
    assert p["tolerations"] == [toleration]
    template = rendered.deployment["spec"]["template"]["metadata"]
    assert template["annotations"] == {"flexinfer.test/ready-delay": "3s"}
    assert template["labels"]["team"] == "a"
    shm = next(v for v in p["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["sizeLimit"] == "2Gi"


# --- the frame ------------------------------------------------------------------------


def test_deployment_and_service_are_owned_labelled_and_never_carry_replicas() -> None:
    rendered = render(model("chat", gpu={"shared": "homelab"}))
    deployment, service = rendered.deployment, rendered.service
    owner = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "name": "chat",
             "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}
    assert deployment["metadata"]["ownerReferences"] == [owner]
    assert service["metadata"]["ownerReferences"] == [owner]
    assert "replicas" not in deployment["spec"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    labels = deployment["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "flexinfer"
    assert labels["app.kubernetes.io/instance"] == "chat"
    assert labels["ai.flexinfer/model"] == "chat"
    assert labels["ai.flexinfer/backend"] == "vllm"
    selector = {"ai.flexinfer/model": "chat", "ai.flexinfer/kind": "Model"}
    assert deployment["spec"]["selector"] == {"matchLabels": selector}
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["ai.flexinfer/group"] == "homelab"


def allowed_seconds(probe: dict[str, Any]) -> int:
    """How long the kubelet lets a startup probe fail before it kills the container."""
    return int(probe.get("initialDelaySeconds", 0)
               + probe["periodSeconds"] * probe["failureThreshold"])


@pytest.mark.parametrize(
    ("resource", "cold_start"),
    [
        (model(source="file:///srv/m", serverless={"coldStartTimeout": "3m"}), 180),
        (model(source="file:///srv/m", serverless={"coldStartTimeout": "95s"}), 95),
        (model(source="file:///srv/m"), 60),
        (md(model="file:///srv/m", coldStartTimeoutSeconds=600), 600),
        (md(model="file:///srv/m", coldStartTimeoutSeconds=45), 45),
    ],
)
def test_the_startup_probe_allows_the_whole_cold_start_and_liveness_comes_after(
    resource: dict[str, Any], cold_start: int
) -> None:
    c = server(render(resource))
    startup = c["startupProbe"]
    # Covers the cold start, and by no more than one period.
    assert cold_start <= allowed_seconds(startup) < cold_start + startup["periodSeconds"]
    # Liveness exists for both kinds; the kubelet runs it only once startup succeeded.
    assert c["livenessProbe"]["httpGet"] == startup["httpGet"]


def test_a_server_that_downloads_or_compiles_gets_at_least_half_an_hour() -> None:
    # An 8 GB download must not be killed (and restarted from scratch) by the probe.
    downloads = server(render(model(source="HF://org/repo")))
    assert allowed_seconds(downloads["startupProbe"]) >= 1800
    longer = server(render(model(source="HF://org/repo",
                                 serverless={"coldStartTimeout": "1h"})))
    assert allowed_seconds(longer["startupProbe"]) >= 3600


def test_model_deployment_health_check_drives_liveness_after_the_startup_probe() -> None:
    c = server(render(md(model="file:///srv/m", healthCheck={"initialDelaySeconds": 180})))
    check = {"httpGet": {"path": "/health", "port": "http"}}
    assert c["livenessProbe"] == {**check, "initialDelaySeconds": 180, "periodSeconds": 30,
                                  "timeoutSeconds": 10, "failureThreshold": 3}
    # Readiness needs no initial delay: the startup probe holds it back during the load.
    assert c["readinessProbe"] == {**check, "periodSeconds": 30, "timeoutSeconds": 10,
                                   "failureThreshold": 3}
    assert allowed_seconds(c["startupProbe"]) >= 60


def test_an_unknown_backend_names_the_field() -> None:
    with pytest.raises(InvalidFieldError, match=r"spec.backend: 'tgi'"):
        render(model(backend="tgi"))


@pytest.mark.parametrize(
    ("gpu", "grace"),
    [
        pytest.param({"shared": "card"}, 90, id="default-60s-drain"),
        pytest.param({"shared": "card", "drainTimeout": "3s"}, 33, id="3s-drain"),
        pytest.param({"shared": "card", "drainTimeout": "1.5s"}, 32, id="rounded-up"),
        pytest.param({"shared": "card", "drainTimeout": "0s"}, None, id="no-drain"),
        pytest.param({}, None, id="not-shared"),
    ],
)
def test_the_termination_grace_period_covers_the_drain(
    gpu: dict[str, Any], grace: int | None
) -> None:
    # docs/election.md 1.6: drain timeout + the 30 s Kubernetes gives by default.
    rendered = render(model(gpu=gpu))
    assert pod(rendered).get("terminationGracePeriodSeconds") == grace


def test_a_drain_timeout_that_does_not_parse_names_the_field() -> None:
    with pytest.raises(InvalidFieldError, match=r"spec\.gpu\.drainTimeout"):
        render(model(gpu={"shared": "card", "drainTimeout": "soon"}))
