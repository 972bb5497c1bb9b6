"""Writing decisions to the cluster: scale, status, annotations, Events, leases, Jobs.

Each write is one request, and what the API server returns goes straight into the
informer cache (`Store.write_through`), so the next reconcile sees the controller's
own writes even before their watch events arrive — the guard against deciding
twice on a stale view (a duplicate Event, a second preemption). Status patches
carry the resourceVersion the decision was made on: a `Conflict` means someone
(usually the proxy, writing `lastActiveTime`) changed the object since, so the
object is re-read into the cache and the whole key is reconciled again
(`RetryNow`). This module performs writes; it decides nothing.
"""

from __future__ import annotations

import copy
import logging
import queue
import secrets
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from flexinfer_core.timestamps import format_rfc3339
from flexinfer_kube.informers import Store
from flexinfer_kube.kubeapi import JSON, Conflict, KubeApi, NotFound
from flexinfer_kube.resources import DEPLOYMENTS, EVENTS, Resource

log = logging.getLogger("flexinfer.apply")

COMPONENT = "flexinfer-controller"
FIELD_MANAGER = "flexinfer-controller"
"""Server-side apply manager of everything flexinfer renders (but replicas)."""
REPLICAS_MANAGER = "flexinfer-scale"
"""The manager of `spec.replicas`: the election's scale writes, and the hand-over."""


class RetryNow(Exception):
    """The decision was made on a stale object; it has been re-read: reconcile again."""


# Events waiting for the background sender, at most: far more than a burst of swaps
# records at once; past it an Event is dropped with a warning, as a failed POST is.
MAX_PENDING_EVENTS = 1000


class Writer:
    def __init__(
        self,
        api: KubeApi,
        stores: Mapping[Resource, Store],
        *,
        identity: str = COMPONENT,
        events_in_background: bool = False,
    ) -> None:
        self.api = api
        self.stores = stores
        self.identity = identity
        # With `events_in_background`, `event()` hands each Event to one sender thread
        # (in order) and returns: a worker that decided a swap is free for the next key
        # once the status and the scales are written, as client-go's recorder does.
        self._events: queue.Queue[JSON | None] | None = None
        self._sender: threading.Thread | None = None
        if events_in_background:
            self._events = queue.Queue(MAX_PENDING_EVENTS)
            self._sender = threading.Thread(
                target=self._send_events, name="event-sender", daemon=True
            )
            self._sender.start()
        self.before_replicas_override: Callable[[JSON], None] | None = None
        """Told of the cached Deployment before a scale write changes its replicas: the
        write takes the field from whoever set it last (a `kubectl scale`), and with it
        the only trace of that write, which the workload reconciler answers."""

    def _remember(self, resource: Resource, obj: JSON) -> None:
        store = self.stores.get(resource)
        if store is not None and obj.get("metadata"):
            obj.setdefault("kind", resource.kind)
            obj.setdefault("apiVersion", resource.api_version)
            store.write_through(obj)

    def _reread(self, resource: Resource, namespace: str, name: str) -> None:
        store = self.stores.get(resource)
        try:
            fresh = self.api.get(resource, namespace, name)
        except NotFound:
            if store is not None:
                store.forget(namespace, name)
            return
        self._remember(resource, fresh)

    # -- workloads ----------------------------------------------------------------

    def scale(self, namespace: str, name: str, replicas: int) -> bool:
        """Set a Deployment's replicas through the scale subresource; False if it is gone."""
        store = self.stores.get(DEPLOYMENTS)
        before = store.get(namespace, name) if store is not None else None
        hook = self.before_replicas_override
        if (
            hook is not None
            and before is not None
            and ((before.get("spec") or {}).get("replicas") != replicas)
        ):
            try:
                hook(before)
            except Exception:  # a lost warning must never cost a scale write
                log.exception("could not answer a foreign replicas write")
        try:
            scale = self.api.patch(
                DEPLOYMENTS,
                namespace,
                name,
                {"spec": {"replicas": replicas}},
                subresource="scale",
                field_manager=REPLICAS_MANAGER,
            )
        except NotFound:
            log.info(
                "deployment not found; not scaled",
                extra={"fields": {"namespace": namespace, "deployment": name}},
            )
            return False
        store = self.stores.get(DEPLOYMENTS)
        cached = store.get(namespace, name) if store is not None else None
        if store is not None and cached is not None:
            # The Scale shares its parent's resourceVersion: the cache can take it.
            updated = copy.deepcopy(cached)
            updated.setdefault("spec", {})["replicas"] = replicas
            version = (scale.get("metadata") or {}).get("resourceVersion")
            if version:
                updated["metadata"]["resourceVersion"] = version
            store.write_through(updated)
        return True

    def apply(self, resource: Resource, body: JSON, *, field_manager: str = FIELD_MANAGER) -> JSON:
        """Server-side apply `body`; what the API server returns goes into the cache."""
        meta = body.get("metadata") or {}
        updated = self.api.apply(
            resource,
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            body,
            field_manager=field_manager,
        )
        self._remember(resource, updated)
        return updated

    # -- status and metadata --------------------------------------------------------

    def patch_status(
        self,
        resource: Resource,
        obj: Mapping[str, Any],
        status: JSON,
    ) -> JSON | None:
        """Merge-patch `status`, conditional on the resourceVersion it was decided on."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        body: JSON = {"status": status}
        if meta.get("resourceVersion"):
            body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        try:
            updated = self.api.patch(resource, namespace, name, body, subresource="status")
        except Conflict as error:
            self._reread(resource, namespace, name)
            raise RetryNow(f"{resource.kind} {namespace}/{name} changed meanwhile") from error
        except NotFound:
            self._reread(resource, namespace, name)
            return None
        self._remember(resource, updated)
        return updated

    def annotate(
        self, resource: Resource, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> JSON | None:
        try:
            updated = self.api.patch(
                resource, namespace, name, {"metadata": {"annotations": dict(annotations)}}
            )
        except NotFound:
            return None
        self._remember(resource, updated)
        return updated

    def patch(self, resource: Resource, namespace: str, name: str, body: JSON) -> JSON | None:
        try:
            updated = self.api.patch(resource, namespace, name, body)
        except NotFound:
            self._reread(resource, namespace, name)
            return None
        self._remember(resource, updated)
        return updated

    def create(self, resource: Resource, namespace: str, body: JSON) -> JSON | None:
        """Create; an object that already exists is re-read instead (someone was first)."""
        try:
            created = self.api.create(resource, namespace, body)
        except Conflict:
            self._reread(resource, namespace, str(body["metadata"]["name"]))
            return None
        self._remember(resource, created)
        return created

    def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        try:
            self.api.delete(resource, namespace, name)
        except NotFound:
            store = self.stores.get(resource)
            if store is not None:
                store.forget(namespace, name)
            return False
        return True

    # -- Events ---------------------------------------------------------------------

    def event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = "Normal",
        now: datetime,
    ) -> None:
        """Record a core/v1 Event on `involved` (best effort: a lost Event is logged)."""
        meta = involved.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        stamp = format_rfc3339(now.replace(microsecond=0))
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta.get('name')}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        if self._events is None:
            self._post_event(body)
            return
        try:
            self._events.put_nowait(body)
        except queue.Full:
            log.warning(
                "could not record event",
                extra={
                    "fields": {
                        "reason": reason,
                        "object": meta.get("name"),
                        "error": f"{MAX_PENDING_EVENTS} Events already wait to be sent",
                    }
                },
            )

    def _post_event(self, body: JSON) -> None:
        try:
            self.api.create(EVENTS, str(body["metadata"]["namespace"]), body)
        except Exception as error:  # an Event is never worth failing a reconcile for
            log.warning(
                "could not record event",
                extra={
                    "fields": {
                        "reason": body["reason"],
                        "object": body["involvedObject"]["name"],
                        "error": str(error),
                    }
                },
            )

    def _send_events(self) -> None:
        events = self._events
        assert events is not None
        while (body := events.get()) is not None:
            self._post_event(body)

    def stop_events(self, timeout: float = 5.0) -> None:
        """Send the Events still waiting (within `timeout`), then end the sender."""
        if self._events is None or self._sender is None:
            return
        try:
            self._events.put(None, timeout=timeout)
        except queue.Full:
            return  # the sender is stuck on the API server; it is a daemon thread
        self._sender.join(timeout)

