"""The CRDs' defaults are the core's: every default the decisions use comes from one place.

`flexinfer_core.Policy` holds them: its fields are the controller's flags, and a spec
field one of them decides (a Model's `spec.gpu.swapCooldown`) has no default in the
CRD, so that leaving it out means "the controller's default"; its class constants (and
the GPUGroup's own `AntiThrashing` and `GpuGroupState`) are what the API server fills
in for the other fields the decisions read, which the CRDs must say too.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from flexinfer_core import (
    AntiThrashing,
    GpuGroupMember,
    GpuGroupState,
    Policy,
    StandaloneDeployment,
    parse_duration,
)

ROOT = Path(__file__).resolve().parents[1]
CRD_FILES = {
    "Model": "ai.flexinfer_models.yaml",
    "ModelDeployment": "ai.flexinfer_modeldeployments.yaml",
    "GPUGroup": "ai.flexinfer_gpugroups.yaml",
}
_GROUP = GpuGroupState(name="defaults")
_ANTI = AntiThrashing()


def _seconds(value: timedelta) -> int:
    return int(value.total_seconds())


# (kind, property) -> what the core decides for an object that leaves it out.
CORE_DEFAULTS: dict[tuple[str, str], Any] = {
    ("Model", "spec.gpu.priority"): Policy.PRIORITY,
    ("Model", "spec.gpu.forcePromotion"): Policy.FORCE_PROMOTION,
    ("Model", "spec.gpu.default"): Policy.DEFAULT_MEMBER,
    ("Model", "spec.gpu.drainTimeout"): Policy.DRAIN_TIMEOUT,
    ("Model", "spec.serverless.enabled"): Policy.SERVERLESS_ENABLED,
    ("Model", "spec.serverless.minReplicas"): Policy.MIN_REPLICAS,
    ("Model", "spec.serverless.idleTimeout"): Policy.IDLE_TIMEOUT,
    ("Model", "spec.serverless.coldStartTimeout"): Policy.COLD_START_TIMEOUT,
    ("ModelDeployment", "spec.priority"): Policy.PRIORITY,
    ("ModelDeployment", "spec.minReplicas"): Policy.MIN_REPLICAS,
    ("ModelDeployment", "spec.replicas"): StandaloneDeployment(name="defaults").replicas,
    ("ModelDeployment", "spec.idleTimeoutSeconds"): _seconds(Policy.IDLE_TIMEOUT),
    ("ModelDeployment", "spec.coldStartTimeoutSeconds"): _seconds(Policy.COLD_START_TIMEOUT),
    ("GPUGroup", "spec.models[].priority"): GpuGroupMember(name="defaults").priority,
    ("GPUGroup", "spec.scalingPolicy.preemptionPolicy"): _GROUP.preemption_policy.value,
    ("GPUGroup", "spec.scalingPolicy.drainTimeoutSeconds"): _seconds(_GROUP.drain_timeout),
    ("GPUGroup", "spec.antiThrashing.enabled"): _ANTI.enabled,
    ("GPUGroup", "spec.antiThrashing.hysteresisWindowSeconds"): _seconds(_ANTI.hysteresis_window),
    ("GPUGroup", "spec.antiThrashing.requestQueueThreshold"): _ANTI.request_queue_threshold,
    ("GPUGroup", "spec.antiThrashing.minimumRunDurationSeconds"): _seconds(
        _ANTI.minimum_run_duration
    ),
    ("GPUGroup", "spec.antiThrashing.cooldownAfterPreemptionSeconds"): _seconds(
        _ANTI.cooldown_after_preemption
    ),
}
# The blocks whose fields the decisions read: a default there must be one of the above
# (or one of these few, which only the renderer reads).
ELECTION_BLOCKS = {
    "Model": ("spec.gpu.", "spec.serverless."),
    "ModelDeployment": (
        "spec.priority",
        "spec.replicas",
        "spec.minReplicas",
        "spec.idleTimeoutSeconds",
        "spec.coldStartTimeoutSeconds",
    ),
    "GPUGroup": ("spec.models[].", "spec.scalingPolicy.", "spec.antiThrashing."),
}
RENDERING_ONLY = {
    ("Model", "spec.gpu.vendor"),
    ("Model", "spec.gpu.count"),
    ("GPUGroup", "spec.scalingPolicy.strategy"),
}


def _properties(schema: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, node in (schema.get("properties") or {}).items():
        here = f"{path}.{name}" if path else name
        out[here] = node
        out |= _properties(node, here)
    if isinstance(schema.get("items"), dict):
        out |= _properties(schema["items"], f"{path}[]")
    return out


def crd_properties(kind: str) -> dict[str, dict[str, Any]]:
    crd = yaml.safe_load((ROOT / "crds" / CRD_FILES[kind]).read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return _properties(version["schema"]["openAPIV3Schema"], "")


def _same(crd_default: Any, core: Any) -> bool:
    if isinstance(core, timedelta):
        return isinstance(crd_default, str) and parse_duration(crd_default) == core
    return type(crd_default) is type(core) and bool(crd_default == core)


@pytest.mark.parametrize(("kind", "path"), sorted(CORE_DEFAULTS))
def test_the_crd_default_is_the_cores(kind: str, path: str) -> None:
    node = crd_properties(kind)[path]
    assert "default" in node, f"{kind} {path} has no default in the CRD"
    assert _same(node["default"], CORE_DEFAULTS[(kind, path)]), (
        f"{kind} {path}: the CRD defaults to {node['default']!r}, the core to "
        f"{CORE_DEFAULTS[(kind, path)]!r}"
    )


def _decided_by_the_controller() -> list[tuple[str, str, str]]:
    return [
        (*field.metadata["spec_field"], field.metadata["flag"])
        for field in attrs.fields(Policy)
        if "spec_field" in field.metadata
    ]


def test_the_swap_cooldown_is_the_controllers_to_default() -> None:
    assert ("Model", "spec.gpu.swapCooldown", "--default-swap-cooldown") in (
        _decided_by_the_controller()
    )


@pytest.mark.parametrize(("kind", "path", "flag"), _decided_by_the_controller())
def test_a_field_the_controllers_policy_decides_has_no_crd_default(
    kind: str, path: str, flag: str
) -> None:
    node = crd_properties(kind)[path]
    assert "default" not in node, (
        f"{kind} {path} defaults to {node['default']!r} in the CRD, so {flag} would never "
        "apply to a stored object"
    )
    assert flag in " ".join(str(node.get("description")).split())


@pytest.mark.parametrize("kind", sorted(ELECTION_BLOCKS))
def test_every_default_the_decisions_read_is_checked(kind: str) -> None:
    unchecked = [
        path
        for path, node in crd_properties(kind).items()
        if "default" in node
        and not isinstance(node["default"], dict)
        and path.startswith(ELECTION_BLOCKS[kind])
        and (kind, path) not in CORE_DEFAULTS
        and (kind, path) not in RENDERING_ONLY
    ]
    assert unchecked == [], f"{kind} defaults not compared with the core's: {unchecked}"
