"""vLLM: the OpenAI API server module, serving under the resource's name.

`python3 -m vllm.entrypoints.openai.api_server --model <path or repo> --host 0.0.0.0
--port 8000 --served-model-name <name>`, plus `--gpu-memory-utilization`,
`--max-model-len`, `--max-num-seqs` only where the resource sets them (flags newer
versions dropped, such as the swap space, are never rendered). The module path is
spelled out so the command works whatever the image's entrypoint. vLLM fetches a
Hugging Face repo itself when the model is not local.
"""

from __future__ import annotations

from collections.abc import Mapping

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.backend import PORT, ModelLocation, ServerPlan
from flexinfer_k8s.render.source import Scheme
from flexinfer_k8s.render.workload import Kind, Vendor, Workload


class Vllm:
    name: str = "vllm"
    health_path: str = "/health"
    shm_size: str = "8Gi"
    default_images: Mapping[Vendor, str] = {
        Vendor.AMD: "rocm/vllm:latest",
        Vendor.NVIDIA: "vllm/vllm-openai:latest",
    }

    def plan(self, workload: Workload, model: ModelLocation) -> ServerPlan:
        if workload.source is not None and workload.source.scheme is Scheme.OLLAMA:
            raise InvalidFieldError(
                "spec.source" if workload.kind is Kind.MODEL else "spec.model",
                workload.model,
                "is an Ollama tag, which vLLM cannot load: use backend ollama, or a Hugging "
                "Face repository",
            )
        options = workload.vllm
        args = [
            "--model",
            model.path,
            "--host",
            "0.0.0.0",
            "--port",
            str(PORT),
            "--served-model-name",
            workload.name,
        ]
        if options.gpu_memory_utilization:
            args += ["--gpu-memory-utilization", options.gpu_memory_utilization]
        if options.max_model_len is not None:
            args += ["--max-model-len", str(options.max_model_len)]
        if options.max_num_seqs is not None:
            args += ["--max-num-seqs", str(options.max_num_seqs)]
        return ServerPlan(
            command=("python3", "-m", "vllm.entrypoints.openai.api_server"),
            args=(*args, *workload.extra_args),
            served_name=workload.name,
        )
