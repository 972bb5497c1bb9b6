"""An API server stand-in for reconciler tests that need no cluster.

Answers like the API server does for the verbs the reconcilers use (merge patches of
objects, their `status` and `scale`, conditional on the resourceVersion a status
patch carries; label-selected lists; Event creation), from a dict of objects, and
records every request in order. A test scripts failures per request (`fail_next`)
and checks what was sent (`calls`). Pair it with real `Store`s and a `ManualClock`.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

from flexinfer_kube.kubeapi import Conflict, KubeError, NotFound, Rejected
from flexinfer_kube.resources import EVENTS, Resource

JSON = dict[str, Any]


def _merge(into: JSON, patch: JSON) -> None:
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


class FakeApi:
    """Objects by (plural, namespace, name); every request recorded as
    (verb, plural, name, subresource)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], JSON] = {}
        self.calls: list[tuple[str, str, str, str]] = []
        self.bodies: list[JSON] = []
        self.events: list[JSON] = []
        self._version = 100
        self._failures: dict[tuple[str, str, str], list[KubeError]] = defaultdict(list)
        # What the CRD would refuse: (plural, dotted status path) -> the longest string.
        self.max_length: dict[tuple[str, str], int] = {}

    # -- set-up -----------------------------------------------------------------------

    def put(self, resource: Resource, obj: JSON) -> JSON:
        """Store `obj` with a fresh resourceVersion; return the stored copy."""
        self._version += 1
        stored = copy.deepcopy(obj)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        stored.setdefault("kind", resource.kind)
        stored.setdefault("apiVersion", resource.api_version)
        meta = stored["metadata"]
        self.objects[(resource.plural, meta.get("namespace", ""), meta["name"])] = stored
        return copy.deepcopy(stored)

    def remove(self, resource: Resource, namespace: str, name: str) -> None:
        self.objects.pop((resource.plural, namespace, name), None)

    def fail_next(
        self,
        resource: Resource,
        name: str,
        error: KubeError,
        *,
        subresource: str = "",
        times: int = 1,
    ) -> None:
        """The next `times` requests to this object (and subresource) fail with `error`."""
        self._failures[(resource.plural, name, subresource)].extend([error] * times)

    def verbs(self, *, skip: tuple[str, ...] = ("GET",)) -> list[tuple[str, str, str, str]]:
        return [call for call in self.calls if call[0] not in skip]

    # -- verbs ------------------------------------------------------------------------

    def _record(self, verb: str, resource: Resource, name: str, subresource: str | None) -> None:
        self.calls.append((verb, resource.plural, name, subresource or ""))
        pending = self._failures.get((resource.plural, name, subresource or ""))
        if pending:
            raise pending.pop(0)

    def get(self, resource: Resource, namespace: str, name: str) -> JSON:
        self._record("GET", resource, name, None)
        obj = self.objects.get((resource.plural, namespace, name))
        if obj is None:
            raise NotFound(404, f"{resource.plural} {name} not found")
        return copy.deepcopy(obj)

    def list(
        self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None
    ) -> JSON:
        self._record("LIST", resource, "", None)
        wanted = dict(part.split("=", 1) for part in (label_selector or "").split(",") if part)
        items = [
            copy.deepcopy(obj)
            for (plural, ns, _), obj in sorted(self.objects.items())
            if plural == resource.plural
            and (namespace is None or ns == namespace)
            and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]
        return {"metadata": {"resourceVersion": str(self._version)}, "items": items}

    def create(self, resource: Resource, namespace: str, body: JSON) -> JSON:
        self._record("POST", resource, str(body.get("reason") or body["metadata"]["name"]), None)
        if resource is EVENTS:
            self.events.append(copy.deepcopy(body))
            return copy.deepcopy(body)
        return self.put(resource, body)

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        body: JSON,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> JSON:
        self._record("PATCH", resource, name, subresource)
        self.bodies.append(copy.deepcopy(body))
        key = (resource.plural, namespace, name)
        obj = self.objects.get(key)
        if obj is None:
            raise NotFound(404, f"{resource.plural} {name} not found")
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != obj["metadata"]["resourceVersion"]:
            raise Conflict(409, f"{resource.plural} {name}: the object has been modified")
        if subresource == "scale":
            obj.setdefault("spec", {})["replicas"] = body["spec"]["replicas"]
            self._bump(obj)
            return {
                "metadata": {"name": name, "resourceVersion": obj["metadata"]["resourceVersion"]},
                "spec": {"replicas": body["spec"]["replicas"]},
            }
        patch = {k: v for k, v in body.items() if k != "metadata"}
        if subresource is None and "metadata" in body:
            patch["metadata"] = {
                k: v for k, v in body["metadata"].items() if k != "resourceVersion"
            }
        candidate = copy.deepcopy(obj)
        _merge(candidate, patch)
        for (plural, path), longest in self.max_length.items():
            value: Any = candidate
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if plural == resource.plural and isinstance(value, str) and len(value) > longest:
                raise Rejected(422, f"{path}: Too long: may not be more than {longest} bytes")
        obj.clear()
        obj.update(candidate)
        self._bump(obj)
        return copy.deepcopy(obj)

    def delete(self, resource: Resource, namespace: str, name: str) -> JSON:
        self._record("DELETE", resource, name, None)
        if self.objects.pop((resource.plural, namespace, name), None) is None:
            raise NotFound(404, f"{resource.plural} {name} not found")
        return {}

    def _bump(self, obj: JSON) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
