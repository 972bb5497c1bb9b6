"""Every property of the five CRDs says what it means, its default and its bounds.

`kubectl explain` prints a field's description and its enum, but not its default or
its bounds, so the description carries them (as kubebuilder-generated CRDs do). The
walk covers every named property at any depth, list items included; the last test
asks a real API server through `kubectl explain`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CRDS = sorted((ROOT / "crds").glob("ai.flexinfer_*.yaml"))


def properties(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every named property under `schema`, with its dotted path (`[]` for list items)."""
    for name, node in (schema.get("properties") or {}).items():
        here = f"{path}.{name}"
        yield here, node
        yield from properties(node, here)
    if isinstance(schema.get("items"), dict):
        yield from properties(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from properties(schema["additionalProperties"], f"{path}{{}}")


def every_property() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in CRDS:
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            found += list(properties(schema, f"{kind}.{version['name']}"))
    return found


PROPERTIES = every_property()
# The API server forbids anything but name/generateName rules on the root `metadata`
# (a description included); `kubectl explain` prints ObjectMeta's own documentation.
ROOT_METADATA = ".metadata"


def test_the_walk_sees_every_crd_and_nested_and_list_properties() -> None:
    paths = {path for path, _ in PROPERTIES}
    assert len(CRDS) == 5
    assert "Model.v1alpha2.spec.gpu.priority" in paths
    assert "GPUGroup.v1alpha1.spec.models[].priority" in paths
    assert "Model.v1alpha2.status.conditions[].reason" in paths
    assert len(paths) > 200
    roots = [
        node for path, node in PROPERTIES if path.count(".") == 2 and path.endswith(ROOT_METADATA)
    ]
    assert roots and all(node == {"type": "object"} for node in roots)  # the server refuses more


def test_every_property_has_a_description() -> None:
    missing = [
        path
        for path, node in PROPERTIES
        if not str(node.get("description") or "").strip() and not path.endswith(ROOT_METADATA)
    ]
    assert missing == [], f"{len(missing)} properties without a description: {missing}"


def _shown(value: Any) -> str:
    return (
        {True: "true", False: "false"}.get(value, str(value))
        if isinstance(value, bool)
        else str(value)
    )


def test_every_default_and_bound_is_in_the_description() -> None:
    unsaid = []
    for path, node in PROPERTIES:
        text = str(node.get("description") or "")
        wanted = [
            _shown(node[key])
            for key in ("default", "minimum", "maximum", "maxLength", "maxItems", "maxProperties")
            if key in node and not isinstance(node[key], dict | list)
        ]
        for rule in node.get("x-kubernetes-validations") or []:
            wanted.append(str(rule.get("message") or "")[1:])  # "must be …" → "Must be …"
        unsaid += [f"{path}: {value!r}" for value in wanted if value and value not in text]
    assert unsaid == [], f"descriptions that leave out a default or bound: {unsaid}"


@pytest.mark.k8s
def test_kubectl_explain_prints_the_description(local_cluster: Any) -> None:
    from tests.k8s.kubectl import install_crds, kubectl_for

    install_crds(local_cluster)
    kubectl = kubectl_for(local_cluster)
    gpu = kubectl.ok("explain", "model.spec.gpu")
    assert "The GPU the model needs and how it shares it with other Models." in gpu
    assert "<no description>" not in gpu and "<empty>" not in gpu
    priority = kubectl.ok("explain", "model.spec.gpu.priority")
    assert "Default: 100. Between 0 and 1000." in " ".join(priority.split())
    hysteresis = " ".join(kubectl.ok("explain", "gpugroup.spec.antiThrashing").split())
    assert "Default: 10. Between 0 and 60." in hysteresis
