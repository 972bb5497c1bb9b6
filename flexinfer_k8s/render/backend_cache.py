"""A Model's or ModelDeployment's own backend cache: the claim a backend that fetches
or compiles its model keeps its files in.

vLLM, llama.cpp (`--hf-repo`) and mlc-llm (`HF://`) download a model they are given by
name, Ollama pulls one, and mlc-llm compiles a model library when it is given none. A
swap deletes the pod, so an `emptyDir` would make every swap-in download (or compile)
again: the pod mounts `<name>-backend-cache` instead, a ReadWriteOnce claim of
`spec.backendCache.size` (default 50Gi, never resized) owned by the resource, so it
lives exactly as long as the resource. It exists only while the rendered pod mounts it
(the reconcile deletes it when a render no longer does); `spec.backendCache.enabled:
false` gives the pod an `emptyDir` instead. ReadWriteOnce because one pod of a model
runs at a time (strategy Recreate); a ModelDeployment with several replicas puts them on
the claim's node. Pure: values in, manifests out.
"""

from __future__ import annotations

from flexinfer_k8s.render.backend import BACKEND_CACHE_DIR
from flexinfer_k8s.render.workload import Workload
from flexinfer_kube.objects import JSON

VOLUME = "backend-cache"
SUFFIX = "-backend-cache"


def claim_name(workload: Workload) -> str:
    return f"{workload.name}{SUFFIX}"


def mount() -> JSON:
    return {"name": VOLUME, "mountPath": BACKEND_CACHE_DIR}


def volume(workload: Workload) -> JSON:
    if not workload.backend_cache.enabled:
        return {"name": VOLUME, "emptyDir": {}}
    return {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim_name(workload)}}


def claim_manifest(workload: Workload, *, labels: dict[str, str], owner: JSON) -> JSON | None:
    """The claim to create (None when `spec.backendCache.enabled` is false)."""
    options = workload.backend_cache
    if not options.enabled:
        return None
    spec: JSON = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": options.size}},
    }
    if options.storage_class:
        spec["storageClassName"] = options.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(workload),
            "namespace": workload.namespace,
            "labels": {**labels, "app.kubernetes.io/component": "backend-cache"},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }
