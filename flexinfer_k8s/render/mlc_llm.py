"""mlc-llm: `python -m mlc_llm serve <model> --mode <local|interactive|server>`.

`serve` is the subcommand and the mode a flag (never the mode as the subcommand);
`--overrides` carries only the overrides the user set, `key=value` joined by `;`.
mlc-llm serves a compiled model directory, so the model must be local (a ModelCache
or a file:// / pvc:// source). No official mlc-llm ROCm server image is confirmed:
the image comes from `spec.image` or the controller's `--image mlc-llm=...`
(docs/backends/mlc-llm.md says what to build). The server answers under the model
path it was given, so that is the served name the proxy rewrites requests to.
"""

from __future__ import annotations

from collections.abc import Mapping

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.backend import PORT, ModelLocation, ServerPlan
from flexinfer_k8s.render.workload import Kind, Vendor, Workload


class MlcLlm:
    name: str = "mlc-llm"
    health_path: str = "/v1/models"
    shm_size: str = "2Gi"
    default_images: Mapping[Vendor, str] = {}

    def plan(self, workload: Workload, model: ModelLocation) -> ServerPlan:
        if not model.local:
            field = "spec.source" if workload.kind is Kind.MODEL else "spec.model"
            raise InvalidFieldError(
                field,
                workload.model,
                "cannot be served by mlc-llm as it is: mlc-llm serves a compiled model "
                "directory, so reference a ModelCache (which downloads it) or use a "
                "file:// or pvc:// source",
            )
        mlc = workload.mlc
        args = [
            "serve",
            model.path,
            "--host",
            "0.0.0.0",
            "--port",
            str(PORT),
            "--mode",
            mlc.mode,
        ]
        if mlc.model_lib_path:
            args += ["--model-lib", mlc.model_lib_path]
        overrides = [
            (key, value)
            for key, value in (
                ("prefill_chunk_size", mlc.prefill_chunk_size),
                ("max_total_seq_length", mlc.max_total_seq_length),
                ("max_num_sequence", mlc.max_num_sequence),
                ("gpu_memory_utilization", mlc.gpu_memory_utilization or None),
            )
            if value is not None
        ]
        if overrides:
            args += ["--overrides", ";".join(f"{key}={value}" for key, value in overrides)]
        env = []
        if mlc.jit_policy:
            env.append(("MLC_JIT_POLICY", mlc.jit_policy))
        if mlc.gpu_memory_bytes is not None:
            env.append(("MLC_GPU_SIZE_BYTES", str(mlc.gpu_memory_bytes)))
        return ServerPlan(
            command=("python3", "-m", "mlc_llm"),
            args=(*args, *workload.extra_args),
            served_name=model.path,
            env=tuple(env),
        )
