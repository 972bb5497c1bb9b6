"""The view of a cluster every verb of the command reads: the controller's own cache.

`ClusterView` is the controller's `ClusterCache` filled once, from a listing of the
cluster (`cluster.list_cluster`) or from manifests (`manifests.load_manifests`), so
the controller's lookups and snapshot functions read it unchanged. It lists nothing
and reads no file itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flexinfer_k8s.cache import WATCHED, ClusterCache
from flexinfer_kube.resources import Resource

FLEXINFER_GROUP = "ai.flexinfer"


class ClusterView(ClusterCache):
    """The controller's cache, filled once (from a listing or from manifests).

    `unreadable` names lease sources that could not be listed: the controller's
    informers report the same through their health, and its election fails open.
    """

    def __init__(self, *, source: str) -> None:
        super().__init__()
        self.source = source
        self.unreadable: set[str] = set()

    def unreadable_lease_sources(self, namespace: str) -> list[str]:
        # With informers (`status -w`), their health counts too, as in the controller.
        return sorted(self.unreadable | set(super().unreadable_lease_sources(namespace)))

    def add(
        self, resource: Resource, items: Iterable[dict[str, Any]], *, namespace: str | None
    ) -> None:
        items = list(items)
        for item in items:  # list items carry no kind
            item.setdefault("kind", resource.kind)
            item.setdefault("apiVersion", resource.api_version)
        self.store(resource).replace(items, namespace=namespace)

    def namespaces(self) -> list[str]:
        """Every namespace that holds an object of ours."""
        found = {
            str((obj.get("metadata") or {}).get("namespace") or "")
            for resource in WATCHED
            if resource.group == FLEXINFER_GROUP
            for obj in self.objects(resource)
        }
        return sorted(found - {""})
