"""The training Job of a ModelCache's `spec.finetune`.

The trainer is an image (`spec.finetune.image`, else the controller's
`--finetune-image`) that reads its settings from the environment
(docs/caches/finetune.md lists the contract): mode, dataset, epochs, batch size,
learning rate and maximum sequence length, the base model in the cache mounted at
/cache, and the directory to write its result to. GPUs per vendor
(`spec.finetune.gpu`), CPU and memory (`spec.finetune.resources`, else
`FINETUNE_RESOURCES`), the cache's node and tolerations (`render.cache.job_placement`),
`activeDeadlineSeconds` from `timeoutSeconds`, no retries (a failed run is reported, not
repeated on a card serving needs back). A copy flexinfer adopted (a user's directory)
is never written, so it is never finetuned. The GPU lease around it is
`reconcile_cache`'s. Pure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.cache import (
    CacheSpec,
    cache_labels,
    cache_model_path,
    job_placement,
    owner_reference,
    resources_from,
)
from flexinfer_k8s.render.local_volume import HostVolume, host_volume
from flexinfer_k8s.render.policy import AdminPolicy
from flexinfer_k8s.render.tolerations import DEFAULT_ADMIN_POLICY
from flexinfer_k8s.render.workload import Vendor
from flexinfer_kube.objects import JSON, get_path

CACHE_MOUNT = "/cache"
OUTPUT_DIR = f"{CACHE_MOUNT}/finetune-output"
DEFAULT_TIMEOUT_SECONDS = 21600
FINETUNE_RESOURCES: JSON = {
    "requests": {"cpu": "2", "memory": "8Gi"},
    "limits": {"memory": "32Gi"},
}
"""The trainer's CPU and memory unless `spec.finetune.resources` says: a QLoRA run of a
7–8B model with a few data-loader workers; the memory limit keeps a runaway trainer from
taking the node's serving pods down with it."""


def job_name(cache_name: str) -> str:
    return f"{cache_name}-finetune"


def finetune_volumes(
    cache: CacheSpec, obj: Mapping[str, Any], policy: AdminPolicy
) -> tuple[HostVolume, ...]:
    """The host directories the training Job mounts (through claims): the cache's node
    root, a `file://` dataset's."""
    found = [] if cache.claim else [cache.models_volume(policy)]
    dataset = str(get_path(obj, "spec", "finetune", "dataset") or "")
    if dataset.startswith("file:///"):
        host = posixpath.normpath(dataset.removeprefix("file://"))
        found.append(
            host_volume(
                host, namespace=cache.namespace, selector=cache.node_selector, policy=policy,
            field="spec.finetune.dataset",
            )[0]
        )
    return tuple(found)


def finetune_job(
    cache: CacheSpec,
    obj: Mapping[str, Any],
    *,
    default_image: str,
    video_gid: int = 44,
    render_gid: int = 109,
    policy: AdminPolicy = DEFAULT_ADMIN_POLICY,
) -> JSON:
    """The Job for `spec.finetune` of the ModelCache `obj` (parsed as `cache`); it
    tolerates the GPU nodes' taints (`render.tolerations`)."""
    finetune = get_path(obj, "spec", "finetune") or {}
    if cache.adopted:
        raise InvalidFieldError(
            "spec.finetune",
            "set",
            f"cannot run over {cache.path}: flexinfer adopted that directory (files it did "
            "not write) and never writes there, and a finetune writes finetune-output into "
            "it; point spec.modelPath (or the cache) at an empty directory",
        )
    image = str(finetune.get("image") or default_image)
    if not image:
        raise InvalidFieldError(
            "spec.finetune.image",
            "",
            "is required: flexinfer ships no trainer; set spec.finetune.image (or the "
            "controller's --finetune-image) to an image that follows docs/caches/finetune.md",
        )
    gpu = finetune.get("gpu") or {}
    try:
        vendor = Vendor(str(gpu.get("vendor") or "amd"))
    except ValueError:
        raise InvalidFieldError(
            "spec.finetune.gpu.vendor", gpu.get("vendor"), "must be amd or nvidia"
        ) from None
    count = gpu.get("count", 1)
    resources = resources_from(
        finetune.get("resources"), field="spec.finetune.resources", defaults=FINETUNE_RESOURCES
    )
    gpus = bool(vendor.resource and count)
    if gpus:
        for section in ("requests", "limits"):
            resources.setdefault(section, {})[vendor.resource] = str(count)
    if cache.claim:
        volume: JSON = {"name": "cache", "persistentVolumeClaim": {"claimName": cache.claim}}
        mount: JSON = {"name": "cache", "mountPath": CACHE_MOUNT, "subPath": cache.content_dir}
    else:
        volume = cache.models_volume(policy).volume("cache")
        mount = {"name": "cache", "mountPath": CACHE_MOUNT, "subPath": cache.name}
    volumes, mounts = [volume], [mount]
    dataset = str(finetune.get("dataset") or "")
    if dataset.startswith("file:///"):
        host = posixpath.normpath(dataset.removeprefix("file://"))
        inside = f"/dataset/{posixpath.basename(host)}"
        data_volume, sub_path = host_volume(
            host, namespace=cache.namespace, selector=cache.node_selector, policy=policy,
            field="spec.finetune.dataset",
        )
        # On the cache's own claim (the namespace's node root): one volume per claim.
        same = not cache.claim and data_volume == cache.models_volume(policy)
        if not same:
            volumes.append(data_volume.volume("dataset", read_only=True))
        mounts.append(
            {"name": "cache" if same else "dataset", "mountPath": inside, "readOnly": True,
             **({"subPath": sub_path} if sub_path else {})}
        )
        dataset = inside
    base = cache_model_path(cache).replace(cache.serving_mount, CACHE_MOUNT, 1)
    env = {
        "FLEXINFER_FINETUNE_MODE": str(finetune.get("mode") or "qlora"),
        "FLEXINFER_BASE_MODEL": base,
        "FLEXINFER_DATASET": dataset,
        "FLEXINFER_EPOCHS": str(finetune.get("epochs") or 3),
        "FLEXINFER_BATCH_SIZE": str(finetune.get("batchSize") or 4),
        "FLEXINFER_LEARNING_RATE": str(finetune.get("learningRate") or "2e-4"),
        "FLEXINFER_MAX_SEQ_LEN": str(finetune.get("maxSeqLen") or 2048),
        "FLEXINFER_OUTPUT_DIR": OUTPUT_DIR,
    }
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    container: JSON = {
        "name": "finetune",
        "image": image,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if resources:
        container["resources"] = resources
    pod: JSON = {"restartPolicy": "Never", "containers": [container], "volumes": volumes}
    if vendor is Vendor.AMD and gpus:
        pod["securityContext"] = {"supplementalGroups": [video_gid, render_gid]}
    pod.update(job_placement(cache, policy, gpu=bool(resources)))
    labels = {**cache_labels(cache), "app.kubernetes.io/component": "finetune"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(cache.name),
            "namespace": cache.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(cache)],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(finetune.get("timeoutSeconds") or DEFAULT_TIMEOUT_SECONDS),
            "template": {
                "metadata": {"labels": labels, "annotations": dict(cache.pod_annotations)},
                "spec": pod,
            },
        },
    }
