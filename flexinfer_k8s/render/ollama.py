"""Ollama: `ollama serve` on port 8000, the model pulled before the server starts.

The `ollama/ollama` images have `/bin/ollama` as their entrypoint, so the container
gets `serve` as its only arg, with `OLLAMA_HOST=0.0.0.0:8000` and
`OLLAMA_KEEP_ALIVE=-1` (the model stays loaded while the pod runs: unloading is the
election's job). The model is the tag of an `ollama://` source, `hf.co/<org>/<name>`
for a Hugging Face GGUF repository (with its quantisation, `:Q8_0`, from a `:quant` tag
or the named file), or a ModelDeployment's plain tag. Without a ModelCache an init
container pulls it into `OLLAMA_MODELS`, the workload's backend cache
(`render.backend_cache`), unless it is there already, so the pod is Ready only once the
model is there and a swap-in does not pull again. With several GPUs Ollama spreads the
model over them by itself. Ollama cannot rename what it serves: the tag is the served
name and the proxy rewrites requests to it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render import backend_cache
from flexinfer_k8s.render.backend import BACKEND_CACHE_DIR, PORT, ModelLocation, ServerPlan
from flexinfer_k8s.render.source import Scheme
from flexinfer_k8s.render.workload import Vendor, Workload

OLLAMA_MODELS = f"{BACKEND_CACHE_DIR}/ollama"


class Ollama:
    name: str = "ollama"
    health_path: str = "/"
    shm_size: str = "1Gi"
    default_images: Mapping[Vendor, str] = {
        Vendor.AMD: "ollama/ollama:rocm",
        Vendor.NVIDIA: "ollama/ollama:latest",
        Vendor.CPU: "ollama/ollama:latest",
    }

    def tag(self, workload: Workload) -> str:
        source = workload.source
        if source is None:
            return workload.model  # a ModelDeployment's plain tag, e.g. llama3.2:1b
        if source.scheme is Scheme.OLLAMA:
            return source.ollama_tag
        if source.scheme is Scheme.HUGGINGFACE:
            if source.path and not source.gguf_quant:
                raise InvalidFieldError(
                    workload.model_field,
                    workload.model,
                    f"names {source.path}, whose quantisation Ollama cannot tell from the name "
                    f"(it pulls hf.co/{source.repo}:<quant>): write HF://{source.repo}:<quant>, "
                    "e.g. :Q4_K_M",
                )
            return source.ollama_tag
        raise InvalidFieldError(
            workload.model_field,
            workload.model,
            "cannot be served by ollama: give an ollama://name[:tag] or an HF://org/repo "
            "GGUF source",
        )

    def plan(self, workload: Workload, model: ModelLocation) -> ServerPlan:
        tag = self.tag(workload)
        models_dir = model.path if model.cached else OLLAMA_MODELS
        env = (
            ("OLLAMA_HOST", f"0.0.0.0:{PORT}"),
            ("OLLAMA_KEEP_ALIVE", "-1"),
            ("OLLAMA_NOPRUNE", "1"),
            ("OLLAMA_MODELS", models_dir),
        )
        if model.cached:
            return ServerPlan(args=("serve", *workload.extra_args), served_name=tag, env=env)
        quoted = shlex.quote(tag)
        pull = {
            "name": "ollama-pull",
            "command": [
                "sh",
                "-c",
                "set -eu; OLLAMA_HOST=127.0.0.1:11434 ollama serve & server=$!; tries=0; "
                "until OLLAMA_HOST=127.0.0.1:11434 ollama list >/dev/null 2>&1; do "
                'tries=$((tries+1)); [ "$tries" -gt 120 ] && exit 1; sleep 1; done; '
                # Already in the backend cache (an earlier pod pulled it): no network needed.
                f"OLLAMA_HOST=127.0.0.1:11434 ollama show {quoted} >/dev/null 2>&1 || "
                f"OLLAMA_HOST=127.0.0.1:11434 ollama pull {quoted}; kill $server",
            ],
            "env": [{"name": "OLLAMA_MODELS", "value": OLLAMA_MODELS}],
            "volumeMounts": [backend_cache.mount()],
        }
        return ServerPlan(
            args=("serve", *workload.extra_args),
            served_name=tag,
            env=env,
            init_containers=(pull,),
            backend_cache=True,
        )
