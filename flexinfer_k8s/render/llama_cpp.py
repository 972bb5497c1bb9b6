"""llama.cpp: `llama-server` args only, serving one GGUF file under the resource's name.

The `ghcr.io/ggml-org/llama.cpp:server-*` images have `llama-server` as their
entrypoint (it is not on PATH), so the container gets args and no command:
`-m <file> --host 0.0.0.0 --port 8000 --alias <name> --n-gpu-layers N --ctx-size N`.
The file is local (a ModelCache's copy, a `file://` or `pvc://` file) or fetched by
llama-server itself from Hugging Face: `--hf-repo org/repo[:quant]`, plus `--hf-file
<file>` when the source names one, into `LLAMA_CACHE`, the workload's backend cache
(`render.backend_cache`), so a swap-in does not download again. With more than one GPU
llama-server splits the layers over every GPU the pod has (its default `--split-mode
layer`), so nothing more is rendered.
"""

from __future__ import annotations

from collections.abc import Mapping

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.backend import BACKEND_CACHE_DIR, PORT, ModelLocation, ServerPlan
from flexinfer_k8s.render.source import Scheme
from flexinfer_k8s.render.workload import Vendor, Workload

LLAMA_CACHE = f"{BACKEND_CACHE_DIR}/llama.cpp"


class LlamaCpp:
    name: str = "llama-cpp"
    health_path: str = "/health"
    shm_size: str = "1Gi"
    default_images: Mapping[Vendor, str] = {
        Vendor.AMD: "ghcr.io/ggml-org/llama.cpp:server-rocm",
        Vendor.NVIDIA: "ghcr.io/ggml-org/llama.cpp:server-cuda",
        Vendor.CPU: "ghcr.io/ggml-org/llama.cpp:server",
    }

    def _model_args(self, workload: Workload, model: ModelLocation) -> tuple[list[str], bool]:
        """The flags that name the model, and whether the server downloads it."""
        if model.local:
            if not model.path.lower().endswith(".gguf"):
                raise InvalidFieldError(
                    workload.model_field,
                    workload.model,
                    f"names no .gguf file (the server would be given {model.path}): llama-cpp "
                    "loads one file, e.g. HF://org/repo/model-q4_k_m.gguf",
                )
            return ["-m", model.path], False
        remote = model.remote
        if remote is None or remote.scheme is not Scheme.HUGGINGFACE:
            raise InvalidFieldError(
                workload.model_field,
                workload.model,
                "cannot be served by llama-cpp: llama-server loads a .gguf file, local or "
                "from a Hugging Face repository (HF://org/repo[:quant][/file.gguf])",
            )
        if remote.path and not remote.is_gguf:
            raise InvalidFieldError(
                workload.model_field,
                workload.model,
                f"names {remote.path}, which is not a .gguf file: llama-cpp loads one file "
                f"(HF://{remote.repo}/<file>.gguf), or lets the repository pick its own "
                f"(HF://{remote.repo}[:quant])",
            )
        repo = f"{remote.repo}:{remote.quant}" if remote.quant else remote.repo
        args = ["--hf-repo", repo]
        if remote.path:
            args += ["--hf-file", remote.path]
        return args, True

    def plan(self, workload: Workload, model: ModelLocation) -> ServerPlan:
        model_args, downloads = self._model_args(workload, model)
        options = workload.llamacpp
        layers = (
            options.n_gpu_layers if workload.gpu_count and workload.vendor is not Vendor.CPU else 0
        )
        return ServerPlan(
            args=(
                *model_args,
                "--host",
                "0.0.0.0",
                "--port",
                str(PORT),
                "--alias",
                workload.name,
                "--n-gpu-layers",
                str(layers),
                "--ctx-size",
                str(options.ctx_size),
                *workload.extra_args,
            ),
            served_name=workload.name,
            env=(("LLAMA_CACHE", LLAMA_CACHE),) if downloads else (),
            backend_cache=downloads,
        )
