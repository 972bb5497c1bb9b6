"""mlc-llm: `python3 -m mlc_llm serve <model> --mode <local|interactive|server>`.

`serve` is the subcommand and the mode a flag (never the mode as the subcommand);
`--overrides` carries only the overrides the user set (and `tensor_parallel_shards`
for more than one GPU), `key=value` joined by `;`. The model is a local compiled
directory (a ModelCache's copy, a `file://` or `pvc://` directory under `/models`) or a
Hugging Face repository mlc-llm downloads itself (`HF://org/name`: mlc-llm takes that
spelling only, so `huggingface://` is rewritten to it). mlc-llm keeps its downloads and
the model libraries it compiles when `modelLibPath` is not set (JIT) under
`MLC_LLM_HOME`, which is the workload's backend cache (`render.backend_cache`), so a
swap-in neither downloads nor compiles again.

No public mlc-llm server image is maintained upstream: the default images are the ones
`deploy/mlc-llm/Dockerfile` builds (docs/backends/mlc-llm.md says why and how), whose
build checks that the command rendered here exists. The server answers under the model
it was given (path or `HF://` name), so that is the served name the proxy rewrites
requests to.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.backend import BACKEND_CACHE_DIR, PORT, ModelLocation, ServerPlan
from flexinfer_k8s.render.cache import MODELS_MOUNT
from flexinfer_k8s.render.source import Scheme
from flexinfer_k8s.render.workload import Vendor, Workload

MLC_LLM_HOME = f"{BACKEND_CACHE_DIR}/mlc-llm"
COMMAND = ("python3", "-m", "mlc_llm")
DEFAULT_IMAGES: Mapping[Vendor, str] = {
    Vendor.AMD: "flexinfer-mlc-llm:rocm6.2",
    Vendor.NVIDIA: "flexinfer-mlc-llm:cuda12.4",
}
"""What `deploy/mlc-llm/Dockerfile` tags (`ROCM=1` or not); `--image mlc-llm[:vendor]=`
replaces them."""


class MlcLlm:
    name: str = "mlc-llm"
    health_path: str = "/v1/models"
    shm_size: str = "2Gi"
    default_images: Mapping[Vendor, str] = DEFAULT_IMAGES

    def _model_argument(self, workload: Workload, model: ModelLocation) -> str:
        if model.local:
            return model.path
        remote = model.remote
        if remote is None or remote.scheme is not Scheme.HUGGINGFACE:
            raise InvalidFieldError(
                workload.model_field,
                workload.model,
                "cannot be served by mlc-llm: it serves a compiled MLC model directory or "
                "downloads one from Hugging Face itself (HF://org/name)",
            )
        if remote.path or remote.quant:
            raise InvalidFieldError(
                workload.model_field,
                workload.model,
                f"names part of a repository, but mlc-llm downloads whole compiled MLC "
                f"repositories: write HF://{remote.repo}",
            )
        return f"HF://{remote.repo}"

    def plan(self, workload: Workload, model: ModelLocation) -> ServerPlan:
        mlc = workload.mlc
        target = self._model_argument(workload, model)
        lib = mlc.model_lib_path
        if lib.startswith(f"{MODELS_MOUNT}/") and not model.local:
            raise InvalidFieldError(
                "spec.mlcllm.modelLibPath",
                lib,
                f"lies under {MODELS_MOUNT}, but {workload.model_field} {workload.model!r} is "
                f"downloaded by mlc-llm itself ({target}), so nothing is mounted there: add "
                "spec.modelCacheRef naming the ModelCache that holds the compiled model (or "
                "give it a ModelCache whose modelPath is the model's name), or leave "
                "modelLibPath out to compile the library at start",
            )
        inside = lib.startswith(f"{MODELS_MOUNT}/") and model.local
        if inside and posixpath.dirname(lib) != MODELS_MOUNT and not lib.startswith(f"{target}/"):
            # /models holds the model directory and links to its entries, nothing else.
            raise InvalidFieldError(
                "spec.mlcllm.modelLibPath",
                lib,
                f"lies outside the model's directory {target}: under {MODELS_MOUNT} a pod sees "
                f"only that directory (also as {MODELS_MOUNT}/<file>), so name the library in "
                f"it, e.g. {target}/{posixpath.basename(lib)}",
            )
        if not lib and mlc.jit_policy == "OFF":
            raise InvalidFieldError(
                "spec.mlcllm.modelLibPath",
                "",
                "is required with jitPolicy OFF: without a compiled library mlc-llm must "
                "compile one at start, which OFF forbids",
            )
        args = ["serve", target, "--host", "0.0.0.0", "--port", str(PORT), "--mode", mlc.mode]
        if lib:
            args += ["--model-lib", lib]
        overrides = [
            (key, value)
            for key, value in (
                ("prefill_chunk_size", mlc.prefill_chunk_size),
                ("max_total_seq_length", mlc.max_total_seq_length),
                ("max_num_sequence", mlc.max_num_sequence),
                ("gpu_memory_utilization", mlc.gpu_memory_utilization or None),
                # One shard per GPU the pod gets: mlc-llm's tensor parallelism.
                (
                    "tensor_parallel_shards",
                    workload.gpu_count if workload.gpu_count > 1 else None,
                ),
            )
            if value is not None
        ]
        if overrides:
            args += ["--overrides", ";".join(f"{key}={value}" for key, value in overrides)]
        # Downloads and JIT-compiled libraries go to MLC_LLM_HOME: keep it across pods.
        backend_cache = not model.local or not lib
        env = []
        if mlc.jit_policy:
            env.append(("MLC_JIT_POLICY", mlc.jit_policy))
        if mlc.gpu_memory_bytes is not None:
            env.append(("MLC_GPU_SIZE_BYTES", str(mlc.gpu_memory_bytes)))
        if backend_cache:
            env.append(("MLC_LLM_HOME", MLC_LLM_HOME))
        return ServerPlan(
            command=COMMAND,
            args=(*args, *workload.extra_args),
            served_name=target,
            env=tuple(env),
            backend_cache=backend_cache,
        )
