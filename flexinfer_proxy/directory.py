"""Where each model lives and whether it can serve: the `ModelDirectory` seam.

The HTTP layer asks a directory to `resolve` the name a client puts in the
request's `model` field and subscribes to changes (to drain a queue when its model
turns Ready). A name resolves, in order, to:

1. `namespace/name`: that namespace's Model (or ModelDeployment) of that name, else
   its members that list `name` as a service label;
2. a bare name: in every namespace where it means something, as a model's name (a
   Model shadows a ModelDeployment of the same name) or as a service label
   (`spec.serviceLabels`), the first such namespace the proxy was told to watch;
   when it watches every namespace and several have it, the answer is an ambiguity
   naming them, never one of them: a tenant must not capture another team's
   requests by creating a model named like that team's model or service label;
3. within the chosen namespace, a model's name before a service label. A service
   label goes to the member that advertises it (a Model whose status says it holds
   the card, `flexinfer_kube.recorded_status.card_holders`; a ModelDeployment whose
   Service lists it in `ai.flexinfer/active-services`), else a Ready one, else the
   advertised one still loading, else the best by priority (then name), which the
   queue then wakes.

A client whose API key reaches only some namespaces resolves names among those only
(`reachable`): the other namespaces' models do not exist for it.

`InMemoryDirectory` is the directory tests and static setups use;
`flexinfer_proxy.kube_directory` fills the same view from the cluster. This module
performs no I/O and reads no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Protocol

import attrs

from flexinfer_core import Policy

Listener = Callable[[str], None]

# What a Model or ModelDeployment read without these fields defaults to (the core's).
DEFAULT_COLD_START_TIMEOUT = Policy.COLD_START_TIMEOUT
DEFAULT_PRIORITY = Policy.PRIORITY


class ModelKind(enum.Enum):
    """Which resource a name resolves to; it decides where demand is written."""

    MODEL = "Model"
    MODEL_DEPLOYMENT = "ModelDeployment"


@attrs.frozen
class ModelEntry:
    """One routable model: enough to forward a request and to signal demand for it.

    `endpoint` is the base URL of the backend's OpenAI API, ending in `/v1`.
    `gpu_group` is the GPUGroup that governs a ModelDeployment, by the core's rule
    (flexinfer_core.membership: the group that lists it); None for a Model, a
    standalone ModelDeployment, or one whose membership is in conflict.
    `served_name` is what the backend calls the model when that is not `name`
    (`status.servedModelName`). `active_services` are the service labels it
    advertises: a Model's own while it holds its group's card.
    `node` is the node a Model's server last became Ready on (`status.nodeName`;
    None when it never has, and for a ModelDeployment): its swap times are kept by it.
    `side_by_side`: its GPUGroup packs (`recorded_status.gpu_group_packs`): members
    that fit start together rather than one after another.
    """

    name: str
    namespace: str
    kind: ModelKind
    ready: bool
    endpoint: str
    phase: str = ""
    cold_start_timeout: timedelta = DEFAULT_COLD_START_TIMEOUT
    gpu_group: str | None = None
    created: int = 0
    served_name: str | None = None
    service_labels: tuple[str, ...] = ()
    active_services: tuple[str, ...] = ()
    priority: int = DEFAULT_PRIORITY
    node: str | None = None
    side_by_side: bool = False
    # `namespace/name`: unique across the cluster (queues, demand and metrics are kept
    # by it). Made once: it is read several times for every request.
    key: str = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.namespace}/{self.name}")

    @property
    def backend_model(self) -> str:
        """The `model` the backend expects in a request body."""
        return self.served_name or self.name

    @property
    def reports_queue(self) -> bool:
        """GPUGroup members signal demand as queue reports, not as a timestamp."""
        return self.kind is ModelKind.MODEL_DEPLOYMENT and bool(self.gpu_group)


@attrs.frozen
class Resolution:
    """What a requested name means: one entry, nothing, or several namespaces' models."""

    entry: ModelEntry | None = None
    ambiguous: tuple[str, ...] = ()  # the namespaces where the name means something
    labelled_in: tuple[str, ...] = ()  # those of `ambiguous` where it is a service label
    by_service_label: bool = False


def _best(entries: Iterable[ModelEntry]) -> ModelEntry:
    return min(entries, key=lambda e: (-e.priority, e.name, e.namespace))


def choose_for_service_label(label: str, candidates: Sequence[ModelEntry]) -> ModelEntry:
    """The member that should answer a request for `label` (see the module docstring)."""
    holders = [e for e in candidates if label in e.active_services]
    pools: tuple[Sequence[ModelEntry], ...] = (
        [e for e in holders if e.ready],
        [e for e in candidates if e.ready],
        holders,
        candidates,
    )
    for pool in pools:
        if pool:
            return _best(pool)
    raise ValueError(f"no candidate serves {label!r}")


def resolve_name(
    requested: str,
    *,
    by_namespace: Callable[[str, str], ModelEntry | None],
    homes: Callable[[str], Sequence[str]],
    label_members: Callable[[str], Sequence[ModelEntry]],
    namespace_order: Sequence[str],
    reachable: Collection[str] | None = None,
) -> Resolution:
    """Resolve `requested` over a view given as three look-ups (see the module docstring).

    `by_namespace(namespace, name)` is the entry of that name there; `homes(name)` the
    namespaces that have an entry of that name; `label_members(label)` every entry
    that lists the label. An empty `namespace_order` means "every namespace".
    `reachable` (None: every namespace) are the namespaces the client may reach (its
    API key's): the others' models do not exist for it.
    """

    namespace, slash, name = requested.partition("/")
    if slash:
        if not _allowed(namespace, namespace_order, reachable):
            return Resolution()
        entry = by_namespace(namespace, name)
        if entry is not None:
            return Resolution(entry)
        members = [e for e in label_members(name) if e.namespace == namespace]
        if members:
            return Resolution(choose_for_service_label(name, members), by_service_label=True)
        return Resolution()
    # Every namespace where the name means something, by a model's name or by a
    # service label, competes on equal terms: a tenant's Model named like another
    # team's service label must not take that team's requests.
    found_in = homes(requested)
    labelled = label_members(requested)
    if not labelled and len(found_in) == 1:
        # The usual request: a model's name, in one namespace, no label of that name.
        home = found_in[0]
        if _allowed(home, namespace_order, reachable):
            return Resolution(by_namespace(home, requested))
        return Resolution()
    named = {ns for ns in found_in if _allowed(ns, namespace_order, reachable)}
    labelled = [e for e in labelled if _allowed(e.namespace, namespace_order, reachable)]
    found = named | {e.namespace for e in labelled}
    if not found:
        return Resolution()
    chosen = _first_namespace(found, namespace_order)
    if chosen is None:
        return Resolution(
            ambiguous=tuple(sorted(found)),
            labelled_in=tuple(sorted(found - named)),
        )
    if chosen in named:
        return Resolution(by_namespace(chosen, requested))
    local = [e for e in labelled if e.namespace == chosen]
    return Resolution(choose_for_service_label(requested, local), by_service_label=True)


def _allowed(namespace: str, order: Sequence[str], reachable: Collection[str] | None) -> bool:
    """Watched (`--namespace`, none: all) and reachable (the client's key, None: all)."""
    return (not order or namespace in order) and (reachable is None or namespace in reachable)


def _first_namespace(found: Iterable[str], order: Sequence[str]) -> str | None:
    """The namespace to use among `found`; None when that would be a guess."""
    present = set(found)
    if order:
        return next((ns for ns in order if ns in present), None)
    return next(iter(present)) if len(present) == 1 else None


class ResolutionCache:
    """Resolutions made since the view last changed: every request resolves its name,
    and most name the same few models. The owner clears it on every change of the
    view; a client inventing names clears it when it is full, never grows it."""

    KEPT = 1024

    def __init__(self) -> None:
        self._made: dict[tuple[str, frozenset[str] | None], Resolution] = {}

    def get(self, requested: str, reachable: frozenset[str] | None) -> Resolution | None:
        return self._made.get((requested, reachable))

    def put(
        self, requested: str, reachable: frozenset[str] | None, resolution: Resolution
    ) -> Resolution:
        if len(self._made) >= self.KEPT:
            self._made.clear()
        self._made[(requested, reachable)] = resolution
        return resolution

    def clear(self) -> None:
        self._made.clear()


class ModelDirectory(Protocol):
    """A read view of the routable models, kept current by whoever implements it."""

    @property
    def synced(self) -> bool:
        """True once the view is complete enough to route (initial lists done)."""
        ...

    def resolve(self, requested: str, *, reachable: frozenset[str] | None = None) -> Resolution:
        """What a request's `model` names, among the `reachable` namespaces (None: all)."""
        ...

    def lookup(self, key: str) -> ModelEntry | None:
        """The entry with `key` (`namespace/name`), as it is now."""
        ...

    def entries(self) -> Sequence[ModelEntry]: ...

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(key)` on the event loop whenever that entry changes."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class InMemoryDirectory:
    """A directory whose entries are set by its owner (tests, static configuration).

    `put` and `remove` must be called on the event loop's thread: listeners run
    synchronously inside them. Names and keys are both accepted where an entry is
    named, as long as the bare name is unique.
    """

    def __init__(
        self, entries: Iterable[ModelEntry] = (), *, namespaces: Sequence[str] = ()
    ) -> None:
        self._entries: dict[str, ModelEntry] = {}
        self._homes: dict[str, dict[str, None]] = {}  # name -> namespaces that have it
        self._labelled: dict[str, dict[str, None]] = {}  # service label -> keys
        self._resolved = ResolutionCache()
        self._namespaces = tuple(namespaces)
        self._listeners: list[Listener] = []
        for entry in entries:
            self._store(entry)

    @property
    def synced(self) -> bool:
        return True

    def resolve(self, requested: str, *, reachable: frozenset[str] | None = None) -> Resolution:
        made = self._resolved.get(requested, reachable)
        if made is not None:
            return made
        resolution = resolve_name(
            requested,
            by_namespace=lambda namespace, name: self._entries.get(f"{namespace}/{name}"),
            homes=lambda name: list(self._homes.get(name, ())),
            label_members=lambda label: [
                self._entries[key] for key in self._labelled.get(label, ())
            ],
            namespace_order=self._namespaces,
            reachable=reachable,
        )
        return self._resolved.put(requested, reachable, resolution)

    def lookup(self, key: str) -> ModelEntry | None:
        return self._entries.get(key)

    def entries(self) -> Sequence[ModelEntry]:
        return sorted(self._entries.values(), key=lambda e: (e.name, e.namespace))

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def put(self, entry: ModelEntry) -> None:
        self._store(entry)
        self._notify(entry.key)

    def _store(self, entry: ModelEntry) -> None:
        self._resolved.clear()
        previous = self._entries.get(entry.key)
        if previous is not None:
            self._unlabel(previous)
        self._entries[entry.key] = entry
        self._homes.setdefault(entry.name, {})[entry.namespace] = None
        for label in entry.service_labels:
            self._labelled.setdefault(label, {})[entry.key] = None

    def _unlabel(self, entry: ModelEntry) -> None:
        for label in entry.service_labels:
            keys = self._labelled.get(label, {})
            keys.pop(entry.key, None)
            if not keys:
                self._labelled.pop(label, None)

    def set_ready(self, name: str, ready: bool = True) -> None:
        entry = self._named(name)
        self.put(attrs.evolve(entry, ready=ready, phase="Ready" if ready else "Idle"))

    def remove(self, name: str) -> None:
        entry = self._named(name)
        self._resolved.clear()
        del self._entries[entry.key]
        self._unlabel(entry)
        homes = self._homes[entry.name]
        del homes[entry.namespace]
        if not homes:
            del self._homes[entry.name]
        self._notify(entry.key)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def _named(self, name: str) -> ModelEntry:
        if name in self._entries:
            return self._entries[name]
        (entry,) = [e for e in self._entries.values() if e.name == name]
        return entry

    def _notify(self, key: str) -> None:
        for listener in list(self._listeners):
            listener(key)


def entries_by_name(entries: Iterable[ModelEntry]) -> Mapping[str, list[ModelEntry]]:
    """Entries grouped by bare name (several when namespaces share a name)."""
    grouped: dict[str, list[ModelEntry]] = {}
    for entry in entries:
        grouped.setdefault(entry.name, []).append(entry)
    return grouped
