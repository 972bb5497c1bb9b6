"""ModelCaches as storage: where a cache's copy lives, how it is filled, how pods mount it.

A cache keeps one copy of a model in its storage:

- `SharedPVC`: a claim (`existingClaimName`, or `<cache>-models` of `storageSize`,
  `storageClassName` and `accessModes`, owned by the cache), the copy in `modelPath`
  (default: the cache's name) inside it;
- `NodeLocal`: a node directory (`cache_dir.node_dir`) on the node its `nodeSelector`
  picks, which every pod reaches through the namespace's claim on a `local` volume
  (`render.local_volume`) with the cache's name as `subPath`, never a hostPath;
- `Memory`: a RAM directory (`cache_dir.memory_dir`) on that node, filled at pod start by
  a flash-loader init container from a backing copy (the claim when `existingClaimName`
  is set, else the NodeLocal directory, which the download fills).

A download Job per source scheme fills the storage under the ownership rules of
`cache_dir` (it writes only into an empty directory or flexinfer's own, adopts a user's
model as it is, skips a complete copy of the same source); a cleanup Job removes a
node-bound cache's directories when the cache goes, again only what flexinfer wrote.
Every pod of a cache (download, cleanup, finetune) gets its placement from
`job_placement`. Pure: JSON in, manifests out.
"""

from __future__ import annotations

import enum
import posixpath
import shlex
from collections.abc import Mapping
from typing import Any

import attrs

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render import cache_dir
from flexinfer_k8s.render.cache_dir import FLASH_LOADER_SCRIPT, REFUSED_EXIT_CODE, TERMINATION_LOG
from flexinfer_k8s.render.hf_download import HF_DOWNLOAD
from flexinfer_k8s.render.local_volume import (
    HostVolume,
    cache_volume,
    host_volume,
)
from flexinfer_k8s.render.policy import AdminPolicy
from flexinfer_k8s.render.source import Scheme, Source, parse_source
from flexinfer_k8s.render.tolerations import DEFAULT_ADMIN_POLICY, with_gpu_node_tolerations
from flexinfer_kube.objects import JSON, get_path, name_of, namespace_of
from flexinfer_kube.resources import MODEL_CACHES

Pairs = tuple[tuple[str, str], ...]

MODELS_MOUNT = "/models"
"""Serving pods see a cache's copy at /models/<modelPath> (the cache's name when it has
no modelPath), its entries linked at /models (`render.model_files`)."""
DEFAULT_STORAGE_SIZE = "50Gi"
CACHE_LABEL = "ai.flexinfer/modelcache"
TEST_ANNOTATION_PREFIX = "flexinfer.test/"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_DOWNLOAD_TIMEOUT_SECONDS = 21600
"""A download's `activeDeadlineSeconds` unless `spec.downloadTimeoutSeconds` says (6 h:
a 70B model over a slow home line)."""
DOWNLOAD_RESOURCES: JSON = {
    "requests": {"cpu": "250m", "memory": "512Mi"},
    "limits": {"memory": "4Gi"},
}
"""The download container's resources unless `spec.downloadResources` says: enough for
huggingface_hub or ollama, bounded so a runaway download cannot starve the node's
serving pods of memory; no CPU limit (throttling only slows the copy)."""
CLEANUP_RESOURCES: JSON = {
    "requests": {"cpu": "10m", "memory": "16Mi"},
    "limits": {"memory": "64Mi"},
}
ADOPTED_CONDITION = "Adopted"
"""The ModelCache condition that says its copy is a user's directory, used as it is."""


class Strategy(enum.StrEnum):
    SHARED_PVC = "SharedPVC"
    NODE_LOCAL = "NodeLocal"
    MEMORY = "Memory"


@attrs.frozen
class CacheImages:
    """Images of the cache's helpers (controller configuration, overridable per cache)."""

    huggingface: str = "python:3.12-slim"
    copy: str = "busybox:1.36"
    ollama: str = "ollama/ollama:latest"
    loader: str = "busybox:1.36"


@attrs.frozen
class CacheSpec:
    name: str
    namespace: str
    uid: str
    strategy: Strategy
    source: Source | None
    """None: no source; the copy must already be there (adopted)."""
    claim: str
    """The claim holding the copy ("" when the copy is on the node)."""
    create_claim: bool
    storage_size: str
    content_dir: str
    """The copy's directory inside the claim."""
    node_selector: Pairs
    download_image: str = ""
    pod_annotations: Pairs = ()
    tolerations: tuple[JSON, ...] = attrs.field(default=(), hash=False)
    storage_class: str | None = None
    """`spec.storageClassName`; None leaves it to the cluster's default class."""
    access_modes: tuple[str, ...] = ("ReadWriteMany",)
    download_timeout: int = DEFAULT_DOWNLOAD_TIMEOUT_SECONDS
    download_resources: JSON = attrs.field(factory=lambda: dict(DOWNLOAD_RESOURCES), hash=False)
    adopted: bool = False
    hf_token: tuple[str, str] | None = None
    """`spec.hfTokenSecretRef` as (Secret name, key): the only Secret a download reads."""
    host_max_bytes: int | None = None
    """The most a node directory of this cache may hold (`tenant_policy.host_cache_bound`);
    the download and the flash loader stop there. None: not bounded here."""

    @property
    def size_env(self) -> list[JSON]:
        """`FLEXINFER_MAX_KIB` for the scripts that fill a bounded node directory."""
        if self.host_max_bytes is None:
            return []
        return [{"name": "FLEXINFER_MAX_KIB", "value": str(self.host_max_bytes // 1024)}]

    """The controller found a user's model in the copy's directory (status `Adopted`)."""

    @property
    def node_dir(self) -> str:
        return cache_dir.node_dir(self.namespace, self.name)

    @property
    def memory_dir(self) -> str:
        return cache_dir.memory_dir(self.namespace, self.name)

    def models_volume(self, policy: AdminPolicy) -> HostVolume:
        """The namespace's node-cache root on the cache's node (`render.local_volume`)."""
        return cache_volume(
            "models", namespace=self.namespace, selector=self.node_selector, policy=policy
        )

    def memory_volume(self, policy: AdminPolicy, pod_selector: Pairs = ()) -> HostVolume:
        """The RAM root on the cache's node; a cache that names none (a Memory cache on
        a claim) keeps its RAM copies on the nodes its serving pods select."""
        return cache_volume(
            "memory",
            namespace=self.namespace,
            selector=self.node_selector or tuple(sorted(pod_selector)),
            policy=policy,
        )

    def host_volumes(self, policy: AdminPolicy) -> tuple[HostVolume, ...]:
        """Every host directory a pod of this cache mounts (through a claim): its node
        roots, and a `file://` source's."""
        found: list[HostVolume] = []
        if self.on_node:
            found.append(self.models_volume(policy))
        if self.strategy is Strategy.MEMORY and self.node_selector:
            # Without a node the RAM volume follows the serving pods (`serving_mount`).
            found.append(self.memory_volume(policy))
        if self.source is not None and self.source.scheme is Scheme.FILE:
            found.append(self.source_volume(policy)[0])
        return tuple(found)

    def source_volume(self, policy: AdminPolicy) -> tuple[HostVolume, str]:
        """A `file://` source's volume and its subPath there."""
        assert self.source is not None
        return host_volume(
            self.source.path, namespace=self.namespace, selector=self.node_selector, policy=policy
        )

    @property
    def on_node(self) -> bool:
        """Whether the (backing) copy lives in a node directory rather than a claim."""
        return not self.claim

    @property
    def node_dirs(self) -> tuple[str, ...]:
        """The node directories flexinfer may have written for this cache (cleanup)."""
        dirs = (self.node_dir,) if self.on_node else ()
        return (*dirs, self.memory_dir) if self.strategy is Strategy.MEMORY else dirs

    @property
    def source_text(self) -> str:
        return self.source.text if self.source is not None else ""

    @property
    def path(self) -> str:
        """Where the model lives, for `status.path` and people."""
        if self.strategy is Strategy.MEMORY:
            return self.memory_dir
        if self.claim:
            return f"pvc://{self.claim}/{self.content_dir}"
        return self.node_dir

    @property
    def claim_name(self) -> str:
        return f"{self.name}-models"

    @property
    def download_job_name(self) -> str:
        return f"{self.name}-download"

    @property
    def cleanup_job_name(self) -> str:
        return f"{self.name}-cleanup"

    @property
    def serving_mount(self) -> str:
        return f"{MODELS_MOUNT}/{self.content_dir}"


RESOURCE_KEYS = ("cpu", "memory", "ephemeral-storage")


def resources_from(value: Any, *, field: str, defaults: Mapping[str, Any]) -> JSON:
    """`requests` and `limits` of a container: each section the spec gives replaces the
    default's whole (a request above the default limit then needs the limit too)."""
    value = value or {}
    if not isinstance(value, Mapping):
        raise InvalidFieldError(field, value, "must be an object with requests and limits")
    out: JSON = {}
    for section in ("requests", "limits"):
        given = value.get(section)
        chosen = given if given is not None else defaults.get(section)
        if not chosen:
            continue
        if not isinstance(chosen, Mapping):
            raise InvalidFieldError(f"{field}.{section}", chosen, "must be an object")
        for key in chosen:
            if key not in RESOURCE_KEYS:
                raise InvalidFieldError(
                    f"{field}.{section}.{key}", chosen[key], f"only {RESOURCE_KEYS} may be set"
                )
        out[section] = {str(k): str(v) for k, v in chosen.items()}
    return out


def default_access_modes(selector: Pairs) -> tuple[str, ...]:
    """ReadWriteOnce when the cache is pinned to one node by hostname (its Job and its
    serving pods all run there: `local-path` and other node-local storage work), else
    ReadWriteMany (pods on any node read the one copy)."""
    return ("ReadWriteOnce",) if dict(selector).get(HOSTNAME_LABEL) else ("ReadWriteMany",)


def cache_from_k8s(obj: Mapping[str, Any]) -> CacheSpec:
    """A ModelCache; `InvalidFieldError` when its storage cannot work as written."""
    spec = get_path(obj, "spec") or {}
    name, namespace = name_of(obj), namespace_of(obj) or "default"
    try:
        strategy = Strategy(str(spec.get("storageStrategy") or Strategy.SHARED_PVC.value))
    except ValueError:
        raise InvalidFieldError(
            "spec.storageStrategy",
            spec.get("storageStrategy"),
            "must be SharedPVC, NodeLocal or Memory",
        ) from None
    selector = tuple(sorted((str(k), str(v)) for k, v in (spec.get("nodeSelector") or {}).items()))
    existing = str(spec.get("existingClaimName") or "")
    if strategy is Strategy.SHARED_PVC:
        claim, create = existing or f"{name}-models", not existing
    else:
        claim, create = (existing if strategy is Strategy.MEMORY else ""), False
    if not claim and not selector:
        raise InvalidFieldError(
            "spec.nodeSelector",
            {},
            f"is required for {strategy.value} without a claim: it names the node that "
            f"keeps the copy (e.g. kubernetes.io/hostname: <node>)",
        )
    content = str(spec.get("modelPath") or "").strip("/") or name
    if ".." in content.split("/"):
        raise InvalidFieldError("spec.modelPath", spec.get("modelPath"), "must not contain '..'")
    source_text = str(spec.get("source") or "").strip()
    if not source_text and create:
        raise InvalidFieldError(
            "spec.source",
            "",
            "is required when the cache creates its own (empty) claim: name the model to "
            "download (e.g. HF://Qwen/Qwen3-1.7B), or set spec.existingClaimName and "
            "spec.modelPath to a model already on a claim",
        )
    source = parse_source(source_text, field="spec.source") if source_text else None
    annotations = {
        str(k): str(v)
        for k, v in (get_path(obj, "metadata", "annotations") or {}).items()
        if str(k).startswith(TEST_ANNOTATION_PREFIX)
    }
    annotations.update({str(k): str(v) for k, v in (spec.get("podAnnotations") or {}).items()})
    modes = tuple(str(m) for m in (spec.get("accessModes") or ())) or default_access_modes(selector)
    storage_class = spec.get("storageClassName")
    return CacheSpec(
        name=name,
        namespace=namespace,
        uid=str(get_path(obj, "metadata", "uid") or ""),
        strategy=strategy,
        source=source,
        claim=claim,
        create_claim=create,
        storage_size=str(spec.get("storageSize") or DEFAULT_STORAGE_SIZE),
        content_dir=content,
        node_selector=selector,
        download_image=str(spec.get("downloadImage") or ""),
        pod_annotations=tuple(sorted(annotations.items())),
        tolerations=tuple(dict(t) for t in (spec.get("tolerations") or ())),
        storage_class=None if storage_class is None else str(storage_class),
        access_modes=modes,
        download_timeout=int(
            spec.get("downloadTimeoutSeconds") or DEFAULT_DOWNLOAD_TIMEOUT_SECONDS
        ),
        download_resources=resources_from(
            spec.get("downloadResources"),
            field="spec.downloadResources",
            defaults=DOWNLOAD_RESOURCES,
        ),
        adopted=status_says_adopted(obj),
        hf_token=_secret_ref(spec.get("hfTokenSecretRef")),
    )


def _secret_ref(ref: Any) -> tuple[str, str] | None:
    if ref in (None, {}):
        return None
    if not isinstance(ref, Mapping) or not ref.get("name"):
        raise InvalidFieldError("spec.hfTokenSecretRef", ref, "must name a Secret: {name, key}")
    return str(ref["name"]), str(ref.get("key") or "token")


def status_says_adopted(obj: Mapping[str, Any]) -> bool:
    """Whether the ModelCache's status says its copy was adopted (a user's directory)."""
    return any(
        c.get("type") == ADOPTED_CONDITION and c.get("status") == "True"
        for c in get_path(obj, "status", "conditions") or []
    )


def owner_reference(cache: CacheSpec) -> JSON:
    return {
        "apiVersion": MODEL_CACHES.api_version,
        "kind": MODEL_CACHES.kind,
        "name": cache.name,
        "uid": cache.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def cache_labels(cache: CacheSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "flexinfer",
        "app.kubernetes.io/part-of": "flexinfer",
        "app.kubernetes.io/instance": cache.name,
        CACHE_LABEL: cache.name,
    }


def job_placement(
    cache: CacheSpec, policy: AdminPolicy = DEFAULT_ADMIN_POLICY, *, gpu: bool = False
) -> JSON:
    """Where every pod of the cache (download, cleanup, finetune) may run: the cache's
    node and the taints it tolerates, then the GPU nodes' taints when the pod belongs on
    one (pinned to the cache's node, or `gpu`: it requests a GPU; `render.tolerations`);
    and no API token, which none of them needs."""
    # None of them talks to the API server: no token in the pod.
    placement: JSON = {"automountServiceAccountToken": False}
    if cache.node_selector:
        placement["nodeSelector"] = dict(cache.node_selector)
    tolerations = [dict(t) for t in cache.tolerations]
    if cache.node_selector or gpu:
        tolerations = with_gpu_node_tolerations(tolerations, policy)
    if tolerations:
        placement["tolerations"] = tolerations
    return placement


# --- the claim -----------------------------------------------------------------------


def claim_manifest(cache: CacheSpec) -> JSON | None:
    """The claim a SharedPVC cache creates (None when it uses an existing one)."""
    if not cache.create_claim:
        return None
    spec: JSON = {
        "accessModes": list(cache.access_modes),
        "resources": {"requests": {"storage": cache.storage_size}},
    }
    if cache.storage_class is not None:
        spec["storageClassName"] = cache.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": cache.claim,
            "namespace": cache.namespace,
            "labels": {**cache_labels(cache), "app.kubernetes.io/component": "model-cache"},
            "ownerReferences": [owner_reference(cache)],
        },
        "spec": spec,
    }


def claim_differs(cache: CacheSpec, live: Mapping[str, Any]) -> str:
    """What of the spec a live claim of ours does not have ("" when it matches): a
    Pending claim is re-created with it, a bound one is never touched."""
    wanted = claim_manifest(cache)
    if wanted is None:
        return ""
    spec = get_path(live, "spec") or {}
    if sorted(spec.get("accessModes") or []) != sorted(wanted["spec"]["accessModes"]):
        return f"accessModes {spec.get('accessModes')} → {list(cache.access_modes)}"
    if cache.storage_class is not None and spec.get("storageClassName") != cache.storage_class:
        return f"storageClassName {spec.get('storageClassName')!r} → {cache.storage_class!r}"
    return ""


# --- filling it -----------------------------------------------------------------------


def _target_volume(cache: CacheSpec, policy: AdminPolicy) -> tuple[JSON, JSON]:
    """The (volume, mount) where the download writes the copy, mounted at /target: the
    cache's claim, or its node directory through the namespace's `local` volume."""
    if cache.claim:
        return (
            {"name": "target", "persistentVolumeClaim": {"claimName": cache.claim}},
            {"name": "target", "mountPath": "/target", "subPath": cache.content_dir},
        )
    return (
        cache.models_volume(policy).volume("target"),
        {"name": "target", "mountPath": "/target", "subPath": cache.name},
    )


def model_entry(source: Source | None) -> str:
    """The file or directory the source names inside the copy ("" for the whole copy):
    what the serving path points at, and what adopting a directory looks for."""
    if source is None:
        return ""
    if source.scheme is Scheme.HUGGINGFACE:
        return source.path
    if source.scheme in (Scheme.FILE, Scheme.PVC):
        return source.file_name
    return ""


SIZE_CHECK = (
    """\
if [ -n "${FLEXINFER_MAX_KIB:-}" ]; then
  need="$(du -sk "$3" | cut -f1)"
  if [ "$need" -gt "$FLEXINFER_MAX_KIB" ]; then
    report "flexinfer: too large: the source is ${need} KiB, more than the cache's" \
      "${FLEXINFER_MAX_KIB} KiB (spec.storageSize)"
    exit @REFUSED@
  fi
fi
"""
).replace("@REFUSED@", str(REFUSED_EXIT_CODE))
"""A copy's source measured before a byte is copied into a bounded node directory (the
download script checks the result again before its completion marker)."""


SOURCE_CHECK = (
    """\
if [ ! -e "$3" ] || { [ -d "$3" ] && [ -z "$(ls -A "$3")" ]; }; then
  report "flexinfer: missing source: $FLEXINFER_SOURCE is missing or empty on the node"
  exit @REFUSED@
fi
"""
).replace("@REFUSED@", str(REFUSED_EXIT_CODE))
"""A `file://` source reached through a claim's `subPath`, which the kubelet makes an
empty directory when the path does not exist: refused, never copied as an empty model."""


def download_job(
    cache: CacheSpec, images: CacheImages, *, policy: AdminPolicy = DEFAULT_ADMIN_POLICY
) -> JSON:
    """The Job that fills the cache from its source, under `cache_dir`'s ownership rules;
    without a source, the Job only looks at what is there (adopts it or says so). On a
    node-bound cache's node it tolerates the GPU nodes' taints (`job_placement`)."""
    target_volume, target_mount = _target_volume(cache, policy)
    volumes: list[JSON] = [target_volume]
    mounts: list[JSON] = [target_mount]
    env: list[JSON] = [
        {"name": "FLEXINFER_SOURCE", "value": cache.source_text},
        {"name": "FLEXINFER_ENTRY", "value": model_entry(cache.source)},
        *(cache.size_env if cache.on_node else []),
    ]
    args: list[str] = []
    source = cache.source
    if source is None:
        image, body = images.copy, ""
    elif source.scheme is Scheme.HUGGINGFACE:
        image = images.huggingface
        env += [
            {"name": "FLEXINFER_REPO", "value": source.repo},
            {"name": "FLEXINFER_PATTERN", "value": source.path},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        ]
        if cache.hf_token is not None:
            # Gated repositories: only the Secret the cache names (never one by convention).
            secret, key = cache.hf_token
            env.append(
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
            )
        body = f'FLEXINFER_TARGET="$target" python -c {shlex.quote(HF_DOWNLOAD)}\n'
    elif source.scheme in (Scheme.FILE, Scheme.PVC):
        image = images.copy
        if source.scheme is Scheme.FILE:
            volume, sub_path = cache.source_volume(policy)
            # A source under the namespace's own cache root is on the target's claim: a
            # pod names one claim once.
            same = cache.on_node and volume == cache.models_volume(policy)
            if not same:
                volumes.append(volume.volume("source", read_only=True))
            inside = f"/source/{source.file_name}"
            mounts.append(
                {"name": "target" if same else "source", "mountPath": inside, "readOnly": True,
                 **({"subPath": sub_path} if sub_path else {})}
            )
        else:
            volumes.append({"name": "source", "persistentVolumeClaim": {"claimName": source.repo}})
            mounts.append({"name": "source", "mountPath": "/source", "readOnly": True})
            inside = posixpath.join("/source", source.path) if source.path else "/source"
        # A named file or directory keeps its name under the copy; a whole claim is
        # copied as it is (model_entry follows the same rule).
        body = (SOURCE_CHECK if source.scheme is Scheme.FILE else "") + SIZE_CHECK + (
            'cp -a "$3"/. "$target"/\n' if inside == "/source" else 'cp -a "$3" "$target"/\n'
        )
        args = [inside]
    else:  # ollama
        image = images.ollama
        tag = shlex.quote(source.ollama_tag)
        body = (
            'OLLAMA_MODELS="$target" ollama serve & server=$!; tries=0\n'
            "until ollama list >/dev/null 2>&1; do tries=$((tries+1)); "
            '[ "$tries" -gt 60 ] && exit 1; sleep 1; done\n'
            f"ollama pull {tag}; kill $server\n"
        )
    container: JSON = {
        "name": "download",
        "image": cache.download_image or image,
        "command": [
            "sh",
            "-c",
            cache_dir.download_script(body),
            "download",
            "/target",
            TERMINATION_LOG,
            *args,
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": env,
        "volumeMounts": mounts,
    }
    if cache.download_resources:
        container["resources"] = cache.download_resources
    pod: JSON = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
        **job_placement(cache, policy),
    }
    labels = {**cache_labels(cache), "app.kubernetes.io/component": "model-download"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": cache.download_job_name,
            "namespace": cache.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(cache)],
        },
        "spec": {
            # One retry: a flaky network gets a second chance, a wrong source fails fast,
            # and a directory flexinfer must not write fails at once.
            "backoffLimit": 1,
            "activeDeadlineSeconds": cache.download_timeout,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "download",
                            "operator": "In",
                            "values": [REFUSED_EXIT_CODE],
                        },
                    }
                ]
            },
            "template": {
                "metadata": {"labels": labels, "annotations": dict(cache.pod_annotations)},
                "spec": pod,
            },
        },
    }


# --- removing it ------------------------------------------------------------------------


def cleanup_job(
    cache: CacheSpec,
    images: CacheImages,
    *,
    deadline_seconds: int,
    policy: AdminPolicy = DEFAULT_ADMIN_POLICY,
) -> JSON | None:
    """The Job that removes a node-bound cache's directories from its node once the
    cache is deleted (only what flexinfer wrote: `cache_dir.CLEANUP_SCRIPT`); None when
    the cache has no node directory or names no node. Not owned by the cache (it runs
    while the cache is going); it deletes itself an hour after it ends."""
    if not cache.node_dirs or not cache.node_selector:
        return None
    volumes: list[JSON] = []
    mounts: list[JSON] = []
    inside: list[str] = []
    roots = [cache.models_volume(policy)] if cache.on_node else []
    if cache.strategy is Strategy.MEMORY:
        roots.append(cache.memory_volume(policy))
    for index, root in enumerate(roots):
        # The namespace's whole root (its claim, no subPath), so the cache's own
        # directory can be removed, not only emptied.
        volume = f"root-{index}"
        volumes.append(root.volume(volume))
        mounts.append({"name": volume, "mountPath": f"/node/{index}"})
        inside.append(f"/node/{index}/{cache.name}")
    labels = {**cache_labels(cache), "app.kubernetes.io/component": "model-cleanup"}
    container: JSON = {
        "name": "cleanup",
        "image": images.copy,
        "command": ["sh", "-c", cache_dir.CLEANUP_SCRIPT, "cleanup", TERMINATION_LOG, *inside],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
        "resources": CLEANUP_RESOURCES,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": cache.cleanup_job_name,
            "namespace": cache.namespace,
            "labels": labels,
            "annotations": {"ai.flexinfer/modelcache-uid": cache.uid},
        },
        "spec": {
            "backoffLimit": 1,
            "activeDeadlineSeconds": deadline_seconds,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels, "annotations": dict(cache.pod_annotations)},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": volumes,
                    **job_placement(cache, policy),
                },
            },
        },
    }


# --- serving from it --------------------------------------------------------------------


@attrs.frozen
class CacheMount:
    """What a serving pod adds to mount a cache at `CacheSpec.serving_mount`."""

    volumes: tuple[JSON, ...]
    mounts: tuple[JSON, ...]
    init_containers: tuple[JSON, ...]
    node_selector: Pairs
    """Inherited from a node-bound cache: its directory exists only on that node."""
    host_volumes: tuple[HostVolume, ...] = ()
    """What the serving pod's reconcile makes (the cache's reconcile makes the rest): a
    Memory cache's RAM volume, on the pod's nodes when the cache names none."""


def serving_mount(
    cache: CacheSpec,
    images: CacheImages,
    policy: AdminPolicy = DEFAULT_ADMIN_POLICY,
    *,
    pod_selector: Pairs = (),
) -> CacheMount:
    """A serving pod's volumes for the cache: claims only, a node directory through the
    namespace's `local` volume with the cache's name as `subPath`. `pod_selector`: the
    serving pod's own nodeSelector, where a Memory cache without one keeps its RAM
    copy."""
    mount = {"name": "model-cache", "mountPath": cache.serving_mount, "readOnly": True}
    node_bound = cache.on_node or cache.strategy is Strategy.MEMORY
    selector = cache.node_selector if node_bound else ()
    if cache.strategy is Strategy.MEMORY:
        backing = (
            {
                "name": "cache-source",
                "persistentVolumeClaim": {"claimName": cache.claim, "readOnly": True},
            }
            if cache.claim
            else cache.models_volume(policy).volume("cache-source", read_only=True)
        )
        loader = {
            "name": "flash-loader",
            "image": images.loader,
            "command": [
                "sh",
                "-c",
                FLASH_LOADER_SCRIPT,
                "flash-loader",
                cache.serving_mount,
                # A user's copy carries no marker of ours: the controller vouched for it.
                *(["adopted"] if cache.adopted else []),
            ],
            **({"env": cache.size_env} if cache.size_env else {}),
            "volumeMounts": [
                {
                    "name": "cache-source",
                    "mountPath": "/cache-source",
                    "readOnly": True,
                    "subPath": cache.content_dir if cache.claim else cache.name,
                },
                {"name": "model-cache", "mountPath": cache.serving_mount,
                 "subPath": cache.name},
            ],
        }
        ram = cache.memory_volume(policy, pod_selector)
        served = {**mount, "subPath": cache.name}
        return CacheMount(
            (ram.volume("model-cache"), backing), (served,), (loader,), selector, (ram,)
        )
    if cache.claim:
        volume = {
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": cache.claim, "readOnly": True},
        }
        return CacheMount((volume,), ({**mount, "subPath": cache.content_dir},), (), selector)
    volume = cache.models_volume(policy).volume("model-cache", read_only=True)
    return CacheMount((volume,), ({**mount, "subPath": cache.name},), (), selector)


def cache_model_path(cache: CacheSpec) -> str:
    """The model inside a serving pod: the cache's mount, and the file its source names."""
    path = model_entry(cache.source)
    return posixpath.join(cache.serving_mount, path) if path else cache.serving_mount
