"""Whether what a tenant asks for stays inside the administrator's policy.

A tenant writes Models, ModelDeployments and ModelCaches; the controller turns them
into pods. Every field of those that could reach beyond the tenant's namespace is
checked here, before anything is rendered:

- host paths (`file://` sources, a finetune's `file:///` dataset): only under the
  policy's `hostPathPrefixes`, and under flexinfer's own cache roots only inside the
  tenant's namespace directory (another namespace's caches are not its to read);
  mounted with `type: File` or `type: Directory`, never a socket or a device;
- images (`spec.image`, `spec.downloadImage`, `spec.finetune.image`): the policy's
  `imagePrefixes`, or a repository flexinfer renders by default (a backend's, a
  helper's, or one the administrator named with `--image`);
- tolerations: only of the GPU nodes' taints the administrator listed, never an empty
  key (which tolerates every taint) nor a control-plane taint;
- nodeSelector keys: the policy's `nodeSelectorKeys`;
- pod labels and annotations: the policy's `podLabelKeys` / `podAnnotationKeys`, and
  never a key flexinfer or Kubernetes itself sets (`ai.flexinfer/*`,
  `app.kubernetes.io/*`, `*kubernetes.io/*`, `*k8s.io/*`).

Each check raises `InvalidFieldError` naming the field, the value and the rule, with the
policy field that would allow it; the reconcilers make that an `InvalidSpec` condition
and render nothing. Pure: values in, an exception or nothing out.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import attrs

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.cache import CacheSpec, Strategy, cache_from_k8s
from flexinfer_k8s.render.cache_dir import MEMORY_ROOT, NODE_MODELS_ROOT
from flexinfer_k8s.render.policy import (
    CONTROL_PLANE_NODE_LABELS,
    AdminPolicy,
    key_allowed,
    quantity_bytes,
)
from flexinfer_k8s.render.source import Scheme
from flexinfer_k8s.render.workload import Kind, Workload
from flexinfer_kube.objects import get_path

CACHE_ROOTS = (NODE_MODELS_ROOT, MEMORY_ROOT)
"""Where flexinfer keeps caches as `<root>/<namespace>/<cache>`."""
RESERVED_UNPREFIXED_LABELS = ("job-name", "controller-uid", "pod-template-hash")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_host_path(
    path: str, *, field: str, value: str, namespace: str, policy: AdminPolicy
) -> None:
    """`path` (normalized, absolute) may be mounted from the node for `namespace`."""
    if not any(_under(path, prefix) for prefix in policy.host_path_prefixes):
        raise InvalidFieldError(
            field,
            value,
            "is outside the host paths the administrator allows "
            f"({_listing(policy.host_path_prefixes)}; hostPathPrefixes of the controller's policy)",
        )
    for root in CACHE_ROOTS:
        own = f"{root}/{namespace}"
        if _under(path, root) and not _under(path, own):
            raise InvalidFieldError(
                field,
                value,
                f"is in flexinfer's cache directory {root} but not under {own}/: a "
                "namespace reads only its own caches there (use spec.modelCacheRef, or a "
                "file under your namespace's directory)",
            )


def image_repository(image: str) -> str:
    """An image reference's repository: no tag, no digest, Docker Hub's implicit
    `docker.io/` and `library/` spelled out (`busybox:1.36` → `docker.io/library/busybox`)."""
    ref = image.split("@", 1)[0]
    head, slash, last = ref.rpartition("/")
    ref = f"{head}{slash}{last.split(':', 1)[0]}"
    first, slash, rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        if first not in ("docker.io", "index.docker.io"):
            return ref
        ref = rest
    return f"docker.io/{ref}" if "/" in ref else f"docker.io/library/{ref}"


def image_allowed(image: str, policy: AdminPolicy, *, rendered: Collection[str]) -> bool:
    repository = image_repository(image)
    if any(image.startswith(p) or repository.startswith(p) for p in policy.image_prefixes):
        return True
    return repository in {image_repository(r) for r in rendered if r}


def check_image(image: str, *, field: str, policy: AdminPolicy, rendered: Collection[str]) -> None:
    if not image or image_allowed(image, policy, rendered=rendered):
        return
    repositories = sorted({image_repository(r) for r in rendered if r})
    raise InvalidFieldError(
        field,
        image,
        "is not an image the administrator allows: it must start with one of "
        f"{_listing(policy.image_prefixes)} (imagePrefixes of the controller's policy) or "
        f"come from a repository flexinfer renders by default ({', '.join(repositories)})",
    )


def check_tolerations(tolerations: Iterable[Mapping[str, Any]], policy: AdminPolicy) -> None:
    """Each toleration tolerates one of the GPU-node taints the administrator listed."""
    listed = ", ".join(str(t) for t in policy.gpu_node_taints) or "none"
    for index, toleration in enumerate(tolerations):
        field = f"spec.tolerations[{index}]"
        key = str(toleration.get("key") or "")
        operator = str(toleration.get("operator") or "Equal")
        value = str(toleration.get("value") or "")
        effect = str(toleration.get("effect") or "")
        if not key:
            raise InvalidFieldError(
                field, dict(toleration), "has no key: it would tolerate every taint of every node"
            )
        if key in CONTROL_PLANE_NODE_LABELS:
            raise InvalidFieldError(
                field, dict(toleration), "tolerates the control plane's taint: never allowed"
            )
        matches = [
            t
            for t in policy.gpu_node_taints
            if t.key == key
            and (not effect or effect == t.effect)
            and (
                (operator == "Exists" and not t.value) or (operator == "Equal" and value == t.value)
            )
        ]
        if not matches:
            raise InvalidFieldError(
                field,
                dict(toleration),
                f"tolerates a taint the administrator did not list as a GPU node's ({listed}; "
                "gpuNodeTaints of the controller's policy)",
            )


def check_node_selector(selector: Iterable[tuple[str, str]], policy: AdminPolicy) -> None:
    for key, value in selector:
        if not key_allowed(key, policy.node_selector_keys):
            raise InvalidFieldError(
                f"spec.nodeSelector[{key}]",
                value,
                "uses a key the administrator does not allow "
                f"({_listing(policy.node_selector_keys)}; nodeSelectorKeys of the "
                "controller's policy)",
            )


def reserved_key(key: str) -> bool:
    """Whether a label or annotation key belongs to flexinfer or to Kubernetes itself."""
    domain, slash, _ = key.rpartition("/")
    if not slash:
        return key in RESERVED_UNPREFIXED_LABELS
    return any(
        domain == owner or domain.endswith(f".{owner}")
        for owner in ("ai.flexinfer", "kubernetes.io", "k8s.io")
    )


def check_pod_metadata(
    pairs: Iterable[tuple[str, str]], *, field: str, allowed: Collection[str], policy_field: str
) -> None:
    for key, value in pairs:
        if reserved_key(key):
            raise InvalidFieldError(
                f"{field}[{key}]",
                value,
                "is a key flexinfer or Kubernetes sets itself (ai.flexinfer/*, "
                "app.kubernetes.io/*, *kubernetes.io/*, *k8s.io/*): never a tenant's",
            )
        if not key_allowed(key, allowed):
            raise InvalidFieldError(
                f"{field}[{key}]",
                value,
                f"uses a key the administrator does not allow ({_listing(allowed)}; "
                f"{policy_field} of the controller's policy)",
            )


def check_workload(workload: Workload, policy: AdminPolicy, *, images: Collection[str]) -> None:
    """A Model or ModelDeployment: its image, host path, scheduling and pod metadata."""
    check_image(workload.image, field="spec.image", policy=policy, rendered=images)
    source = workload.source
    if source is not None and source.scheme is Scheme.FILE:
        check_host_path(
            source.path,
            field="spec.source" if workload.kind is Kind.MODEL else "spec.model",
            value=workload.model,
            namespace=workload.namespace,
            policy=policy,
        )
    check_node_selector(workload.node_selector, policy)
    check_tolerations(workload.tolerations, policy)
    check_pod_metadata(
        workload.pod_labels,
        field="spec.podLabels",
        allowed=policy.pod_label_keys,
        policy_field="podLabelKeys",
    )
    check_pod_metadata(
        workload.pod_annotations,
        field="spec.podAnnotations",
        allowed=policy.pod_annotation_keys,
        policy_field="podAnnotationKeys",
    )


def check_cache(
    obj: Mapping[str, Any], cache: CacheSpec, policy: AdminPolicy, *, images: Collection[str]
) -> None:
    """A ModelCache (`obj`, read as `cache`): its download image, source, node, tolerations and pod
    annotations (those of `spec.podAnnotations`; `cache_within_policy` drops the
    metadata's test annotations the policy does not allow)."""
    check_image(cache.download_image, field="spec.downloadImage", policy=policy, rendered=images)
    if cache.source is not None and cache.source.scheme is Scheme.FILE:
        check_host_path(
            cache.source.path,
            field="spec.source",
            value=cache.source.text,
            namespace=cache.namespace,
            policy=policy,
        )
    check_node_selector(cache.node_selector, policy)
    check_tolerations(cache.tolerations, policy)
    spec_annotations = get_path(obj, "spec", "podAnnotations") or {}
    check_pod_metadata(
        ((str(k), str(v)) for k, v in spec_annotations.items()),
        field="spec.podAnnotations",
        allowed=policy.pod_annotation_keys,
        policy_field="podAnnotationKeys",
    )


def check_finetune(
    finetune: Mapping[str, Any], cache: CacheSpec, policy: AdminPolicy, *, images: Collection[str]
) -> None:
    """A ModelCache's `spec.finetune`: its trainer image and a host dataset."""
    check_image(
        str(finetune.get("image") or ""),
        field="spec.finetune.image",
        policy=policy,
        rendered=images,
    )
    dataset = str(finetune.get("dataset") or "")
    if dataset.startswith("file://"):
        check_host_path(
            posixpath.normpath(dataset.removeprefix("file://")),
            field="spec.finetune.dataset",
            value=dataset,
            namespace=cache.namespace,
            policy=policy,
        )


def host_cache_bound(cache: CacheSpec, policy: AdminPolicy) -> int | None:
    """The most a node-bound cache's directory may hold: its `spec.storageSize` (default
    50Gi), never more than the policy's `hostCacheMaxSize`; None for a claim's copy
    (the claim's own size bounds it)."""
    if not cache.on_node and cache.strategy is not Strategy.MEMORY:
        return None
    wanted = quantity_bytes(cache.storage_size, field="spec.storageSize")
    most = quantity_bytes(policy.host_cache_max_size, field="hostCacheMaxSize")
    if wanted > most:
        raise InvalidFieldError(
            "spec.storageSize",
            cache.storage_size,
            f"is more than a node cache directory may hold ({policy.host_cache_max_size}; "
            "hostCacheMaxSize of the controller's policy)",
        )
    return wanted


def cache_within_policy(
    obj: Mapping[str, Any], policy: AdminPolicy, *, images: Collection[str]
) -> CacheSpec:
    """A ModelCache read (`cache_from_k8s`) and checked (`check_cache`). Of its
    metadata's kwok test annotations (`flexinfer.test/*`, copied to its pods), only
    those the policy allows stay: a test cluster's policy allows them, the default
    does not."""
    cache = cache_from_k8s(obj)
    check_cache(obj, cache, policy, images=images)
    cache = attrs.evolve(cache, host_max_bytes=host_cache_bound(cache, policy))
    spec_annotations = {
        str(k): str(v) for k, v in (get_path(obj, "spec", "podAnnotations") or {}).items()
    }
    kept = {
        k: v
        for k, v in cache.pod_annotations
        if k in spec_annotations or key_allowed(k, policy.pod_annotation_keys)
    }
    return attrs.evolve(cache, pod_annotations=tuple(sorted(kept.items())))


def _listing(values: Iterable[str]) -> str:
    items = list(values)
    return ", ".join(items) if items else "none"
