"""The cluster-backed `ModelDirectory`: list+watch Models, ModelDeployments, Services.

One daemon thread per (resource, namespace) lists, then watches from the list's
resourceVersion (bookmarks on); a 410 Gone re-lists, any other failure backs off
and re-lists. Objects are kept raw; a name's `ModelEntry` is recomputed whenever
its Model, ModelDeployment or Service changes, and listeners are called on the
event loop (never on a watch thread) when the entry changed.

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
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import attrs
from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from flexinfer_core.durations import parse_duration
from flexinfer_core.errors import FlexinferError
from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_proxy.directory import (
    DEFAULT_COLD_START_TIMEOUT,
    Listener,
    ModelEntry,
    ModelKind,
)

log = logging.getLogger("flexinfer.proxy.directory")

JSON = dict[str, Any]
Key = tuple[str, str]
GROUP = "ai.flexinfer"
BACKEND_PORT = 8000
WATCH_TIMEOUT_SECONDS = 30
RETRY_SECONDS = 2.0


@attrs.frozen
class WatchedResource:
    kind: str
    version: str
    plural: str


MODELS = WatchedResource("Model", "v1alpha2", "models")
MODEL_DEPLOYMENTS = WatchedResource("ModelDeployment", "v1alpha1", "modeldeployments")
SERVICES = WatchedResource("Service", "v1", "services")
WATCHED = (MODELS, MODEL_DEPLOYMENTS, SERVICES)
# A Model shadows a ModelDeployment of the same name in the same namespace.
_RESOLUTION_ORDER = ((MODELS, ModelKind.MODEL), (MODEL_DEPLOYMENTS, ModelKind.MODEL_DEPLOYMENT))
# The watch helper is untyped; calling it through Any keeps mypy --strict honest elsewhere.
_new_watch: Any = k8s_watch.Watch


def _get(obj: Mapping[str, Any] | None, *path: str) -> Any:
    value: Any = obj
    for part in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def object_key(obj: JSON) -> Key:
    return (str(_get(obj, "metadata", "namespace") or ""), str(_get(obj, "metadata", "name")))


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


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class KubeDirectory:
    """A `ModelDirectory` kept current by watching the API server."""

    def __init__(
        self,
        api_client: Any,
        *,
        namespaces: Sequence[str] = (),
        endpoint_overrides: Mapping[str, str] | None = None,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
    ) -> None:
        self._api_client = api_client
        self._namespaces: tuple[str, ...] = tuple(dict.fromkeys(namespaces))
        self._overrides = dict(endpoint_overrides or {})
        self._watch_timeout = watch_timeout_seconds
        self._lock = threading.Lock()
        self._objects: dict[str, dict[Key, JSON]] = {r.kind: {} for r in WATCHED}
        self._entries: dict[str, ModelEntry] = {}
        self._homes: dict[str, set[str]] = {}
        self._listed: set[tuple[str, str]] = set()
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def synced(self) -> bool:
        scopes = self._namespaces or ("",)
        return len(self._listed) >= len(WATCHED) * len(scopes)

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
        for resource in WATCHED:
            for namespace in self._namespaces or ("",):
                thread = threading.Thread(
                    target=self._run,
                    args=(resource, namespace),
                    name=f"watch-{resource.plural}-{namespace or 'all'}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()

    async def stop(self) -> None:
        """Signal the watch threads; they end at their next event or watch timeout."""
        self._stop.set()

    # -- watch threads -----------------------------------------------------

    def _run(self, resource: WatchedResource, namespace: str) -> None:
        while not self._stop.is_set():
            try:
                version = self._list(resource, namespace)
                self._watch(resource, namespace, version)
            except _Gone:
                log.info("watch of %s in %r expired; listing again", resource.plural, namespace)
            except Exception:
                if self._stop.is_set():
                    return  # the client may already be closed under us
                log.exception("watching %s in %r failed; retrying", resource.plural, namespace)
                self._stop.wait(RETRY_SECONDS)

    def _list_call(
        self, resource: WatchedResource, namespace: str
    ) -> tuple[Callable[..., Any], JSON]:
        if resource is SERVICES:
            core = k8s_client.CoreV1Api(self._api_client)
            if namespace:
                return core.list_namespaced_service, {"namespace": namespace}
            return core.list_service_for_all_namespaces, {}
        custom = k8s_client.CustomObjectsApi(self._api_client)
        args: JSON = {"group": GROUP, "version": resource.version, "plural": resource.plural}
        if namespace:
            return custom.list_namespaced_custom_object, {**args, "namespace": namespace}
        return custom.list_cluster_custom_object, args

    def _list(self, resource: WatchedResource, namespace: str) -> str:
        call, kwargs = self._list_call(resource, namespace)
        listing = self._api_client.sanitize_for_serialization(call(**kwargs))
        items = [i for i in listing.get("items") or [] if isinstance(i, dict)]
        self._replace(resource, namespace, items)
        return str(_get(listing, "metadata", "resourceVersion") or "")

    def _watch(self, resource: WatchedResource, namespace: str, version: str) -> None:
        call, kwargs = self._list_call(resource, namespace)
        while not self._stop.is_set():
            watcher = _new_watch()
            try:
                stream = watcher.stream(
                    call,
                    **kwargs,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self._watch_timeout,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    version = self._handle_event(resource, event) or version
            except ApiException as error:
                if error.status == 410:
                    raise _Gone() from error
                raise
            finally:
                watcher.stop()

    def _handle_event(self, resource: WatchedResource, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        raw = event.get("raw_object")
        if not isinstance(raw, dict):
            return None
        if kind == "ERROR":
            if raw.get("code") == 410:
                raise _Gone()
            raise RuntimeError(f"watch error: {raw.get('message')}")
        version = str(_get(raw, "metadata", "resourceVersion") or "") or None
        if kind == "BOOKMARK":
            return version
        with self._lock:
            store = self._objects[resource.kind]
            if kind == "DELETED":
                store.pop(object_key(raw), None)
            else:
                store[object_key(raw)] = raw
            changed = self._recompute([object_key(raw)])
        self._notify(changed)
        return version

    def _replace(self, resource: WatchedResource, namespace: str, items: Iterable[JSON]) -> None:
        with self._lock:
            store = self._objects[resource.kind]
            keys = {k for k in store if not namespace or k[0] == namespace}
            for key in keys:
                del store[key]
            for item in items:
                store[object_key(item)] = item
                keys.add(object_key(item))
            changed = self._recompute(keys)
            self._listed.add((resource.kind, namespace))
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
        key = (namespace, name)
        present = any(key in self._objects[r.kind] for r, _ in _RESOLUTION_ORDER)
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
            key = (namespace, name)
            service = self._objects[SERVICES.kind].get(key)
            for resource, kind in _RESOLUTION_ORDER:
                obj = self._objects[resource.kind].get(key)
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
