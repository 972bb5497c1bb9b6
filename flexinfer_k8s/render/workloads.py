"""A Model or ModelDeployment as a Deployment and a Service.

Every backend gets the same frame: a Deployment with strategy Recreate (a restart
never puts two pods of a model on one card), owned by the resource (controller
reference, so deleting it collects them), labelled with the `app.kubernetes.io/*`
set plus `ai.flexinfer/model`, `ai.flexinfer/kind`, `ai.flexinfer/backend` (and
`ai.flexinfer/group` on pods of a group member, so a member's pods are found even
after the member is gone); the server container on port 8000 named `http` with the
backend's probes, GPUs as requests = limits (or, for a member of a group whose members
share one card, a reference to the group's ResourceClaim: `render.gpu_claim`), the ROCm
device groups, an in-memory /dev/shm, and the model's volumes; a ClusterIP Service on
port 8000.

`spec.replicas` is not rendered: replicas belong to the election. The controller
creates a Deployment with `replicas: 0` and hands the field to its scale writes
(`flexinfer_k8s.apply_workload`). Pure: values in, manifests out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from flexinfer_core import InvalidFieldError
from flexinfer_core.vram import QWEN_7B_KV_BYTES_PER_TOKEN, kv_cache_bytes, mlc_mode_settings
from flexinfer_k8s.render import backend_cache, gpu_claim
from flexinfer_k8s.render.backend import PORT, Backend, ModelLocation, ServerPlan
from flexinfer_k8s.render.cache import CacheImages, CacheSpec
from flexinfer_k8s.render.llama_cpp import LlamaCpp
from flexinfer_k8s.render.local_volume import HostVolume
from flexinfer_k8s.render.mlc_llm import MlcLlm
from flexinfer_k8s.render.model_files import model_location
from flexinfer_k8s.render.network_policy import network_policy
from flexinfer_k8s.render.ollama import Ollama
from flexinfer_k8s.render.pod_security import NON_ROOT_BACKENDS, secure_pod
from flexinfer_k8s.render.policy import AdminPolicy
from flexinfer_k8s.render.tenant_policy import check_workload
from flexinfer_k8s.render.tolerations import tolerate_gpu_nodes
from flexinfer_k8s.render.vllm import Vllm
from flexinfer_k8s.render.workload import Kind, Vendor, Workload
from flexinfer_kube.objects import JSON

BACKENDS: Mapping[str, Backend] = {b.name: b for b in (MlcLlm(), Vllm(), LlamaCpp(), Ollama())}
MODEL_LABEL = "ai.flexinfer/model"
KIND_LABEL = "ai.flexinfer/kind"
BACKEND_LABEL = "ai.flexinfer/backend"
GROUP_LABEL = "ai.flexinfer/group"
MANAGED_BY = {"app.kubernetes.io/managed-by": "flexinfer"}
# How often a starting server is asked whether it is up: a swap's new holder is seen
# Ready at the first probe after its server is, so this is added to every swap (half of
# it on average). The probe is one local HTTP request, and only while starting.
STARTUP_PERIOD_SECONDS = 2
FIRST_START_FLOOR_SECONDS = 1800
"""The least a startup probe allows a server that downloads its model or compiles its
library at start (30 min: 8 GB at 5 MB/s); `coldStartTimeout` raises it, never lowers
it, because a probe that kills a download makes every restart start it again."""
ASSUMED_CONTEXT_WINDOW = 32768
"""mlc-llm's mode defaults need the model's context window, which the resource does
not give; the VRAM estimate assumes a 32k model unless `maxTotalSeqLength` is set."""


@attrs.frozen
class RenderSettings:
    """Controller configuration the renderer reads (flags of `python -m flexinfer_k8s`)."""

    images: Mapping[tuple[str, Vendor | None], str] = attrs.field(factory=dict)
    """`--image BACKEND[:VENDOR]=IMAGE` overrides of the backends' default images; no
    vendor (None) means every vendor without one of its own."""
    video_gid: int = 44
    render_gid: int = 109
    cache_images: CacheImages = attrs.field(factory=CacheImages)
    policy: AdminPolicy = attrs.field(factory=AdminPolicy)
    """The administrator's policy (`--policy FILE`; `render.policy`)."""
    finetune_image: str = ""
    """`--finetune-image`: only for `rendered_images` (the Job's default is
    `reconcile_cache`'s)."""
    controller_namespace: str = "flexinfer-system"
    """The controller's own namespace (`--leader-election-namespace`, else `POD_NAMESPACE`):
    where the Jobs that mount host paths run (`render.local_volume`)."""
    gpu_device_class: str = ""
    """`--gpu-device-class`: the DeviceClass of the cluster's Dynamic Resource Allocation
    driver for its AMD GPUs (`gpu.amd.com` with AMD's driver); empty: none, and a
    budgeted group runs one member at a time (`render.gpu_claim`)."""

    def rendered_images(self) -> frozenset[str]:
        """Every image flexinfer renders unless a resource names one: the backends'
        (and `--image`'s), the cache helpers' and the trainer's. The policy allows
        their repositories."""
        backends = {i for b in BACKENDS.values() for i in b.default_images.values()}
        helpers = {str(getattr(self.cache_images, f)) for f in attrs.fields_dict(CacheImages)}
        configured = {*self.images.values(), self.finetune_image} - {""}
        return frozenset(backends | helpers | configured)

    def image_for(self, backend: Backend, vendor: Vendor) -> str:
        return (
            self.images.get((backend.name, vendor))
            or self.images.get((backend.name, None))
            or backend.default_images.get(vendor, "")
        )


@attrs.frozen
class VramCheck:
    """mlc-llm's KV cache against `gpuMemoryBytes`: a warning, never a block."""

    fits: bool
    kv_cache_bytes: int
    budget_bytes: int
    message: str


@attrs.frozen
class RenderedWorkload:
    deployment: JSON
    service: JSON
    network_policy: JSON
    """Only the administrator's peers (the proxy) reach port 8000 (`render.network_policy`)."""
    served_name: str
    endpoint: str
    """`http://<service>.<namespace>.svc:8000/v1`: for people; the proxy finds the
    Service by its labels."""
    vram: VramCheck | None
    backend_cache_claim: JSON | None = None
    """The claim the pod mounts for the backend's downloads or compiled libraries
    (`render.backend_cache`), to create when missing; None when it mounts none."""
    host_volumes: tuple[HostVolume, ...] = ()
    """Host directories (a `file://` source) the pod reaches through claims on `local`
    volumes, to create when missing (`render.local_volume`)."""
    gpu_claim: JSON | None = None
    """The group's shared ResourceClaim the pod references instead of requesting a GPU
    (`render.gpu_claim`), to apply; None when the pod requests its GPU itself."""


def selector_labels(kind: Kind, name: str) -> dict[str, str]:
    return {MODEL_LABEL: name, KIND_LABEL: kind.value}


def workload_labels(workload: Workload) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": workload.backend,
        "app.kubernetes.io/instance": workload.name,
        "app.kubernetes.io/component": "inference-server",
        "app.kubernetes.io/part-of": "flexinfer",
        **MANAGED_BY,
        **selector_labels(workload.kind, workload.name),
        BACKEND_LABEL: workload.backend,
    }


def owner_reference(workload: Workload) -> JSON:
    return {
        "apiVersion": workload.api_version,
        "kind": workload.kind.value,
        "name": workload.name,
        "uid": workload.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def backend_of(workload: Workload) -> Backend:
    backend = BACKENDS.get(workload.backend)
    if backend is None:
        raise InvalidFieldError(
            "spec.backend", workload.backend, f"must be one of {', '.join(sorted(BACKENDS))}"
        )
    return backend


def _env(plan: ServerPlan, workload: Workload) -> list[JSON]:
    # The user's entry (a value or a valueFrom) wins over the backend's for the same
    # name; names stay unique (server-side apply keys env by name).
    merged: dict[str, JSON] = {k: {"name": k, "value": v} for k, v in plan.env}
    merged.update({str(e["name"]): dict(e) for e in workload.env})
    return list(merged.values())


def _resources(workload: Workload, *, shares_card: bool) -> JSON:
    requests = dict(workload.requests)
    limits = dict(workload.limits)
    gpu = workload.vendor.resource
    if gpu and workload.gpu_count > 0 and not shares_card:
        # Extended resources must be requested and limited alike.
        requests[gpu] = limits[gpu] = str(workload.gpu_count)
    resources: JSON = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if shares_card:
        resources["claims"] = gpu_claim.container_claims()
    return resources


def startup_allowance(workload: Workload, *, fetches: bool) -> int:
    """Seconds the startup probe lets the server take before it first answers: the
    cold-start timeout, at least `FIRST_START_FLOOR_SECONDS` for a server that downloads
    or compiles at start (`fetches`)."""
    seconds = workload.cold_start_seconds
    return max(seconds, FIRST_START_FLOOR_SECONDS) if fetches else seconds


def probes(workload: Workload, backend: Backend, *, fetches: bool) -> JSON:
    """Startup, readiness and liveness probes on the backend's health path.

    The startup probe allows the whole cold start (`startup_allowance`: failureThreshold
    × period ≥ the allowance); the kubelet runs readiness and liveness only after it
    succeeds, so neither can kill a slow load. A ModelDeployment's `healthCheck` sets
    its liveness probe (and its readiness probe's period, timeout and threshold)."""
    check = {"httpGet": {"path": backend.health_path, "port": "http"}}
    period = STARTUP_PERIOD_SECONDS
    allowance = startup_allowance(workload, fetches=fetches)
    health = workload.health_check
    startup = {
        **check,
        "periodSeconds": period,
        "timeoutSeconds": health.timeout_seconds if health is not None else 5,
        "failureThreshold": max(1, math.ceil(allowance / period)),
    }
    if health is not None:
        return {
            "startupProbe": startup,
            "readinessProbe": {
                **check,
                "periodSeconds": health.period_seconds,
                "timeoutSeconds": health.timeout_seconds,
                "failureThreshold": health.failure_threshold,
            },
            "livenessProbe": {
                **check,
                "initialDelaySeconds": health.initial_delay_seconds,
                "periodSeconds": health.period_seconds,
                "timeoutSeconds": health.timeout_seconds,
                "failureThreshold": health.failure_threshold,
            },
        }
    return {
        "startupProbe": startup,
        "readinessProbe": {
            **check,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            **check,
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 3,
        },
    }


def _node_selector(workload: Workload, model: ModelLocation) -> dict[str, str]:
    selector = dict(workload.node_selector)
    for key, value in model.node_selector:
        if key in selector and selector[key] != value:
            raise InvalidFieldError(
                f"spec.nodeSelector[{key}]",
                selector[key],
                f"conflicts with ModelCache {workload.cache_ref}'s {key}={value}: the cache's "
                "copy exists only on that node",
            )
        selector[key] = value
    return selector


def vram_check(workload: Workload) -> VramCheck | None:
    """None when there is nothing to check: another backend, no `gpuMemoryBytes`, or
    server mode without both KV overrides (mlc-llm then sizes its KV cache to the card)."""
    mlc = workload.mlc
    if workload.backend != MlcLlm.name or mlc.gpu_memory_bytes is None:
        return None
    if mlc.mode == "server" and (mlc.max_num_sequence is None or mlc.max_total_seq_length is None):
        return None
    settings = mlc_mode_settings(
        mlc.mode,
        context_window=mlc.max_total_seq_length or ASSUMED_CONTEXT_WINDOW,
        max_num_sequence=mlc.max_num_sequence,
        max_total_seq_length=mlc.max_total_seq_length,
    )
    kv = kv_cache_bytes(
        max_num_sequence=settings.max_num_sequence,
        max_total_seq_length=settings.max_total_seq_length,
        bytes_per_token=QWEN_7B_KV_BYTES_PER_TOKEN,
    )
    utilization = float(mlc.gpu_memory_utilization) if mlc.gpu_memory_utilization else 1.0
    budget = int(mlc.gpu_memory_bytes * utilization)
    estimate = (
        f"KV cache ≈ {kv / 1e9:.1f} GB ({settings.max_num_sequence} sequences × "
        f"{settings.max_total_seq_length} tokens × {QWEN_7B_KV_BYTES_PER_TOKEN // 1000} kB per "
        f"token, a 7B Qwen's)"
    )
    budget_text = f"gpuMemoryBytes {mlc.gpu_memory_bytes / 1e9:.1f} GB" + (
        f" × {mlc.gpu_memory_utilization}" if mlc.gpu_memory_utilization else ""
    )
    if kv <= budget:
        message = f"{estimate} fits {budget_text}; weights and buffers come on top"
    else:
        message = (
            f"{estimate} alone exceeds {budget_text}: lower maxNumSequence or "
            "maxTotalSeqLength, or raise gpuMemoryBytes"
        )
    return VramCheck(fits=kv <= budget, kv_cache_bytes=kv, budget_bytes=budget, message=message)


STOP_MARGIN_SECONDS = 30
"""Kubernetes' default `terminationGracePeriodSeconds`: what every pod had before
draining, kept on top of the drain timeout."""


def render_workload(
    workload: Workload,
    *,
    cache: CacheSpec | None,
    settings: RenderSettings,
    shared_card: gpu_claim.SharedCard | None = None,
) -> RenderedWorkload:
    """The Deployment (without `replicas`), Service and NetworkPolicy of one Model or
    ModelDeployment; `InvalidFieldError` for a field that cannot work or that the
    administrator's policy does not allow (`render.tenant_policy`).

    `shared_card` is given for a member of a group with a VRAM budget: when the cluster
    has a DRA device class (`settings.gpu_device_class`) and the member is on one AMD
    GPU, its pod references the group's ResourceClaim (`gpu_claim`, returned to apply)
    instead of requesting `amd.com/gpu`; otherwise it is rendered exactly as without."""
    check_workload(workload, settings.policy, images=settings.rendered_images())
    shares_card = shared_card is not None and not gpu_claim.sharing_problem(
        workload, settings.gpu_device_class
    )
    backend = backend_of(workload)
    model = model_location(workload, cache, settings.cache_images, settings.policy)
    plan = backend.plan(workload, model)
    image = workload.image or settings.image_for(backend, workload.vendor)
    if not image:
        raise InvalidFieldError(
            "spec.image",
            "",
            f"is required: flexinfer has no default {backend.name} image for "
            f"{workload.vendor.value} GPUs (set spec.image, or the controller's "
            f"--image {backend.name}={{image}}; see docs/backends/{backend.name}.md)",
        )
    labels = workload_labels(workload)
    pod_labels = {**dict(workload.pod_labels), **labels}
    if workload.group:
        pod_labels[GROUP_LABEL] = workload.group
    container: JSON = {
        "name": "server",
        "image": image,
        "args": list(plan.args),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        # A crash says why in the pod's status, not only in logs that go with the pod.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": _env(plan, workload),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            *model.mounts,
            *plan.mounts,
            *((backend_cache.mount(),) if plan.backend_cache else ()),
        ],
        **probes(workload, backend, fetches=plan.backend_cache),
    }
    if plan.command:
        container["command"] = list(plan.command)
    resources = _resources(workload, shares_card=shares_card)
    if resources:
        container["resources"] = resources
    init_containers = [
        {"image": image, **c} if "image" not in c else c
        for c in (*model.init_containers, *plan.init_containers)
    ]
    pod: JSON = {
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [
            {
                "name": "dshm",
                "emptyDir": {
                    "medium": "Memory",
                    "sizeLimit": workload.shm_size or backend.shm_size,
                },
            },
            *model.volumes,
            *plan.volumes,
            *((backend_cache.volume(workload),) if plan.backend_cache else ()),
        ],
    }
    if init_containers:
        pod["initContainers"] = init_containers
    if shares_card:
        pod["resourceClaims"] = gpu_claim.pod_claims(workload)
    if workload.drain_seconds > 0:
        # A Model scaled down at its drain deadline may still be answering: its server
        # gets the drain timeout on top of Kubernetes' usual stop margin before SIGKILL
        # (docs/election.md 1.6).
        pod["terminationGracePeriodSeconds"] = workload.drain_seconds + STOP_MARGIN_SECONDS
    selector = _node_selector(workload, model)
    if selector:
        pod["nodeSelector"] = selector
    if workload.tolerations:
        pod["tolerations"] = [dict(t) for t in workload.tolerations]
    if workload.vendor is Vendor.AMD and workload.gpu_count > 0:
        # /dev/kfd and /dev/dri/renderD* belong to these groups on the host.
        pod["securityContext"] = {"supplementalGroups": [settings.video_gid, settings.render_gid]}
    tolerate_gpu_nodes(pod, settings.policy)
    pod = secure_pod(
        pod,
        policy=settings.policy,
        writers=[c["name"] for c in init_containers],
        non_root=["server"] if backend.name in NON_ROOT_BACKENDS else [],
    )
    meta = {
        "name": workload.name,
        "namespace": workload.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(workload)],
    }
    deployment: JSON = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector_labels(workload.kind, workload.name)},
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {"labels": pod_labels, "annotations": dict(workload.pod_annotations)},
                "spec": pod,
            },
        },
    }
    service: JSON = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(workload.kind, workload.name),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    claim = (
        backend_cache.claim_manifest(
            workload,
            labels={**MANAGED_BY, **selector_labels(workload.kind, workload.name)},
            owner=owner_reference(workload),
        )
        if plan.backend_cache
        else None
    )
    card_claim = (
        gpu_claim.claim_manifest(
            workload,
            shared_card,
            device_class=settings.gpu_device_class,
            labels={**MANAGED_BY, GROUP_LABEL: workload.group, KIND_LABEL: workload.kind.value},
        )
        if shares_card and shared_card is not None
        else None
    )
    return RenderedWorkload(
        deployment=deployment,
        service=service,
        network_policy=network_policy(
            name=workload.name,
            namespace=workload.namespace,
            labels=labels,
            selector=selector_labels(workload.kind, workload.name),
            owner=owner_reference(workload),
            policy=settings.policy,
        ),
        served_name=plan.served_name,
        endpoint=f"http://{workload.name}.{workload.namespace}.svc:{PORT}/v1",
        vram=vram_check(workload),
        backend_cache_claim=claim,
        host_volumes=model.host_volumes,
        gpu_claim=card_claim,
    )
