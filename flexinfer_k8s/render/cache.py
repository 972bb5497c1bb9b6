"""ModelCaches as storage: where a cache's copy lives, how it is filled, how pods mount it.

A cache keeps one copy of a model in its storage:

- `SharedPVC`: a claim (`existingClaimName`, or `<cache>-models` of `storageSize`,
  ReadWriteMany, owned by the cache), the copy in `modelPath` (default: the cache's
  name) inside it;
- `NodeLocal`: `/var/lib/flexinfer/models/<namespace>/<name>` on the node its
  `nodeSelector` picks;
- `Memory`: `/dev/shm/flexinfer/<namespace>/<name>` on that node, filled at pod start
  by a flash-loader init container from a backing copy (the claim when
  `existingClaimName` is set, else the NodeLocal directory, which the download fills).

A download Job per source scheme fills the storage and writes `COMPLETE_MARKER`
last; the flash loader refuses a backing copy without it, copies only what changed
(size and mtime), deletes what the source no longer has (a stale copy of an earlier
model must never be served) and writes its own marker last. Pure: JSON in, manifests
out.
"""

from __future__ import annotations

import enum
import posixpath
import shlex
from collections.abc import Mapping
from typing import Any

import attrs

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.source import Scheme, Source, parse_source
from flexinfer_kube.objects import JSON, get_path, name_of, namespace_of
from flexinfer_kube.resources import MODEL_CACHES

Pairs = tuple[tuple[str, str], ...]

COMPLETE_MARKER = ".flexinfer-complete"
"""Written last by every filler (download Job, flash loader); one name, one place."""
NODE_MODELS_ROOT = "/var/lib/flexinfer/models"
MEMORY_ROOT = "/dev/shm/flexinfer"
MODELS_MOUNT = "/models"
"""Serving pods see a cache at /models/<cache name>."""
DEFAULT_STORAGE_SIZE = "50Gi"
CACHE_LABEL = "ai.flexinfer/modelcache"
TEST_ANNOTATION_PREFIX = "flexinfer.test/"


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
    source: Source
    claim: str
    """The claim holding the copy ("" when the copy is on the node)."""
    create_claim: bool
    storage_size: str
    content_dir: str
    """The copy's directory inside the claim."""
    node_selector: Pairs
    download_image: str = ""
    pod_annotations: Pairs = ()

    @property
    def node_dir(self) -> str:
        return f"{NODE_MODELS_ROOT}/{self.namespace}/{self.name}"

    @property
    def memory_dir(self) -> str:
        return f"{MEMORY_ROOT}/{self.namespace}/{self.name}"

    @property
    def on_node(self) -> bool:
        """Whether the (backing) copy lives in a node directory rather than a claim."""
        return not self.claim

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
    def serving_mount(self) -> str:
        return f"{MODELS_MOUNT}/{self.name}"


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
    annotations = {
        str(k): str(v)
        for k, v in (get_path(obj, "metadata", "annotations") or {}).items()
        if str(k).startswith(TEST_ANNOTATION_PREFIX)
    }
    annotations.update({str(k): str(v) for k, v in (spec.get("podAnnotations") or {}).items()})
    return CacheSpec(
        name=name,
        namespace=namespace,
        uid=str(get_path(obj, "metadata", "uid") or ""),
        strategy=strategy,
        source=parse_source(str(spec.get("source") or ""), field="spec.source"),
        claim=claim,
        create_claim=create,
        storage_size=str(spec.get("storageSize") or DEFAULT_STORAGE_SIZE),
        content_dir=content,
        node_selector=selector,
        download_image=str(spec.get("downloadImage") or ""),
        pod_annotations=tuple(sorted(annotations.items())),
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


# --- the claim -----------------------------------------------------------------------


def claim_manifest(cache: CacheSpec) -> JSON | None:
    """The claim a SharedPVC cache creates (None when it uses an existing one)."""
    if not cache.create_claim:
        return None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": cache.claim,
            "namespace": cache.namespace,
            "labels": {**cache_labels(cache), "app.kubernetes.io/component": "model-cache"},
            "ownerReferences": [owner_reference(cache)],
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": cache.storage_size}},
        },
    }


# --- filling it -----------------------------------------------------------------------


def _target_volume(cache: CacheSpec) -> tuple[JSON, JSON]:
    """The (volume, mount) where the download writes the copy, mounted at /target."""
    if cache.claim:
        return (
            {"name": "target", "persistentVolumeClaim": {"claimName": cache.claim}},
            {"name": "target", "mountPath": "/target", "subPath": cache.content_dir},
        )
    return (
        {"name": "target", "hostPath": {"path": cache.node_dir, "type": "DirectoryOrCreate"}},
        {"name": "target", "mountPath": "/target"},
    )


def _begin(marker: str = COMPLETE_MARKER) -> str:
    # The marker goes first so a half-written copy is never taken for a whole one; then
    # everything else, so files of an earlier source never mix with the new model.
    return f"set -eu; rm -f /target/{marker}; find /target -mindepth 1 -delete; "


def _end(marker: str = COMPLETE_MARKER) -> str:
    return f"; touch /target/{marker}"


HF_DOWNLOAD = """\
import os
from huggingface_hub import snapshot_download
pattern = os.environ.get("FLEXINFER_PATTERN") or None
repo = os.environ["FLEXINFER_REPO"]
snapshot_download(
    repo_id=repo,
    local_dir="/target",
    allow_patterns=[pattern, pattern + "/*"] if pattern else None,
)
fetched = [p for p in os.listdir("/target") if not p.startswith(".")]
if not fetched:
    raise SystemExit(f"{repo}: nothing matches {pattern or 'the repository'}")
"""


def download_job(cache: CacheSpec, images: CacheImages) -> JSON:
    """The Job that fills the cache from its source, marker last."""
    target_volume, target_mount = _target_volume(cache)
    volumes: list[JSON] = [target_volume]
    mounts: list[JSON] = [target_mount]
    env: list[JSON] = []
    source = cache.source
    if source.scheme is Scheme.HUGGINGFACE:
        image = images.huggingface
        env = [
            {"name": "FLEXINFER_REPO", "value": source.repo},
            {"name": "FLEXINFER_PATTERN", "value": source.path},
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
            # Gated repositories: a Secret `<cache>-hf-token` with key `token`, if any.
            {
                "name": "HF_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": f"{cache.name}-hf-token",
                        "key": "token",
                        "optional": True,
                    }
                },
            },
        ]
        script = (
            _begin()
            + "pip install --quiet --no-cache-dir 'huggingface_hub>=0.23,<2'; "
            + f"python -c {shlex.quote(HF_DOWNLOAD)}"
            + _end()
        )
    elif source.scheme in (Scheme.FILE, Scheme.PVC):
        image = images.copy
        if source.scheme is Scheme.FILE:
            volumes.append({"name": "source", "hostPath": {"path": source.path}})
            inside = f"/source/{source.file_name}"
            mounts.append({"name": "source", "mountPath": inside, "readOnly": True})
        else:
            volumes.append({"name": "source", "persistentVolumeClaim": {"claimName": source.repo}})
            mounts.append({"name": "source", "mountPath": "/source", "readOnly": True})
            inside = posixpath.join("/source", source.path) if source.path else "/source"
        # A named file or directory keeps its name under the copy; a whole claim is
        # copied as it is (cache_model_path follows the same rule).
        copy = (
            "cp -a /source/. /target/"
            if inside == "/source"
            else (f"cp -a {shlex.quote(inside)} /target/")
        )
        script = _begin() + copy + _end()
    else:  # ollama
        image = images.ollama
        env = [{"name": "OLLAMA_MODELS", "value": "/target"}]
        tag = shlex.quote(source.ollama_tag)
        script = (
            _begin()
            + "ollama serve & server=$!; tries=0; "
            + "until ollama list >/dev/null 2>&1; do tries=$((tries+1)); "
            + '[ "$tries" -gt 60 ] && exit 1; sleep 1; done; '
            + f"ollama pull {tag}; kill $server"
            + _end()
        )
    pod: JSON = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "download",
                "image": cache.download_image or image,
                "command": ["sh", "-c", script],
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "env": env,
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    if cache.node_selector:
        pod["nodeSelector"] = dict(cache.node_selector)
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
            # One retry: a flaky network gets a second chance, a wrong source fails fast.
            "backoffLimit": 1,
            "template": {
                "metadata": {"labels": labels, "annotations": dict(cache.pod_annotations)},
                "spec": pod,
            },
        },
    }


# --- serving from it --------------------------------------------------------------------


FLASH_LOADER_SCRIPT = """\
set -eu
src=/cache-source; dst="$1"; marker=@MARKER@
if [ ! -f "$src/$marker" ]; then
  echo "flash-loader: the backing copy in $src is incomplete ($marker missing)" >&2
  exit 1
fi
rm -f "$dst/$marker"
mkdir -p "$dst"
cd "$src"
find . -type f ! -name "$marker" | while IFS= read -r f; do
  if [ -f "$dst/$f" ] && [ "$(stat -c '%s %Y' "$f")" = "$(stat -c '%s %Y' "$dst/$f")" ]; then
    continue
  fi
  mkdir -p "$dst/$(dirname "$f")"
  cp -p "$f" "$dst/$f.flexinfer-partial"
  mv "$dst/$f.flexinfer-partial" "$dst/$f"
done
cd "$dst"
find . -type f ! -name "$marker" | while IFS= read -r f; do
  [ -f "$src/$f" ] || rm -f "$f"
done
find . -depth -mindepth 1 -type d -empty -exec rmdir {} \\;
touch "$dst/$marker"
""".replace("@MARKER@", COMPLETE_MARKER)


@attrs.frozen
class CacheMount:
    """What a serving pod adds to mount a cache at `CacheSpec.serving_mount`."""

    volumes: tuple[JSON, ...]
    mounts: tuple[JSON, ...]
    init_containers: tuple[JSON, ...]
    node_selector: Pairs
    """Inherited from a node-bound cache: the hostPath exists only on that node."""


def serving_mount(cache: CacheSpec, images: CacheImages) -> CacheMount:
    mount = {"name": "model-cache", "mountPath": cache.serving_mount, "readOnly": True}
    node_bound = cache.on_node or cache.strategy is Strategy.MEMORY
    selector = cache.node_selector if node_bound else ()
    if cache.strategy is Strategy.MEMORY:
        backing: JSON = (
            {
                "name": "cache-source",
                "persistentVolumeClaim": {"claimName": cache.claim, "readOnly": True},
            }
            if cache.claim
            else {"name": "cache-source", "hostPath": {"path": cache.node_dir, "type": "Directory"}}
        )
        loader = {
            "name": "flash-loader",
            "image": images.loader,
            "command": ["sh", "-c", FLASH_LOADER_SCRIPT, "flash-loader", cache.serving_mount],
            "volumeMounts": [
                {
                    "name": "cache-source",
                    "mountPath": "/cache-source",
                    "readOnly": True,
                    **({"subPath": cache.content_dir} if cache.claim else {}),
                },
                {"name": "model-cache", "mountPath": cache.serving_mount},
            ],
        }
        volume = {
            "name": "model-cache",
            "hostPath": {"path": cache.memory_dir, "type": "DirectoryOrCreate"},
        }
        return CacheMount((volume, backing), (mount,), (loader,), selector)
    if cache.claim:
        volume = {
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": cache.claim, "readOnly": True},
        }
        return CacheMount((volume,), ({**mount, "subPath": cache.content_dir},), (), selector)
    volume = {"name": "model-cache", "hostPath": {"path": cache.node_dir, "type": "Directory"}}
    return CacheMount((volume,), (mount,), (), selector)


def cache_model_path(cache: CacheSpec) -> str:
    """The model inside a serving pod: the cache's mount, and the file its source names."""
    path = cache.source.path if cache.source.scheme is Scheme.HUGGINGFACE else ""
    if cache.source.scheme in (Scheme.FILE, Scheme.PVC):
        path = cache.source.file_name
    return posixpath.join(cache.serving_mount, path) if path else cache.serving_mount
