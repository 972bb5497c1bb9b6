"""List + watch into an in-memory cache, one thread per (resource, namespace).

An `Informer` lists its resource, then watches from the list's resourceVersion
with bookmarks; a 410 Gone (or an ERROR event saying so) re-lists; any other
failure backs off and re-lists. Every change is handed to `on_change(old, new)`
(either side None for add/delete) after the `Store` is updated, so handlers read a
cache that already contains the change. Writers put the objects the API server
returns into the store right away (`Store.write_through`), so the controller never
decides on a view older than its own last write; a watch event older than what the
store holds is dropped.

`healthy` says whether the last list succeeded: a reader that cannot list (e.g. RBAC
removed for GPULeases) keeps the informer unhealthy, and the controller fails open
on leases. This module knows nothing about flexinfer's resources.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flexinfer_kube.kubeapi import JSON, Gone, KubeApi, KubeError, Transient
from flexinfer_kube.objects import Key, object_key
from flexinfer_kube.resources import Resource

log = logging.getLogger("flexinfer.informers")

ChangeHandler = Callable[[JSON | None, JSON | None], None]


def resource_version(obj: JSON | None) -> int:
    """resourceVersion as an integer for ordering (opaque in theory, etcd revisions here)."""
    if obj is None:
        return -1
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


Indexer = Callable[[JSON], Iterable[str]]
"""The index values of an object (e.g. its group); an object may have none or several."""


class Store:
    """Thread-safe cache of one resource's objects, keyed by (namespace, name).

    Objects are also indexed by namespace and by any `indexers` given (client-go's
    Indexer), so a lookup by group, owner or label reads a few objects, not every
    object of the namespace: what keeps a reconcile cheap with a thousand Models.
    """

    def __init__(
        self, resource: Resource, *, indexers: Mapping[str, Indexer] | None = None
    ) -> None:
        self.resource = resource
        self._items: dict[Key, JSON] = {}
        self._indexers: dict[str, Indexer] = {
            "namespace": lambda obj: (object_key(obj)[0],),
            **(indexers or {}),
        }
        self._index: dict[str, dict[str, set[Key]]] = {name: {} for name in self._indexers}
        self._lock = threading.Lock()

    def get(self, namespace: str, name: str) -> JSON | None:
        with self._lock:
            return self._items.get((namespace, name))

    def objects(self, namespace: str | None = None) -> list[JSON]:
        if namespace is not None:
            return self.by_index("namespace", namespace)
        with self._lock:
            return list(self._items.values())

    def by_index(self, index: str, value: str) -> list[JSON]:
        """The objects whose `index` values include `value`."""
        with self._lock:
            keys = self._index[index].get(value, ())
            return [self._items[key] for key in keys]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    # -- keeping the items and the indexes together (callers hold the lock) ------------

    def _put(self, key: Key, obj: JSON) -> None:
        old = self._items.get(key)
        if old is not None:
            self._unindex(key, old)
        self._items[key] = obj
        for name, indexer in self._indexers.items():
            for value in indexer(obj):
                self._index[name].setdefault(value, set()).add(key)

    def _pop(self, key: Key) -> JSON | None:
        old = self._items.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def _unindex(self, key: Key, obj: JSON) -> None:
        for name, indexer in self._indexers.items():
            for value in indexer(obj):
                keys = self._index[name].get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._index[name][value]

    def replace(
        self, items: Iterable[JSON], *, namespace: str | None
    ) -> list[tuple[JSON | None, JSON | None]]:
        """Replace the objects of `namespace` (None: all) with a fresh list; return changes."""
        fresh = {object_key(o): o for o in items}
        changes: list[tuple[JSON | None, JSON | None]] = []
        with self._lock:
            scope = [k for k in self._items if namespace is None or k[0] == namespace]
            for key in scope:
                if key not in fresh:
                    changes.append((self._pop(key), None))
            for key, obj in fresh.items():
                old = self._items.get(key)
                if old is not None and resource_version(old) > resource_version(obj):
                    continue  # a write-through newer than the list
                self._put(key, obj)
                if old is None or resource_version(old) != resource_version(obj):
                    changes.append((old, obj))
        return changes

    def apply_event(self, kind: str, obj: JSON) -> tuple[JSON | None, JSON | None] | None:
        key = object_key(obj)
        with self._lock:
            old = self._items.get(key)
            if kind == "DELETED":
                if old is None:
                    return None
                self._pop(key)
                return (old, None)
            if old is not None and resource_version(old) > resource_version(obj):
                return None
            self._put(key, obj)
            return (old, obj)

    def write_through(self, obj: JSON) -> None:
        """Record an object the API server just returned for our own write."""
        self.apply_event("MODIFIED", obj)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pop((namespace, name))


class Informer:
    """Keeps a `Store` in step with one resource in one namespace (None: all)."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        store: Store,
        *,
        namespace: str | None,
        on_change: ChangeHandler,
        on_health: Callable[[Informer], None] | None = None,
        label_selector: str | None = None,
        watch_timeout: int = 60,
        max_backoff: float = 5.0,
    ) -> None:
        self.api = api
        self.resource = resource
        self.store = store
        self.namespace = namespace
        self.label_selector = label_selector
        self._on_change = on_change
        self._on_health = on_health
        self._watch_timeout = watch_timeout
        self._max_backoff = max_backoff
        self.synced = threading.Event()
        """Set after the first successful list."""
        self.attempted = threading.Event()
        """Set after the first list attempt, successful or not."""
        self.healthy = False
        self.last_error: str = ""
        self.last_error_transient = False
        """The last failed list could not reach the API server (an outage), as opposed to
        being refused (RBAC, a missing resource): the cache still holds what was listed."""
        self.relists = 0
        self._failing = False
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{resource.plural}-{namespace or 'all'}", daemon=True
        )

    @property
    def name(self) -> str:
        return f"{self.resource.plural}@{self.namespace or '*'}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _set_health(self, healthy: bool, error: KubeError | None = None) -> None:
        changed = healthy != self.healthy
        self.healthy = healthy
        self.last_error = str(error or "")
        self.last_error_transient = isinstance(error, Transient)
        # One line per change of state, not one per retry: an outage of a minute used to
        # log thousands of warnings.
        if not healthy and not self._failing:
            log.warning(
                "list failed; retrying with backoff",
                extra={"fields": {"informer": self.name, "error": self.last_error}},
            )
        elif healthy and self._failing:
            log.info("listing again", extra={"fields": {"informer": self.name}})
        self._failing = not healthy
        if changed and self._on_health is not None:
            self._on_health(self)

    def _notify(self, old: JSON | None, new: JSON | None) -> None:
        """One handler call; a handler that raises is logged and the next change still
        goes out (a lost notification would wait for the resync)."""
        try:
            self._on_change(old, new)
        except Exception:
            log.exception("change handler failed", extra={"fields": {"informer": self.name}})

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                version = self._list()
            except KubeError as error:
                # Only a failed list makes the informer unhealthy: a watch that drops
                # is re-listed first, and the cache stays good until that fails too.
                self._set_health(False, error)
                self.attempted.set()
                log.debug(
                    "list failed; retrying",
                    extra={"fields": {"informer": self.name, "error": str(error)}},
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                continue
            except Exception:  # a handler bug must not kill the informer
                log.exception("informer failed", extra={"fields": {"informer": self.name}})
                self.attempted.set()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                continue
            backoff = 0.2
            try:
                self._watch(version)
            except Gone:
                log.info("watch expired; re-listing", extra={"fields": {"informer": self.name}})
            except KubeError as error:
                if self._stop.is_set():
                    return
                log.info(
                    "watch ended; re-listing",
                    extra={"fields": {"informer": self.name, "error": str(error)}},
                )
                self._stop.wait(backoff)
            except Exception:
                log.exception("informer failed", extra={"fields": {"informer": self.name}})
                self._stop.wait(backoff)

    def _list(self) -> str:
        body = self.api.list(self.resource, self.namespace, label_selector=self.label_selector)
        items = body.get("items") or []
        kind = self.resource.kind
        api_version = self.resource.api_version
        for item in items:  # list items carry no kind
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", api_version)
        self.relists += 1
        changes = self.store.replace(items, namespace=self.namespace)
        self._set_health(True)
        self.synced.set()
        self.attempted.set()
        for old, new in changes:
            self._notify(old, new)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> None:
        while not self._stop.is_set():
            events = self.api.watch(
                self.resource,
                self.namespace,
                resource_version=version,
                label_selector=self.label_selector,
                timeout_seconds=self._watch_timeout,
                on_open=self._opened,
            )
            for event in events:
                if self._stop.is_set():
                    return
                kind = str(event.get("type") or "")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code") or 0)
                    if code == 410:
                        raise Gone(410, str(obj.get("message") or "watch expired"))
                    raise KubeError(code, str(obj.get("message") or "watch error"))
                new_version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if new_version:
                    version = new_version
                if kind == "BOOKMARK":
                    continue
                change = self.store.apply_event(kind, obj)
                if change is not None:
                    self._notify(*change)
            self._response = None

    def _opened(self, response: Any) -> None:
        self._response = response
        if self._stop.is_set():
            with contextlib.suppress(Exception):
                response.shutdown()


def wait_all(
    informers: Iterable[Informer], *, timeout: float, attempted_only: bool = False
) -> bool:
    """Wait until every informer has synced (or at least tried, with `attempted_only`)."""
    deadline = time.monotonic() + timeout
    for informer in informers:
        event = informer.attempted if attempted_only else informer.synced
        if not event.wait(max(0.0, deadline - time.monotonic())):
            return False
    return True
