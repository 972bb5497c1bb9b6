"""Ollama: `ollama serve` on port 8000, the model pulled before the server starts.

The `ollama/ollama` images have `/bin/ollama` as their entrypoint, so the container
gets `serve` as its only arg, with `OLLAMA_HOST=0.0.0.0:8000` and
`OLLAMA_KEEP_ALIVE=-1` (the model stays loaded while the pod runs: unloading is the
election's job). The model is the tag of an `ollama://` source (or `hf.co/<org>/<name>`
for a Hugging Face GGUF repo, or a ModelDeployment's plain tag). Without a ModelCache
an init container pulls it into the pod's model volume, so the pod is Ready only once
the model is there. Ollama cannot rename what it serves: the tag is the served name
and the proxy rewrites requests to it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.backend import PORT, ModelLocation, ServerPlan
from flexinfer_k8s.render.source import Scheme
from flexinfer_k8s.render.workload import Kind, Vendor, Workload

MODELS_DIR = "/root/.ollama/models"


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
        if source.scheme in (Scheme.OLLAMA, Scheme.HUGGINGFACE):
            return source.ollama_tag
        raise InvalidFieldError(
            "spec.source" if workload.kind is Kind.MODEL else "spec.model",
            workload.model,
            "cannot be served by ollama: give an ollama://name[:tag] or an HF://org/repo "
            "GGUF source",
        )

    def plan(self, workload: Workload, model: ModelLocation) -> ServerPlan:
        tag = self.tag(workload)
        env = (
            ("OLLAMA_HOST", f"0.0.0.0:{PORT}"),
            ("OLLAMA_KEEP_ALIVE", "-1"),
            ("OLLAMA_NOPRUNE", "1"),
            ("OLLAMA_MODELS", model.path if model.cached else MODELS_DIR),
        )
        if model.cached:
            return ServerPlan(args=("serve", *workload.extra_args), served_name=tag, env=env)
        volume = {"name": "ollama-models", "emptyDir": {}}
        mount = {"name": "ollama-models", "mountPath": MODELS_DIR}
        pull = {
            "name": "ollama-pull",
            "command": [
                "sh",
                "-c",
                "set -eu; OLLAMA_HOST=127.0.0.1:11434 ollama serve & server=$!; tries=0; "
                "until OLLAMA_HOST=127.0.0.1:11434 ollama list >/dev/null 2>&1; do "
                'tries=$((tries+1)); [ "$tries" -gt 120 ] && exit 1; sleep 1; done; '
                f"OLLAMA_HOST=127.0.0.1:11434 ollama pull {shlex.quote(tag)}; kill $server",
            ],
            "env": [{"name": "OLLAMA_MODELS", "value": MODELS_DIR}],
            "volumeMounts": [mount],
        }
        return ServerPlan(
            args=("serve", *workload.extra_args),
            served_name=tag,
            env=env,
            init_containers=(pull,),
            volumes=(volume,),
            mounts=(mount,),
        )
