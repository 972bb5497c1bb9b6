"""Where a serving pod finds its model files, and the one `/models` layout every backend
sees.

The layout: a model directory (a ModelCache's copy, a `pvc://` or `file://` directory)
is mounted read-only at `/models/<dir>`, where `<dir>` is the cache's `modelPath` (its
name when unset), the source path's last element, or the claim's name; `/models` itself
is a pod-local `emptyDir` in which an init container (`models-layout`) links every entry
of the model directory (`/models/<entry>` → `<dir>/<entry>`). So `/models/<dir>/x.so`
and `/models/x.so` name the same file, and nothing is ever written into the model
directory. A single `.gguf` file is mounted as `/models/<file>` and needs no links.

Which files a resource means:

- `modelCacheRef`, or a Model's `spec.cache.strategy` without one (the *implied*
  ModelCache `<model>-cache`, owned by the Model: `implied_cache_manifest`);
- a ModelDeployment's plain `model` (no `://`): the ModelCache of its namespace whose
  `modelPath` (or name, when it has none) equals it (the reconcile looks it up), else
  the backend's own convention (`plain_model_location`): mlc-llm `org/name` or a
  `*-MLC` name of mlc-ai, vLLM `org/name`, llama.cpp `org/name[:quant]`, an Ollama tag;
  anything else is `InvalidSpec` naming the field to add;
- a source URL: `file://` and `pvc://` mounted as above, `HF://` and `ollama://` fetched
  by the backend itself.

Pure: values in, manifests out.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

import attrs

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.backend import ModelLocation
from flexinfer_k8s.render.cache import (
    MODELS_MOUNT,
    CacheImages,
    CacheSpec,
    cache_model_path,
    serving_mount,
)
from flexinfer_k8s.render.local_volume import HostVolume, host_volume
from flexinfer_k8s.render.policy import AdminPolicy
from flexinfer_k8s.render.source import Scheme, Source, parse_source
from flexinfer_k8s.render.tolerations import DEFAULT_ADMIN_POLICY
from flexinfer_k8s.render.workload import Kind, Workload
from flexinfer_kube.objects import JSON, get_path, name_of

LAYOUT_VOLUME = "models-root"
LAYOUT_INIT = "models-layout"
IMPLIED_CACHE_SUFFIX = "-cache"
NODE_KEY = "kubernetes.io/hostname"
CACHE_STRATEGIES = ("Memory", "SharedPVC", "NodeLocal")
NODE_BOUND_STRATEGIES = ("Memory", "NodeLocal")

LAYOUT_SCRIPT = """\
set -eu
cd /models
for entry in "$1"/*; do
  [ -e "$entry" ] || continue
  name=${entry##*/}
  [ -e "$name" ] || [ -L "$name" ] || ln -s "$entry" "$name"
done
"""
"""Links each entry of the model directory `$1` (relative to /models) into /models;
a name already there (the directory's own first component) is left alone."""


def _layout(directory: str, model_mount: JSON, *, images: CacheImages) -> tuple[JSON, JSON, JSON]:
    """The `/models` emptyDir, its mount, and the init container that links the model
    directory's entries into it."""
    root_volume = {"name": LAYOUT_VOLUME, "emptyDir": {}}
    root_mount = {"name": LAYOUT_VOLUME, "mountPath": MODELS_MOUNT}
    init = {
        "name": LAYOUT_INIT,
        "image": images.loader,
        "command": ["sh", "-c", LAYOUT_SCRIPT, LAYOUT_INIT, directory],
        "volumeMounts": [root_mount, {**model_mount, "readOnly": True}],
    }
    return root_volume, root_mount, init


def _directory_model(
    *,
    directory: str,
    path: str,
    volume: JSON,
    mount: JSON,
    images: CacheImages,
    extra_volumes: tuple[JSON, ...] = (),
    init_containers: tuple[JSON, ...] = (),
    node_selector: tuple[tuple[str, str], ...] = (),
    cached: bool = False,
) -> ModelLocation:
    """A model mounted at `/models/<directory>`; a directory (not a `.gguf` file) also
    gets the `/models` layout. `extra_volumes`: what else the init containers read (a
    Memory cache's backing copy)."""
    volumes: tuple[JSON, ...] = (volume, *extra_volumes)
    mounts: tuple[JSON, ...] = (mount,)
    inits = init_containers
    if not path.lower().endswith(".gguf"):
        root_volume, root_mount, init = _layout(directory, mount, images=images)
        volumes, mounts, inits = (root_volume, *volumes), (root_mount, *mounts), (*inits, init)
    return ModelLocation(
        path=path,
        local=True,
        volumes=volumes,
        mounts=mounts,
        init_containers=inits,
        node_selector=node_selector,
        cached=cached,
    )


def model_location(
    workload: Workload,
    cache: CacheSpec | None,
    images: CacheImages,
    policy: AdminPolicy = DEFAULT_ADMIN_POLICY,
) -> ModelLocation:
    """Where the server finds the model: the cache's copy, the source's volume, or an id
    the backend fetches itself. Host directories come through claims
    (`render.local_volume`), never a hostPath."""
    if cache is not None:
        served = serving_mount(
            cache, images, policy, pod_selector=tuple(sorted(workload.node_selector))
        )
        model_volume, *backing = served.volumes
        (model_mount,) = served.mounts
        # The cache's own volumes are the cache reconcile's to make, but for a RAM
        # volume on the pod's nodes (`CacheMount.host_volumes`).
        location = _directory_model(
            directory=cache.content_dir,
            path=cache_model_path(cache),
            volume=model_volume,
            mount=model_mount,
            images=images,
            extra_volumes=tuple(backing),
            init_containers=served.init_containers,
            node_selector=served.node_selector,
            cached=True,
        )
        return attrs.evolve(location, host_volumes=served.host_volumes)
    source = workload.source
    if source is None:
        return plain_model_location(workload)
    if source.scheme is Scheme.FILE:
        name = posixpath.basename(source.path) or "source"
        host, sub_path = file_source_volume(workload, policy)
        location = _directory_model(
            directory=name,
            path=f"{MODELS_MOUNT}/{name}",
            volume=host.volume("model-source", read_only=True),
            mount={"name": "model-source", "mountPath": f"{MODELS_MOUNT}/{name}",
                   "readOnly": True, **({"subPath": sub_path} if sub_path else {})},
            images=images,
        )
        return attrs.evolve(location, host_volumes=(host,))
    if source.scheme is Scheme.PVC:
        name = source.file_name or source.repo
        mount: JSON = {
            "name": "model-source",
            "mountPath": f"{MODELS_MOUNT}/{name}",
            "readOnly": True,
        }
        if source.path:
            mount["subPath"] = source.path
        return _directory_model(
            directory=name,
            path=f"{MODELS_MOUNT}/{name}",
            volume={
                "name": "model-source",
                "persistentVolumeClaim": {"claimName": source.repo, "readOnly": True},
            },
            mount=mount,
            images=images,
        )
    if source.scheme is Scheme.HUGGINGFACE:
        return ModelLocation(path=source.repo, local=False, remote=source)
    return ModelLocation(path=source.ollama_tag, local=False, remote=source)


def file_source_volume(workload: Workload, policy: AdminPolicy) -> tuple[HostVolume, str]:
    """A `file://` source's `local` volume on the nodes the workload selects, and the
    path's subPath in it."""
    assert workload.source is not None
    return host_volume(
        workload.source.path,
        namespace=workload.namespace,
        selector=tuple(sorted(workload.node_selector)),
        policy=policy,
    )


# --- a ModelDeployment's plain model ----------------------------------------------------


def _no_files(workload: Workload, what: str) -> InvalidFieldError:
    return InvalidFieldError(
        "spec.model",
        workload.model,
        f"names no ModelCache in namespace {workload.namespace} (none has it as its "
        f"modelPath or name) and is not {what}: add spec.modelCacheRef naming the "
        "ModelCache that holds it, or write a source (HF://org/name, pvc://claim/path)",
    )


def plain_model_location(workload: Workload) -> ModelLocation:
    """A ModelDeployment's plain `model`, no ModelCache matching it: the backend's own
    download convention, or `InvalidFieldError` saying which field to add."""
    model = workload.model.strip()
    backend = workload.backend
    if backend == "ollama":
        return ModelLocation(path=model, local=False)
    has_org = model.count("/") == 1 and not model.startswith("/")
    if backend == "mlc-llm":
        if has_org:
            repo = model
        elif "/" not in model and model.upper().endswith("-MLC"):
            # mlc-ai publishes its compiled models as <Model>-<quantization>-MLC.
            repo = f"mlc-ai/{model}"
        else:
            raise _no_files(
                workload, "a Hugging Face repository (org/name, or a *-MLC name of mlc-ai)"
            )
        source = parse_source(f"HF://{repo}", field="spec.model")
        return ModelLocation(path=source.repo, local=False, remote=source)
    if backend == "llama-cpp":
        if not has_org:
            raise _no_files(workload, "a Hugging Face GGUF repository (org/name[:quant])")
        source = parse_source(f"HF://{model}", field="spec.model")
        return ModelLocation(path=source.repo, local=False, remote=source)
    if model.startswith("/"):
        return ModelLocation(path=model, local=True)  # a path inside the image: nothing to fetch
    if not has_org:
        raise _no_files(workload, "a Hugging Face repository id (org/name) vLLM can fetch")
    return ModelLocation(path=model, local=False)


def cache_serves_plain_model(cache: Mapping[str, Any], model: str) -> bool:
    """Whether a ModelCache holds the model a ModelDeployment names plainly: its
    `modelPath` (the copy's directory), or its name when it has none."""
    spec = get_path(cache, "spec") or {}
    directory = str(spec.get("modelPath") or "").strip("/") or name_of(cache)
    return bool(model) and directory == model.strip().strip("/")


# --- a Model's spec.cache.strategy without a modelCacheRef --------------------------------


def implied_cache_name(model_name: str) -> str:
    return f"{model_name}{IMPLIED_CACHE_SUFFIX}"


def implies_cache(workload: Workload) -> bool:
    return (
        workload.kind is Kind.MODEL
        and not workload.cache_ref
        and workload.cache_strategy in CACHE_STRATEGIES
    )


def implied_cache_manifest(workload: Workload, *, owner: JSON, labels: dict[str, str]) -> JSON:
    """The ModelCache a Model's `spec.cache.strategy` implies (`<model>-cache`, owned by
    the Model), or `InvalidFieldError` naming what the Model must add for it to work."""
    strategy = workload.cache_strategy
    source: Source | None = workload.source
    if source is not None and source.quant:
        raise InvalidFieldError(
            "spec.source",
            workload.model,
            f"carries a :quant tag, which a ModelCache cannot download (spec.cache.strategy "
            f"{strategy}): name the file instead, HF://{source.repo}/<file>.gguf",
        )
    spec: JSON = {"source": workload.model, "storageStrategy": strategy}
    node = dict(workload.node_selector).get(NODE_KEY)
    if strategy in NODE_BOUND_STRATEGIES:
        if not node:
            where = "/dev/shm" if strategy == "Memory" else "/var/lib/flexinfer/models"
            raise InvalidFieldError(
                "spec.nodeSelector",
                dict(workload.node_selector),
                f"names no node, and spec.cache.strategy {strategy} keeps the copy in "
                f"{where} of one node: add spec.nodeSelector: {{{NODE_KEY}: <node>}} (the "
                "Model then runs there too), or set spec.cache.modelCacheRef to a ModelCache "
                "that says where its copy is",
            )
        spec["nodeSelector"] = {NODE_KEY: node}
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelCache",
        "metadata": {
            "name": implied_cache_name(workload.name),
            "namespace": workload.namespace,
            "labels": {**labels, "app.kubernetes.io/component": "implied-model-cache"},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }
