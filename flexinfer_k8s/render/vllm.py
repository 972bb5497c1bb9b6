"""vLLM: the OpenAI API server module, serving under the resource's name.

`python3 -m vllm.entrypoints.openai.api_server --model <path or repo> --host 0.0.0.0
--port 8000 --served-model-name <name>`, plus `--gpu-memory-utilization`,
`--max-model-len`, `--max-num-seqs` only where the resource sets them and
`--tensor-parallel-size N` for N > 1 GPUs (flags newer versions dropped, such as the swap
space, are never rendered). The module path is spelled out so the command works whatever
the image's entrypoint. vLLM fetches a Hugging Face repository itself when the model is
not local, into `HF_HOME`, the workload's backend cache (`render.backend_cache`). A GGUF
file it loads only from a local path (a ModelCache's copy, `file://`, `pvc://`): a
Hugging Face GGUF source without a cache is refused, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.backend import BACKEND_CACHE_DIR, PORT, ModelLocation, ServerPlan
from flexinfer_k8s.render.source import Scheme
from flexinfer_k8s.render.workload import Vendor, Workload

HF_HOME = f"{BACKEND_CACHE_DIR}/huggingface"
TENSOR_PARALLEL = "--tensor-parallel-size"


class Vllm:
    name: str = "vllm"
    health_path: str = "/health"
    shm_size: str = "8Gi"
    default_images: Mapping[Vendor, str] = {
        Vendor.AMD: "rocm/vllm:latest",
        Vendor.NVIDIA: "vllm/vllm-openai:latest",
    }

    def _refuse_remote(self, workload: Workload, model: ModelLocation) -> None:
        """A remote source vLLM cannot fetch as written raises, naming the field."""
        remote = model.remote
        if model.local or remote is None:
            return
        field = workload.model_field
        if remote.scheme is Scheme.OLLAMA:
            raise InvalidFieldError(
                field,
                workload.model,
                "is an Ollama tag, which vLLM cannot load: use backend ollama, or a Hugging "
                "Face repository",
            )
        if remote.is_gguf or remote.quant:
            raise InvalidFieldError(
                field,
                workload.model,
                "names a GGUF file of a Hugging Face repository, which vLLM loads only from a "
                "local path: reference a ModelCache whose source is this file (and pass the "
                "base model's tokenizer, spec.extraArgs: [--tokenizer, org/base-model]), or "
                "serve it with backend llama-cpp",
            )
        if remote.path:
            raise InvalidFieldError(
                field,
                workload.model,
                f"names {remote.path} inside the repository, but vLLM fetches whole "
                f"repositories: write HF://{remote.repo}, or reference a ModelCache",
            )

    def plan(self, workload: Workload, model: ModelLocation) -> ServerPlan:
        self._refuse_remote(workload, model)
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
        if workload.gpu_count > 1 and TENSOR_PARALLEL not in workload.extra_args:
            # One tensor-parallel rank per GPU the pod gets; an explicit flag wins.
            args += [TENSOR_PARALLEL, str(workload.gpu_count)]
        downloads = not model.local
        return ServerPlan(
            command=("python3", "-m", "vllm.entrypoints.openai.api_server"),
            args=(*args, *workload.extra_args),
            served_name=workload.name,
            env=(("HF_HOME", HF_HOME),) if downloads else (),
            backend_cache=downloads,
        )
