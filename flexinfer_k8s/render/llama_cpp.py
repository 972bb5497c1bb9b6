"""llama.cpp: `llama-server` args only, serving one GGUF file under the resource's name.

The `ghcr.io/ggml-org/llama.cpp:server-*` images have `llama-server` as their
entrypoint (it is not on PATH), so the container gets args and no command:
`-m <file> --host 0.0.0.0 --port 8000 --alias <name> --n-gpu-layers N --ctx-size N`.
The file must be local: a ModelCache whose source names the .gguf file, or a
file:// / pvc:// source.
"""

from __future__ import annotations

from collections.abc import Mapping

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.backend import PORT, ModelLocation, ServerPlan
from flexinfer_k8s.render.workload import Kind, Vendor, Workload


class LlamaCpp:
    name: str = "llama-cpp"
    health_path: str = "/health"
    shm_size: str = "1Gi"
    default_images: Mapping[Vendor, str] = {
        Vendor.AMD: "ghcr.io/ggml-org/llama.cpp:server-rocm",
        Vendor.NVIDIA: "ghcr.io/ggml-org/llama.cpp:server-cuda",
        Vendor.CPU: "ghcr.io/ggml-org/llama.cpp:server",
    }

    def plan(self, workload: Workload, model: ModelLocation) -> ServerPlan:
        field = "spec.source" if workload.kind is Kind.MODEL else "spec.model"
        if not model.local:
            raise InvalidFieldError(
                field,
                workload.model,
                "cannot be served by llama-cpp as it is: llama-server loads one local .gguf "
                "file, so reference a ModelCache whose source names the file (e.g. "
                "HF://org/repo/model-q4_k_m.gguf) or use a file:// or pvc:// source",
            )
        if not model.path.lower().endswith(".gguf"):
            raise InvalidFieldError(
                field,
                workload.model,
                f"names no .gguf file (the server would be given {model.path}): llama-cpp "
                "loads one file, e.g. HF://org/repo/model-q4_k_m.gguf",
            )
        options = workload.llamacpp
        layers = (
            options.n_gpu_layers if workload.gpu_count and workload.vendor is not Vendor.CPU else 0
        )
        return ServerPlan(
            args=(
                "-m",
                model.path,
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
        )
