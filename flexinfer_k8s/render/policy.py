"""The administrator's policy: what tenants may ask for, and what every pod gets anyway.

Whoever may create a Model, ModelDeployment or ModelCache in a namespace is a *tenant*;
whoever runs the controller is the *administrator*. The administrator's policy is the
controller's configuration (`python -m flexinfer_k8s --policy FILE`, a YAML document;
`deploy/` mounts it from the ConfigMap `flexinfer-policy`), never a field a tenant can
write. Absent, the built-in defaults below apply.

```yaml
gpuNodeTaints:         # taints of the GPU nodes; tolerated by the pods flexinfer renders
  - {key: dedicated, value: gpu, effect: NoSchedule}
hostPathPrefixes: [/var/lib/flexinfer/models, /dev/shm/flexinfer]
imagePrefixes: []      # empty: only the images flexinfer renders by default
nodeSelectorKeys: [kubernetes.io/hostname, flexinfer.ai/*]
podLabelKeys: []       # keys (or prefix/*) a tenant may put on its pods
podAnnotationKeys: []
```

This module parses and holds the policy; the renderer asks it. Pure: text in, values out.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import yaml

from flexinfer_core import InvalidFieldError
from flexinfer_kube.objects import JSON

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
MAX_ENTRIES = 64
"""Per list of the policy: an administrator's list, but still a bound."""


@attrs.frozen
class Taint:
    """A node taint the administrator declares on the GPU nodes."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def toleration(self) -> JSON:
        """The toleration of exactly this taint (never a wildcard)."""
        toleration: JSON = {"key": self.key, "effect": self.effect}
        if self.value:
            toleration.update(operator="Equal", value=self.value)
        else:
            toleration["operator"] = "Exists"
        return toleration

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


SEED_GPU_TAINT = Taint("dedicated", "gpu", "NoSchedule")
"""How the GPU nodes of a typical homelab are tainted (`kubectl taint nodes gpu-1
dedicated=gpu:NoSchedule`), and so the default."""


@attrs.frozen
class AdminPolicy:
    gpu_node_taints: tuple[Taint, ...] = (SEED_GPU_TAINT,)
    host_path_prefixes: tuple[str, ...] = ("/var/lib/flexinfer/models", "/dev/shm/flexinfer")
    image_prefixes: tuple[str, ...] = ()
    node_selector_keys: tuple[str, ...] = ("kubernetes.io/hostname", "flexinfer.ai/*")
    pod_label_keys: tuple[str, ...] = ()
    pod_annotation_keys: tuple[str, ...] = ()

    def gpu_node_tolerations(self) -> list[JSON]:
        """Tolerations of the GPU nodes' taints, for a pod that belongs on a GPU node."""
        return [taint.toleration() for taint in self.gpu_node_taints]


def key_allowed(key: str, patterns: Sequence[str]) -> bool:
    """Whether `key` matches one of `patterns` (exact, or `prefix/*` style globs)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


def _strings(document: Mapping[str, Any], field: str, default: tuple[str, ...]) -> tuple[str, ...]:
    if field not in document or document[field] is None:
        return default
    value = document[field]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidFieldError(field, value, "must be a list of non-empty strings")
    if len(value) > MAX_ENTRIES:
        raise InvalidFieldError(field, len(value), f"items: at most {MAX_ENTRIES}")
    return tuple(value)


def _taints(document: Mapping[str, Any]) -> tuple[Taint, ...]:
    field = "gpuNodeTaints"
    if field not in document or document[field] is None:
        return AdminPolicy().gpu_node_taints
    value = document[field]
    if not isinstance(value, list):
        raise InvalidFieldError(field, value, "must be a list of {key, value, effect}")
    if len(value) > MAX_ENTRIES:
        raise InvalidFieldError(field, len(value), f"items: at most {MAX_ENTRIES}")
    taints = []
    for index, item in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("key"), str) or not item["key"]:
            raise InvalidFieldError(where, item, "must have a non-empty key")
        effect = item.get("effect", "NoSchedule")
        if effect not in TAINT_EFFECTS:
            raise InvalidFieldError(f"{where}.effect", effect, f"must be one of {TAINT_EFFECTS}")
        taints.append(Taint(item["key"], str(item.get("value") or ""), effect))
    return tuple(taints)


def admin_policy_from_yaml(text: str) -> AdminPolicy:
    """The policy a YAML document states; `InvalidFieldError` names the bad field."""
    try:
        document = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as error:
        raise InvalidFieldError("policy", text[:80], f"is not YAML: {error}") from None
    if document is None:
        document = {}
    if not isinstance(document, Mapping):
        raise InvalidFieldError("policy", document, "must be a YAML mapping")
    known = {
        "gpuNodeTaints",
        "hostPathPrefixes",
        "imagePrefixes",
        "nodeSelectorKeys",
        "podLabelKeys",
        "podAnnotationKeys",
    }
    unknown = sorted(set(document) - known)
    if unknown:
        raise InvalidFieldError(unknown[0], document[unknown[0]], f"is not one of {sorted(known)}")
    defaults = AdminPolicy()
    for prefix in _strings(document, "hostPathPrefixes", ()):
        if not prefix.startswith("/") or prefix.rstrip("/") == "" or ".." in prefix.split("/"):
            raise InvalidFieldError(
                "hostPathPrefixes",
                prefix,
                "must be an absolute directory other than / without '..'",
            )
    return AdminPolicy(
        gpu_node_taints=_taints(document),
        host_path_prefixes=tuple(
            p.rstrip("/")
            for p in _strings(document, "hostPathPrefixes", defaults.host_path_prefixes)
        ),
        image_prefixes=_strings(document, "imagePrefixes", defaults.image_prefixes),
        node_selector_keys=_strings(document, "nodeSelectorKeys", defaults.node_selector_keys),
        pod_label_keys=_strings(document, "podLabelKeys", defaults.pod_label_keys),
        pod_annotation_keys=_strings(document, "podAnnotationKeys", defaults.pod_annotation_keys),
    )
