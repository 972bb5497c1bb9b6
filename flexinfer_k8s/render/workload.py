"""What a serving workload needs, read once from a Model or a ModelDeployment.

`workload_from_model` (v1alpha2) and `workload_from_model_deployment` (v1alpha1) turn
the two resources into one `Workload` value, so every backend renders both the same
way. A value the renderer cannot use raises `InvalidFieldError` naming the field and
the value. Pure: JSON in, frozen values out; no client, no clock.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from flexinfer_core import InvalidFieldError, Policy, parse_duration
from flexinfer_k8s.render.source import Source, parse_source
from flexinfer_kube.objects import JSON, get_path, name_of, namespace_of
from flexinfer_kube.resources import MODEL_DEPLOYMENTS, MODELS

Pairs = tuple[tuple[str, str], ...]

MAX_EXTRA_ARGS = 32
DEFAULT_COLD_START_SECONDS = 60
DEFAULT_BACKEND_CACHE_SIZE = "50Gi"
ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef")


class Kind(enum.StrEnum):
    MODEL = "Model"
    MODEL_DEPLOYMENT = "ModelDeployment"


class Vendor(enum.StrEnum):
    AMD = "amd"
    NVIDIA = "nvidia"
    CPU = "cpu"

    @property
    def resource(self) -> str | None:
        """The extended resource a pod requests for its GPUs (None on CPU)."""
        return {"amd": "amd.com/gpu", "nvidia": "nvidia.com/gpu"}.get(self.value)


GPU_RESOURCES = frozenset({"amd.com/gpu", "nvidia.com/gpu"})


@attrs.frozen
class HealthCheck:
    """ModelDeployment `healthCheck`: readiness and liveness both use it."""

    initial_delay_seconds: int = 120
    period_seconds: int = 30
    timeout_seconds: int = 10
    failure_threshold: int = 3


@attrs.frozen
class MlcOptions:
    mode: str = "local"
    model_lib_path: str = ""
    gpu_memory_bytes: int | None = None
    jit_policy: str = ""
    prefill_chunk_size: int | None = None
    max_total_seq_length: int | None = None
    max_num_sequence: int | None = None
    gpu_memory_utilization: str = ""


@attrs.frozen
class VllmOptions:
    gpu_memory_utilization: str = ""
    max_model_len: int | None = None
    max_num_seqs: int | None = None


@attrs.frozen
class LlamaCppOptions:
    ctx_size: int = 4096
    n_gpu_layers: int = 999


@attrs.frozen
class BackendCacheOptions:
    """`spec.backendCache`: the claim a backend that fetches or compiles its model keeps
    its files in (`render.backend_cache`)."""

    enabled: bool = True
    size: str = DEFAULT_BACKEND_CACHE_SIZE
    storage_class: str = ""


@attrs.frozen
class Workload:
    """One Model or ModelDeployment, as the renderer needs it."""

    kind: Kind
    name: str
    namespace: str
    uid: str
    api_version: str
    backend: str
    model: str
    """The model as written (`spec.source` or `spec.model`)."""
    source: Source | None
    """`model` parsed, when it is a source URL (a ModelDeployment may name a model id)."""
    image: str = ""
    vendor: Vendor = Vendor.AMD
    gpu_count: int = 1
    requests: Pairs = ()
    limits: Pairs = ()
    node_selector: Pairs = ()
    tolerations: tuple[JSON, ...] = ()
    env: tuple[JSON, ...] = ()
    """`spec.env` as Kubernetes EnvVars: `{name, value}` or `{name, valueFrom}`."""
    pod_labels: Pairs = ()
    pod_annotations: Pairs = ()
    shm_size: str = ""
    extra_args: tuple[str, ...] = ()
    group: str = ""
    cache_ref: str = ""
    cache_strategy: str = ""
    cold_start_seconds: int = DEFAULT_COLD_START_SECONDS
    drain_seconds: int = 0
    """A shared-group Model's `spec.gpu.drainTimeout` (docs/election.md 1.6), whole
    seconds rounded up; 0 for everything that does not drain."""
    health_check: HealthCheck | None = None
    mlc: MlcOptions = MlcOptions()
    vllm: VllmOptions = VllmOptions()
    llamacpp: LlamaCppOptions = LlamaCppOptions()
    backend_cache: BackendCacheOptions = BackendCacheOptions()

    @property
    def model_field(self) -> str:
        """The field that names the model: what a message about it must point at."""
        return "spec.source" if self.kind is Kind.MODEL else "spec.model"


def _pairs(value: Any, *, field: str) -> Pairs:
    if value in (None, ""):
        return ()
    if not isinstance(value, Mapping):
        raise InvalidFieldError(field, value, "must be a map of strings")
    return tuple(sorted((str(k), str(v)) for k, v in value.items()))


def _int(value: Any, default: int | None, *, field: str) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFieldError(field, value, "must be an integer")
    return value


def _required_int(value: Any, default: int, *, field: str) -> int:
    number = _int(value, default, field=field)
    return default if number is None else number


def _env(value: Any, *, field: str) -> tuple[JSON, ...]:
    if value in (None, ""):
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise InvalidFieldError(field, value, "must be a list of {name, value or valueFrom}")
    found: list[JSON] = []
    for index, item in enumerate(value):
        name = get_path(item, "name")
        if not isinstance(item, Mapping) or not name:
            raise InvalidFieldError(f"{field}[{index}]", item, "must have a name")
        source = item.get("valueFrom")
        if source is None:
            found.append({"name": str(name), "value": str(item.get("value") or "")})
            continue
        # The schema says the same; a resource stored before it said so still gets a
        # message rather than a pod the API server refuses.
        kinds = [k for k in ENV_SOURCES if isinstance(source, Mapping) and source.get(k)]
        if len(kinds) != 1 or item.get("value") not in (None, ""):
            raise InvalidFieldError(
                f"{field}[{index}].valueFrom",
                source,
                "must hold exactly one of secretKeyRef, configMapKeyRef, fieldRef, and no "
                "value beside it",
            )
        found.append({"name": str(name), "valueFrom": {kinds[0]: dict(source[kinds[0]])}})
    return tuple(found)


def _backend_cache(spec: Mapping[str, Any]) -> BackendCacheOptions:
    block = spec.get("backendCache") or {}
    if not isinstance(block, Mapping):
        raise InvalidFieldError("spec.backendCache", block, "must be an object")
    enabled = block.get("enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidFieldError("spec.backendCache.enabled", enabled, "must be true or false")
    return BackendCacheOptions(
        enabled=enabled,
        size=str(block.get("size") or DEFAULT_BACKEND_CACHE_SIZE),
        storage_class=str(block.get("storageClassName") or ""),
    )


def _args(value: Any, *, field: str) -> tuple[str, ...]:
    if value in (None, ""):
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise InvalidFieldError(field, value, "must be a list of strings")
    if len(value) > MAX_EXTRA_ARGS:
        raise InvalidFieldError(field, len(value), f"items: at most {MAX_EXTRA_ARGS}")
    return tuple(str(a) for a in value)


def _tolerations(value: Any, *, field: str) -> tuple[JSON, ...]:
    if value in (None, ""):
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise InvalidFieldError(field, value, "must be a list of tolerations")
    return tuple(dict(t) for t in value if isinstance(t, Mapping))


def _resources(value: Any, part: str, *, field: str) -> Pairs:
    return _pairs(get_path(value, part), field=f"{field}.{part}")


def _mlc(spec: Mapping[str, Any]) -> MlcOptions:
    mlc = spec.get("mlcllm") or {}
    overrides = mlc.get("overrides") or {}
    field = "spec.mlcllm"
    return MlcOptions(
        mode=str(mlc.get("mode") or "local"),
        model_lib_path=str(mlc.get("modelLibPath") or ""),
        gpu_memory_bytes=_int(mlc.get("gpuMemoryBytes"), None, field=f"{field}.gpuMemoryBytes"),
        jit_policy=str(mlc.get("jitPolicy") or ""),
        prefill_chunk_size=_int(
            overrides.get("prefillChunkSize"), None, field=f"{field}.overrides.prefillChunkSize"
        ),
        max_total_seq_length=_int(
            overrides.get("maxTotalSeqLength"), None, field=f"{field}.overrides.maxTotalSeqLength"
        ),
        max_num_sequence=_int(
            overrides.get("maxNumSequence"), None, field=f"{field}.overrides.maxNumSequence"
        ),
        gpu_memory_utilization=str(overrides.get("gpuMemoryUtilization") or ""),
    )


def _vllm(spec: Mapping[str, Any]) -> VllmOptions:
    vllm = spec.get("vllm") or {}
    return VllmOptions(
        gpu_memory_utilization=str(vllm.get("gpuMemoryUtilization") or ""),
        max_model_len=_int(vllm.get("maxModelLen"), None, field="spec.vllm.maxModelLen"),
        max_num_seqs=_int(vllm.get("maxNumSeqs"), None, field="spec.vllm.maxNumSeqs"),
    )


def _llamacpp(spec: Mapping[str, Any]) -> LlamaCppOptions:
    llama = spec.get("llamacpp") or {}
    return LlamaCppOptions(
        ctx_size=_required_int(llama.get("ctxSize"), 4096, field="spec.llamacpp.ctxSize"),
        n_gpu_layers=_required_int(llama.get("nGpuLayers"), 999, field="spec.llamacpp.nGpuLayers"),
    )


def _common(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The fields Models and ModelDeployments spell the same way."""
    spec = get_path(obj, "spec") or {}
    return {
        "name": name_of(obj),
        "namespace": namespace_of(obj) or "default",
        "uid": str(get_path(obj, "metadata", "uid") or ""),
        "backend": str(spec.get("backend") or ""),
        "image": str(spec.get("image") or ""),
        "node_selector": _pairs(spec.get("nodeSelector"), field="spec.nodeSelector"),
        "tolerations": _tolerations(spec.get("tolerations"), field="spec.tolerations"),
        "env": _env(spec.get("env"), field="spec.env"),
        "pod_labels": _pairs(spec.get("podLabels"), field="spec.podLabels"),
        "pod_annotations": _pairs(spec.get("podAnnotations"), field="spec.podAnnotations"),
        "shm_size": str(spec.get("shmSize") or ""),
        "extra_args": _args(spec.get("extraArgs"), field="spec.extraArgs"),
        "mlc": _mlc(spec),
        "vllm": _vllm(spec),
        "llamacpp": _llamacpp(spec),
        "backend_cache": _backend_cache(spec),
    }


def workload_from_model(model: Mapping[str, Any]) -> Workload:
    """A v1alpha2 Model."""
    spec = get_path(model, "spec") or {}
    gpu = spec.get("gpu") or {}
    cache = spec.get("cache") or {}
    text = str(spec.get("source") or "")
    cold_start = get_path(spec, "serverless", "coldStartTimeout")
    seconds = (
        DEFAULT_COLD_START_SECONDS
        if cold_start in (None, "")
        else int(
            parse_duration(
                str(cold_start), field="spec.serverless.coldStartTimeout"
            ).total_seconds()
        )
    )
    try:
        vendor = Vendor(str(gpu.get("vendor") or "amd"))
    except ValueError:
        raise InvalidFieldError(
            "spec.gpu.vendor", gpu.get("vendor"), "must be amd, nvidia or cpu"
        ) from None
    return Workload(
        kind=Kind.MODEL,
        api_version=MODELS.api_version,
        model=text,
        source=parse_source(text, field="spec.source"),
        vendor=vendor,
        gpu_count=_required_int(gpu.get("count"), 1, field="spec.gpu.count"),
        requests=_resources(spec.get("resources"), "requests", field="spec.resources"),
        limits=_resources(spec.get("resources"), "limits", field="spec.resources"),
        group=str(gpu.get("shared") or ""),
        cache_ref=str(cache.get("modelCacheRef") or ""),
        cache_strategy=str(cache.get("strategy") or ""),
        cold_start_seconds=max(1, seconds),
        drain_seconds=_drain_seconds(gpu) if gpu.get("shared") else 0,
        **_common(model),
    )


def _drain_seconds(gpu: Mapping[str, Any]) -> int:
    text = gpu.get("drainTimeout")
    if text in (None, ""):
        return math.ceil(Policy.DRAIN_TIMEOUT.total_seconds())
    return math.ceil(parse_duration(str(text), field="spec.gpu.drainTimeout").total_seconds())


def workload_from_model_deployment(
    md: Mapping[str, Any], *, group: str = "", group_node_selector: Pairs = ()
) -> Workload:
    """A v1alpha1 ModelDeployment; its GPUs and vendor follow `spec.resources`.

    `group` is the GPUGroup it belongs to (for the group label its pods carry), and
    `group_node_selector` that group's `spec.nodeSelector`, which its pods get on top of
    their own (a key both set differently is refused: the pod could run nowhere).
    """
    spec = get_path(md, "spec") or {}
    common = _common(md)
    selector = dict(common["node_selector"])
    for key, value in group_node_selector:
        if key in selector and selector[key] != value:
            raise InvalidFieldError(
                f"spec.nodeSelector[{key}]",
                selector[key],
                f"conflicts with GPUGroup {group}'s spec.nodeSelector {key}={value}: a member's "
                "pods run where its group says",
            )
        selector[key] = value
    common["node_selector"] = tuple(sorted(selector.items()))
    text = str(spec.get("model") or "")
    requests = _resources(spec.get("resources"), "requests", field="spec.resources")
    limits = _resources(spec.get("resources"), "limits", field="spec.resources")
    vendor, count = _md_gpus(dict(requests), dict(limits))
    health = spec.get("healthCheck") or {}
    field = "spec.healthCheck"
    source = parse_source(text, field="spec.model") if "://" in text else None
    return Workload(
        kind=Kind.MODEL_DEPLOYMENT,
        api_version=MODEL_DEPLOYMENTS.api_version,
        model=text,
        source=source,
        vendor=vendor,
        gpu_count=count,
        requests=tuple((k, v) for k, v in requests if k not in GPU_RESOURCES),
        limits=tuple((k, v) for k, v in limits if k not in GPU_RESOURCES),
        group=group or str(spec.get("gpuGroupRef") or ""),
        cache_ref=str(spec.get("modelCacheRef") or ""),
        cold_start_seconds=_required_int(
            spec.get("coldStartTimeoutSeconds"),
            DEFAULT_COLD_START_SECONDS,
            field="spec.coldStartTimeoutSeconds",
        ),
        health_check=HealthCheck(
            initial_delay_seconds=_required_int(
                health.get("initialDelaySeconds"), 120, field=f"{field}.initialDelaySeconds"
            ),
            period_seconds=_required_int(
                health.get("periodSeconds"), 30, field=f"{field}.periodSeconds"
            ),
            timeout_seconds=_required_int(
                health.get("timeoutSeconds"), 10, field=f"{field}.timeoutSeconds"
            ),
            failure_threshold=_required_int(
                health.get("failureThreshold"), 3, field=f"{field}.failureThreshold"
            ),
        ),
        **common,
    )


def _md_gpus(requests: Mapping[str, str], limits: Mapping[str, str]) -> tuple[Vendor, int]:
    """A ModelDeployment asks for `amd.com/gpu` or `nvidia.com/gpu` in its resources;
    nothing said means one AMD GPU (never NVIDIA by default), `"0"` means a CPU server."""
    for vendor in (Vendor.AMD, Vendor.NVIDIA):
        key = vendor.resource or ""
        text = limits.get(key) or requests.get(key)
        if text is None:
            continue
        try:
            count = int(str(text))
        except ValueError:
            raise InvalidFieldError(
                f"spec.resources.limits[{key}]", text, "must be a whole number of GPUs"
            ) from None
        if not 0 <= count <= 8:
            raise InvalidFieldError(f"spec.resources.limits[{key}]", text, "must be 0 to 8")
        return (vendor, count) if count else (Vendor.CPU, 0)
    return Vendor.AMD, 1
