"""The cluster-backed `ModelDirectory`: Models, ModelDeployments and Services, watched.

One `flexinfer_kube` informer per (resource, namespace) keeps a `Store`; a name's
`ModelEntry` is recomputed whenever its Model, ModelDeployment or Service changes,
and listeners are called on the event loop (never on an informer thread) when the
entry changed.

A Model is Ready when `status.phase` is Ready; a ModelDeployment when
`status.readyReplicas` >= 1 (or, while the controller does not write that field,
when `status.phase` is Running).

A name resolves to the first namespace (in the order given) that has it, a Model
before a ModelDeployment. The endpoint is, in order: an explicit override, the
Service named like the model (its `http` port, else 8000, else its first port),
the status' endpoint, `http://<name>.<namespace>.svc:8000/v1`.

This module reads the cluster; it never writes to it (see `kube_demand`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

from flexinfer_core.durations import parse_duration
from flexinfer_core.errors import FlexinferError
from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_kube.informers import Informer, Store
from flexinfer_kube.kubeapi import KubeApi
from flexinfer_kube.objects import JSON, Key, get_path, object_key
from flexinfer_kube.resources import MODEL_DEPLOYMENTS, MODELS, SERVICES, Resource
from flexinfer_proxy.directory import (
    DEFAULT_COLD_START_TIMEOUT,
    Listener,
    ModelEntry,
    ModelKind,
)

BACKEND_PORT = 8000
WATCH_TIMEOUT_SECONDS = 30

WATCHED = (MODELS, MODEL_DEPLOYMENTS, SERVICES)
# A Model shadows a ModelDeployment of the same name in the same namespace.
_RESOLUTION_ORDER = ((MODELS, ModelKind.MODEL), (MODEL_DEPLOYMENTS, ModelKind.MODEL_DEPLOYMENT))
_get = get_path


def service_endpoint(service: JSON | None) -> str | None:
    if service is None:
        return None
    ports = [p for p in _get(service, "spec", "ports") or [] if isinstance(p, Mapping)]
    if not ports:
        return None
    chosen = next((p for p in ports if p.get("name") == "http"), None)
    chosen = chosen or next((p for p in ports if p.get("port") == BACKEND_PORT), ports[0])
    namespace, name = object_key(service)
    return f"http://{name}.{namespace}.svc:{chosen.get('port', BACKEND_PORT)}/v1"


def _created(obj: JSON) -> int:
    created = parse_rfc3339(_get(obj, "metadata", "creationTimestamp"))
    return int(created.timestamp()) if created else 0


def _model_cold_start(obj: JSON) -> timedelta:
    text = _get(obj, "spec", "serverless", "coldStartTimeout")
    if text is None:
        return DEFAULT_COLD_START_TIMEOUT
    try:
        return parse_duration(text, field="spec.serverless.coldStartTimeout")
    except FlexinferError:
        return DEFAULT_COLD_START_TIMEOUT


def _deployment_ready(obj: JSON) -> bool:
    ready_replicas = _get(obj, "status", "readyReplicas")
    if isinstance(ready_replicas, int):
        return bool(ready_replicas >= 1)
    return bool(_get(obj, "status", "phase") == "Running")


def _status_endpoint(obj: JSON) -> str | None:
    single = _get(obj, "status", "endpoint")
    if isinstance(single, str) and single:
        return single
    many = _get(obj, "status", "endpoints")
    if isinstance(many, list) and many and isinstance(many[0], str) and many[0]:
        return many[0]
    return None


def entry_from_object(
    kind: ModelKind, obj: JSON, *, service: JSON | None, override: str | None = None
) -> ModelEntry:
    """A Model or ModelDeployment (as the API returns it) as a routable entry."""
    namespace, name = object_key(obj)
    endpoint = (
        override
        or service_endpoint(service)
        or _status_endpoint(obj)
        or f"http://{name}.{namespace}.svc:{BACKEND_PORT}/v1"
    )
    phase = str(_get(obj, "status", "phase") or "")
    if kind is ModelKind.MODEL:
        ready = phase == "Ready"
        cold_start = _model_cold_start(obj)
        gpu_group = None
    else:
        ready = _deployment_ready(obj)
        seconds = _get(obj, "spec", "coldStartTimeoutSeconds")
        cold_start = (
            timedelta(seconds=seconds) if isinstance(seconds, int) else DEFAULT_COLD_START_TIMEOUT
        )
        gpu_group = str(_get(obj, "spec", "gpuGroupRef") or "") or None
    return ModelEntry(
        name=name,
        namespace=namespace,
        kind=kind,
        ready=ready,
        endpoint=endpoint,
        phase=phase,
        cold_start_timeout=cold_start,
        gpu_group=gpu_group,
        created=_created(obj),
    )


class KubeDirectory:
    """A `ModelDirectory` kept current by watching the API server."""

    def __init__(
        self,
        api: KubeApi,
        *,
        namespaces: Sequence[str] = (),
        endpoint_overrides: Mapping[str, str] | None = None,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
    ) -> None:
        self._namespaces: tuple[str, ...] = tuple(dict.fromkeys(namespaces))
        self._overrides = dict(endpoint_overrides or {})
        self._lock = threading.Lock()
        self._stores: dict[Resource, Store] = {r: Store(r) for r in WATCHED}
        self._entries: dict[str, ModelEntry] = {}
        self._homes: dict[str, set[str]] = {}
        self._listeners: list[Listener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._informers = [
            Informer(
                api,
                resource,
                self._stores[resource],
                namespace=namespace or None,
                on_change=self._on_change,
                watch_timeout=watch_timeout_seconds,
            )
            for resource in WATCHED
            for namespace in self._namespaces or ("",)
        ]

    @property
    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self._informers)

    def lookup(self, name: str) -> ModelEntry | None:
        return self._entries.get(name)

    def entries(self) -> Sequence[ModelEntry]:
        with self._lock:
            current = list(self._entries.values())
        return sorted(current, key=lambda e: (e.name, e.namespace))

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for informer in self._informers:
            informer.start()

    async def stop(self) -> None:
        """Stop the informers (their open watches are shut down)."""
        for informer in self._informers:
            informer.stop()

    def _on_change(self, old: JSON | None, new: JSON | None) -> None:
        keys = {object_key(obj) for obj in (old, new) if obj is not None}
        with self._lock:
            changed = self._recompute(keys)
        self._notify(changed)

    # -- the view ------------------------------------------------------------

    def _recompute(self, keys: Iterable[Key]) -> list[str]:
        """Rebuild the entries named by `keys` (under the lock); return the changed names."""
        names = set()
        for namespace, name in keys:
            self._index(namespace, name)
            names.add(name)
        changed = []
        for name in sorted(names):
            entry = self._resolve(name)
            if entry != self._entries.get(name):
                if entry is None:
                    self._entries.pop(name, None)
                else:
                    self._entries[name] = entry
                changed.append(name)
        return changed

    def _index(self, namespace: str, name: str) -> None:
        """Keep `_homes` (name → namespaces with a Model or ModelDeployment of it) current."""
        present = any(
            self._stores[resource].get(namespace, name) is not None
            for resource, _ in _RESOLUTION_ORDER
        )
        homes = self._homes.setdefault(name, set())
        if present:
            homes.add(namespace)
        else:
            homes.discard(namespace)
            if not homes:
                del self._homes[name]

    def _namespace_order(self, name: str) -> list[str]:
        if self._namespaces:
            return list(self._namespaces)
        return sorted(self._homes.get(name, ()))

    def _resolve(self, name: str) -> ModelEntry | None:
        for namespace in self._namespace_order(name):
            service = self._stores[SERVICES].get(namespace, name)
            for resource, kind in _RESOLUTION_ORDER:
                obj = self._stores[resource].get(namespace, name)
                if obj is not None:
                    return entry_from_object(
                        kind, obj, service=service, override=self._overrides.get(name)
                    )
        return None

    def _notify(self, names: list[str]) -> None:
        loop = self._loop
        if not names or loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutdown)
            for name in names:
                for listener in list(self._listeners):
                    loop.call_soon_threadsafe(listener, name)
