"""The cluster-backed `ModelDirectory`: Models, ModelDeployments, their Services, GPUGroups.

One `flexinfer_kube` informer per (resource, namespace) keeps a `Store`; an entry
(`namespace/name`) is recomputed whenever its Model, ModelDeployment or rendered
Service changes, or a GPUGroup that lists it (before or after the change) does, and
listeners are called on the event loop (never on an informer thread) when the entry
changed.

A ModelDeployment's GPUGroup is decided by the core's membership rule, the one the
controller uses: the group that lists it in `spec.models`, whether or not it sets
`gpuGroupRef` (flexinfer_core.membership). Its queue is reported to that group; one
in a membership conflict reports to none (the controller holds it at zero).

A Model advertises its `spec.serviceLabels` (a service label goes to it first) while
its group's statuses say it holds the card (`flexinfer_kube.recorded_status.
card_holders`: every holder of a packed group, docs/election.md 1.7, each Ready one
routed on its own at once); a ModelDeployment those its Service's
`ai.flexinfer/active-services` annotation lists.

A Model is Ready when `status.phase` is Ready; a ModelDeployment when
`status.readyReplicas` >= 1 (or, while the controller does not write that field,
when `status.phase` is Running). A Model's node is `status.nodeName` (where its
server last became Ready). A Model shadows a ModelDeployment of the same name
in the same namespace. Names resolve as `flexinfer_proxy.directory` says.

Where requests go (docs/rendering.md): the Service the controller rendered for the
resource, found by its labels (`app.kubernetes.io/managed-by: flexinfer`,
`ai.flexinfer/kind`, `ai.flexinfer/model`) and its controller ownerReference, at
`http://<service>.<namespace>.svc:<port "http">/v1` (cluster DNS). Until that
Service is seen, the rendered name is assumed (`<name>.<namespace>.svc:8000`); an
`--endpoint` override wins over both. `status.endpoint(s)` are for people and never
used as a URL. Only Services labelled as flexinfer's are watched.

This module reads the cluster; it never writes to it (see `kube_demand`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import timedelta

from flexinfer_core import ACTIVE_SERVICES_ANNOTATION
from flexinfer_core.durations import parse_duration
from flexinfer_core.errors import FlexinferError
from flexinfer_core.membership import membership_of
from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_kube.informers import Informer, Store
from flexinfer_kube.kubeapi import KubeApi
from flexinfer_kube.objects import (
    JSON,
    Key,
    get_path,
    gpu_group_listings,
    gpu_group_member_names,
    gpu_group_ref,
    name_of,
    object_key,
)
from flexinfer_kube.recorded_status import card_holders, gpu_group_packs
from flexinfer_kube.resources import GPU_GROUPS, MODEL_DEPLOYMENTS, MODELS, SERVICES, Resource
from flexinfer_proxy.directory import (
    DEFAULT_COLD_START_TIMEOUT,
    DEFAULT_PRIORITY,
    Listener,
    ModelEntry,
    ModelKind,
    Resolution,
    ResolutionCache,
    resolve_name,
)
from flexinfer_proxy.live_page import RecordedObjects

BACKEND_PORT = 8000
WATCH_TIMEOUT_SECONDS = 30

# The labels the renderer puts on every Service it creates (docs/rendering.md).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "flexinfer"
KIND_LABEL = "ai.flexinfer/kind"
MODEL_LABEL = "ai.flexinfer/model"
RENDERED_SERVICES = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

WATCHED = (MODELS, MODEL_DEPLOYMENTS, GPU_GROUPS, SERVICES)
# A Model shadows a ModelDeployment of the same name in the same namespace.
_RESOLUTION_ORDER = ((MODELS, ModelKind.MODEL), (MODEL_DEPLOYMENTS, ModelKind.MODEL_DEPLOYMENT))
_KINDS = {kind.value: kind for _, kind in _RESOLUTION_ORDER}
_get = get_path

# (namespace, kind, resource name) of a rendered Service's resource.
ServiceKey = tuple[str, ModelKind, str]


def service_endpoint(service: JSON | None) -> str | None:
    """`http://<name>.<namespace>.svc:<port>/v1`, port `http` else 8000 else the first."""
    if service is None:
        return None
    ports = [p for p in _get(service, "spec", "ports") or [] if isinstance(p, Mapping)]
    if not ports:
        return None
    chosen = next((p for p in ports if p.get("name") == "http"), None)
    chosen = chosen or next((p for p in ports if p.get("port") == BACKEND_PORT), ports[0])
    namespace, name = object_key(service)
    return f"http://{name}.{namespace}.svc:{chosen.get('port', BACKEND_PORT)}/v1"


def rendered_for(service: JSON) -> ServiceKey | None:
    """Which resource a Service was rendered for, by its labels; None if not one of ours."""
    labels = _get(service, "metadata", "labels") or {}
    kind = _KINDS.get(str(labels.get(KIND_LABEL) or ""))
    model = str(labels.get(MODEL_LABEL) or "")
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY or kind is None or not model:
        return None
    return (str(_get(service, "metadata", "namespace") or ""), kind, model)


def owned_by(service: JSON, obj: JSON, kind: ModelKind) -> bool:
    """True when the Service's controller ownerReference is `obj` (same uid when both have one)."""
    uid = _get(obj, "metadata", "uid")
    for owner in _get(service, "metadata", "ownerReferences") or []:
        if not isinstance(owner, Mapping) or not owner.get("controller"):
            continue
        same = owner.get("kind") == kind.value and owner.get("name") == _get(
            obj, "metadata", "name"
        )
        return bool(same and (not uid or not owner.get("uid") or owner.get("uid") == uid))
    return False


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
    if _get(obj, "status", "phase") == "Draining":
        return False  # it finishes what it has; new requests wait (docs/election.md 1.6)
    ready_replicas = _get(obj, "status", "readyReplicas")
    if isinstance(ready_replicas, int):
        return bool(ready_replicas >= 1)
    return bool(_get(obj, "status", "phase") == "Running")


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(str(item) for item in value if isinstance(item, str) and item)


def shared_group_of(obj: JSON) -> str:
    """`spec.gpu.shared`: the Model's shared group ("" for none)."""
    return str(_get(obj, "spec", "gpu", "shared") or "")


def _group_index(obj: JSON) -> tuple[str, ...]:
    """A Model's shared group as `namespace/group` (none for a Model alone)."""
    group = shared_group_of(obj)
    return (f"{object_key(obj)[0]}/{group}",) if group else ()


def _active_services(service: JSON | None) -> tuple[str, ...]:
    annotations = _get(service, "metadata", "annotations") or {}
    text = annotations.get(ACTIVE_SERVICES_ANNOTATION) or ""
    return tuple(label.strip() for label in str(text).split(",") if label.strip())


def entry_from_object(
    kind: ModelKind,
    obj: JSON,
    *,
    service: JSON | None,
    override: str | None = None,
    gpu_groups: Mapping[str, Collection[str]] | None = None,
    holders: Collection[str] | None = None,
    packing_groups: Collection[str] = (),
) -> ModelEntry:
    """A Model or ModelDeployment (as the API returns it) as a routable entry.

    `gpu_groups` maps the GPUGroups of its namespace to the names they list; it
    decides a ModelDeployment's group. `holders`: the members of a Model's shared
    group that hold the card (`card_holders`; None: the Model's own status decides).
    `packing_groups`: the GPUGroups of its namespace whose members start side by side
    (`gpu_group_packs`).
    """
    namespace, name = object_key(obj)
    endpoint = (
        override or service_endpoint(service) or f"http://{name}.{namespace}.svc:{BACKEND_PORT}/v1"
    )
    phase = str(_get(obj, "status", "phase") or "")
    service_labels = _strings(_get(obj, "spec", "serviceLabels"))
    if kind is ModelKind.MODEL:
        holding = name in (holders if holders is not None else card_holders([obj]))
        active_services = service_labels if holding else ()
        ready = phase == "Ready"
        cold_start = _model_cold_start(obj)
        gpu_group = None
        priority = _get(obj, "spec", "gpu", "priority")
    else:
        ready = _deployment_ready(obj)
        seconds = _get(obj, "spec", "coldStartTimeoutSeconds")
        cold_start = (
            timedelta(seconds=seconds) if isinstance(seconds, int) else DEFAULT_COLD_START_TIMEOUT
        )
        gpu_group = membership_of(name, group_ref=gpu_group_ref(obj), groups=gpu_groups or {}).group
        priority = _get(obj, "spec", "priority")
        active_services = _active_services(service)
    served = _get(obj, "status", "servedModelName")
    node = _get(obj, "status", "nodeName") if kind is ModelKind.MODEL else None
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
        served_name=served if isinstance(served, str) and served and served != name else None,
        service_labels=service_labels,
        active_services=active_services,
        priority=priority if isinstance(priority, int) else DEFAULT_PRIORITY,
        node=node if isinstance(node, str) and node else None,
        side_by_side=gpu_group is not None and gpu_group in packing_groups,
    )


class KubeDirectory:
    """A `ModelDirectory` kept current by watching the API server.

    `endpoint_overrides` maps a model's name (or `namespace/name`) to a base URL.
    """

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
        # A Model's entry reads its shared group-mates' statuses (`card_holders`).
        self._stores[MODELS] = Store(MODELS, indexers={"group": _group_index})
        self._entries: dict[str, ModelEntry] = {}
        self._homes: dict[str, set[str]] = {}  # name -> namespaces with an entry of it
        self._labelled: dict[str, set[str]] = {}  # service label -> keys of entries
        self._services: dict[ServiceKey, JSON] = {}
        self._resolved = ResolutionCache()  # cleared whenever an entry changes
        self._listeners: list[Listener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._informers = [
            Informer(
                api,
                resource,
                self._stores[resource],
                namespace=namespace or None,
                on_change=functools.partial(self._on_change, resource),
                watch_timeout=watch_timeout_seconds,
                label_selector=RENDERED_SERVICES if resource is SERVICES else None,
            )
            for resource in WATCHED
            for namespace in self._namespaces or ("",)
        ]

    @property
    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self._informers)

    def resolve(self, requested: str, *, reachable: frozenset[str] | None = None) -> Resolution:
        with self._lock:
            made = self._resolved.get(requested, reachable)
            if made is not None:
                return made
            resolution = resolve_name(
                requested,
                by_namespace=lambda namespace, name: self._entries.get(f"{namespace}/{name}"),
                homes=lambda name: sorted(self._homes.get(name, ())),
                label_members=self._label_members,
                namespace_order=self._namespaces,
                reachable=reachable,
            )
            return self._resolved.put(requested, reachable, resolution)

    def lookup(self, key: str) -> ModelEntry | None:
        return self._entries.get(key)

    def entries(self) -> Sequence[ModelEntry]:
        with self._lock:
            current = list(self._entries.values())
        return sorted(current, key=lambda e: (e.name, e.namespace))

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def recorded_objects(self) -> RecordedObjects:
        """The objects as last seen, status and all (the live page reads them)."""
        return RecordedObjects(
            models=self._stores[MODELS].objects(),
            model_deployments=self._stores[MODEL_DEPLOYMENTS].objects(),
            gpu_groups=self._stores[GPU_GROUPS].objects(),
        )

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for informer in self._informers:
            informer.start()

    async def stop(self) -> None:
        """Stop the informers (their open watches are shut down)."""
        for informer in self._informers:
            informer.stop()

    def _label_members(self, label: str) -> list[ModelEntry]:
        keys = self._labelled.get(label, ())
        return [self._entries[key] for key in keys if key in self._entries]

    def _on_change(self, resource: Resource, old: JSON | None, new: JSON | None) -> None:
        with self._lock:
            if resource is SERVICES:
                keys = self._service_changed(old, new)
            elif resource is GPU_GROUPS:
                # Its members, as listed before and after, may have changed hands.
                keys = {
                    (object_key(group)[0], member)
                    for group in (old, new)
                    if group is not None
                    for member in gpu_group_member_names(group)
                }
            else:
                keys = {object_key(obj) for obj in (old, new) if obj is not None}
                if resource is MODELS:
                    keys |= self._model_changed(old, new)
            changed = self._recompute(keys)
        self._notify(changed)

    def _service_changed(self, old: JSON | None, new: JSON | None) -> set[Key]:
        """Index a rendered Service by its resource; return the entries it feeds."""
        owners = set()
        if old is not None and (owner := rendered_for(old)) is not None:
            self._services.pop(owner, None)
            owners.add(owner)
        if new is not None and (owner := rendered_for(new)) is not None:
            self._services[owner] = new
            owners.add(owner)
        return {(namespace, name) for namespace, _, name in owners}

    def _model_changed(self, old: JSON | None, new: JSON | None) -> set[Key]:
        """The Model's shared group-mates, before and after the change (who holds
        their card may read this Model's status)."""
        store = self._stores[MODELS]
        return {
            object_key(mate)
            for obj in (old, new)
            if obj is not None
            for value in _group_index(obj)
            for mate in store.by_index("group", value)
        }

    # -- the view (under the lock) -------------------------------------------------

    def _recompute(self, keys: Iterable[Key]) -> list[str]:
        """Rebuild the entries named by `keys`; return the keys of those that changed."""
        changed = []
        for namespace, name in sorted(keys):
            key = f"{namespace}/{name}"
            entry = self._resolve(namespace, name)
            previous = self._entries.get(key)
            if entry == previous:
                continue
            if previous is not None:
                for label in previous.service_labels:
                    self._labelled.get(label, set()).discard(key)
            if entry is None:
                self._entries.pop(key, None)
                homes = self._homes.get(name, set())
                homes.discard(namespace)
                if not homes:
                    self._homes.pop(name, None)
            else:
                self._entries[key] = entry
                self._homes.setdefault(name, set()).add(namespace)
                for label in entry.service_labels:
                    self._labelled.setdefault(label, set()).add(key)
            changed.append(key)
        if changed:
            self._resolved.clear()
        return changed

    def _resolve(self, namespace: str, name: str) -> ModelEntry | None:
        override = self._overrides.get(f"{namespace}/{name}") or self._overrides.get(name)
        for resource, kind in _RESOLUTION_ORDER:
            obj = self._stores[resource].get(namespace, name)
            if obj is None:
                continue
            service = self._services.get((namespace, kind, name))
            if service is not None and not owned_by(service, obj, kind):
                service = None
            holders = None
            if kind is ModelKind.MODEL and (group := _group_index(obj)):
                holders = card_holders(self._stores[MODELS].by_index("group", group[0]))
            groups = self._stores[GPU_GROUPS].objects(namespace)
            return entry_from_object(
                kind,
                obj,
                service=service,
                override=override,
                gpu_groups=gpu_group_listings(groups),
                holders=holders,
                packing_groups={name_of(g) for g in groups if gpu_group_packs(g)},
            )
        return None

    def _notify(self, keys: list[str]) -> None:
        loop = self._loop
        if not keys or loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutdown)
            for key in keys:
                for listener in list(self._listeners):
                    loop.call_soon_threadsafe(listener, key)
