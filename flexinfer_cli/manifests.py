"""Manifests from files (`-f`) as a cluster view: replay a dump, or try a change first.

Files, directories (every `*.yaml`, `*.yml`, `*.json` in them) and `-` (stdin) hold
YAML or JSON documents, one object each or a `List` (what `kubectl get -o yaml`
prints). flexinfer's kinds are checked against the very schemas the API server
enforces (crds/, OpenAPI v3, with `jsonschema`), status included, so a dump of a
cluster with `status.lastActiveTime`, `phase` and `sharedGroup` replays as it was; a
bad document is refused with the file, the document, the object and the field
path. Built-in kinds the controller reads (Deployments, Pods, Services, ConfigMaps,
Jobs, PersistentVolumeClaims) are taken as given; any other kind is skipped.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources as package_files
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from flexinfer_cli.output import CommandError, UsageError
from flexinfer_cli.view import FLEXINFER_GROUP, ClusterView
from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_k8s.cache import WATCHED
from flexinfer_kube.resources import Resource

SUFFIXES = (".yaml", ".yml", ".json")
KINDS: dict[str, Resource] = {r.kind: r for r in WATCHED}


def load_manifests(paths: Sequence[str], *, namespace: str | None) -> ClusterView:
    """Every object in `paths`, validated, in a `ClusterView` (namespace: the default for
    objects that name none)."""
    view = ClusterView(source="manifests")
    found: dict[Resource, list[dict[str, Any]]] = {}
    for source, where, obj in _documents(paths):
        resource = _resource_of(obj, where=f"{source}: {where}")
        if resource is None:
            continue
        metadata = obj.setdefault("metadata", {})
        metadata.setdefault("namespace", namespace or "default")
        found.setdefault(resource, []).append(obj)
    for resource, items in found.items():
        view.add(resource, items, namespace=None)
    return view


def _files(paths: Sequence[str]) -> Iterator[tuple[str, str]]:
    for given in paths:
        if given == "-":
            yield "<stdin>", sys.stdin.read()
            continue
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        elif path.is_file():
            files = [path]
        else:
            raise UsageError(f"{given}: no such file or directory")
        for file in files:
            try:
                yield str(file), file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise UsageError(f"{file}: cannot read: {error}") from None


def _documents(paths: Sequence[str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for source, text in _files(paths):
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as error:
            raise UsageError(f"{source}: not valid YAML: {error}") from None
        for index, document in enumerate(documents, start=1):
            if document is None:
                continue
            if not isinstance(document, dict):
                raise UsageError(
                    f"{source}: document {index}: expected an object, got {type(document).__name__}"
                )
            items = document.get("items")
            if str(document.get("kind") or "").endswith("List") and isinstance(items, list):
                for position, item in enumerate(items):
                    where = f"document {index}, items[{position}]"
                    if not isinstance(item, dict):
                        raise UsageError(f"{source}: {where}: not an object")
                    yield source, where, item
            else:
                yield source, f"document {index}", document


def _resource_of(obj: dict[str, Any], *, where: str) -> Resource | None:
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise UsageError(f"{where}: kind: required")
    name = (
        (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    )
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: {kind}: metadata.name: required")
    resource = KINDS.get(kind)
    api_version = str(obj.get("apiVersion") or "")
    if resource is None:
        if api_version.split("/")[0] == FLEXINFER_GROUP:
            known = ", ".join(sorted(r.kind for r in WATCHED if r.group == FLEXINFER_GROUP))
            raise UsageError(f"{where}: {kind} {name}: kind: not a flexinfer kind ({known})")
        return None  # a Namespace, a Secret ...: nothing the decisions read
    if resource.group != FLEXINFER_GROUP:
        return resource
    if api_version != resource.api_version:
        raise UsageError(
            f"{where}: {kind} {name}: apiVersion: {api_version!r} is not {resource.api_version}"
        )
    error = _schema_error(kind, obj)
    if error is not None:
        raise UsageError(f"{where}: {kind} {name}: {error}")
    return resource


def _schema_error(kind: str, obj: Mapping[str, Any]) -> str | None:
    validator = _validators().get(kind)
    if validator is None:
        return None
    best = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if best is None:
        return None
    field = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in best.absolute_path)
    return f"{field.replace('.[', '[') or '<object>'}: {best.message}"


_FORMATS = jsonschema.FormatChecker(formats=())


@_FORMATS.checks("date-time")
def _is_rfc3339(value: object) -> bool:
    return not isinstance(value, str) or parse_rfc3339(value) is not None


@functools.cache
def _validators() -> dict[str, Any]:
    """One validator per flexinfer kind, from the shipped CRDs."""
    out: dict[str, Any] = {}
    for text in _crd_texts():
        crd = yaml.safe_load(text)
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            continue
        kind = crd["spec"]["names"]["kind"]
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        schema = version["schema"]["openAPIV3Schema"]
        # OpenAPI v3's schema objects are JSON Schema draft 4 with extensions
        # (x-kubernetes-*), which draft 4 validators ignore.
        out[kind] = jsonschema.Draft4Validator(schema, format_checker=_FORMATS)
    return out


def _crd_texts() -> list[str]:
    """The CRDs: from the wheel (`flexinfer_cli/crds`) or a source checkout (`crds/`)."""
    packaged = package_files.files("flexinfer_cli") / "crds"
    if packaged.is_dir():
        return [
            p.read_text(encoding="utf-8") for p in packaged.iterdir() if p.name.startswith("ai.")
        ]
    checkout = Path(__file__).resolve().parents[1] / "crds"
    found = [p.read_text(encoding="utf-8") for p in sorted(checkout.glob("ai.*.yaml"))]
    if not found:
        raise CommandError(
            "cannot check manifests: the CRDs are neither in the installed package "
            f"(flexinfer_cli/crds) nor in a checkout ({checkout})"
        )
    return found
