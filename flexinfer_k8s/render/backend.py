"""The one interface every backend renderer implements, and what it is given.

A backend turns a `Workload` and the place its model is (`ModelLocation`) into a
`ServerPlan`: the container's command and args, its environment, the name it serves
the model under, its health path and the init containers and volumes it needs. The
Deployment around it is the same for every backend (`render.workloads`). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs

from flexinfer_k8s.render.local_volume import HostVolume
from flexinfer_k8s.render.source import Source
from flexinfer_k8s.render.workload import Vendor, Workload
from flexinfer_kube.objects import JSON

Pairs = tuple[tuple[str, str], ...]

PORT = 8000
"""Every backend serves the OpenAI API on this container port (its own flags set it)."""
BACKEND_CACHE_DIR = "/var/cache/flexinfer"
"""Where a backend that fetches or compiles its model keeps its files (each backend a
directory of its own below it, named by its cache variable); the frame mounts the
workload's backend-cache claim here (`render.backend_cache`)."""


@attrs.frozen
class ModelLocation:
    """Where the server finds the model: a path inside the container (`local`), or an
    id the backend fetches itself (`remote`: a Hugging Face repository, an Ollama tag,
    as the resource names it or as the backend's own convention resolves a plain name)."""

    path: str
    local: bool
    remote: Source | None = None
    volumes: tuple[JSON, ...] = ()
    mounts: tuple[JSON, ...] = ()
    init_containers: tuple[JSON, ...] = ()
    node_selector: Pairs = ()
    cached: bool = False
    """Filled by a ModelCache (so an Ollama server need not pull)."""
    host_volumes: tuple[HostVolume, ...] = ()
    """Host directories the pod mounts through claims, for the reconcile to make
    (`render.local_volume`)."""


@attrs.frozen
class ServerPlan:
    args: tuple[str, ...]
    served_name: str
    command: tuple[str, ...] = ()
    """Empty: the image's entrypoint is the server (llama.cpp, Ollama)."""
    env: Pairs = ()
    init_containers: tuple[JSON, ...] = ()
    volumes: tuple[JSON, ...] = ()
    mounts: tuple[JSON, ...] = ()
    backend_cache: bool = False
    """The server downloads or compiles into `BACKEND_CACHE_DIR`: the frame mounts the
    workload's backend cache there (and its init containers get it too)."""


class Backend(Protocol):
    name: str
    health_path: str
    shm_size: str
    """The in-memory /dev/shm a server of this backend gets unless the resource sets one."""
    default_images: Mapping[Vendor, str]

    def plan(self, workload: Workload, model: ModelLocation) -> ServerPlan:
        """The server for this workload; `InvalidFieldError` names what cannot work."""
        ...
