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
allowControlPlaneNodes: false   # true only where the control plane is the GPU node
hostCacheMaxSize: 200Gi   # the most one NodeLocal or Memory cache directory may hold
backendIngressFrom:    # NetworkPolicy peers that may reach a model's port 8000
  - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: flexinfer-system}}
    podSelector: {matchLabels: {app.kubernetes.io/name: flexinfer-proxy}}
```

This module parses and holds the policy; `render.tenant_policy` checks resources
against it and `render.pod_security` applies what every pod gets. Pure: text in,
values out.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import attrs
import yaml

from flexinfer_core import InvalidFieldError
from flexinfer_kube.objects import JSON

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE])?$")
_UNITS: dict[str | None, int] = {
    None: 1,
    **{f"{u}i": 1024 ** (i + 1) for i, u in enumerate("KMGTPE")},
    **{u: 1000 ** (i + 1) for i, u in enumerate("kMGTPE")},
}
DEFAULT_HOST_CACHE_MAX_SIZE = "200Gi"
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


CONTROL_PLANE_NODE_LABELS = (
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
)
"""The labels (and taint keys) kubeadm, k3s and others put on control-plane nodes."""

PROXY_PEER: JSON = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "flexinfer-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "flexinfer-proxy"}},
}
"""The proxy as `deploy/` installs it: the one client of every model's port."""
PEER_FIELDS = ("namespaceSelector", "podSelector", "ipBlock")

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
    allow_control_plane_nodes: bool = False
    backend_ingress_from: tuple[JSON, ...] = (PROXY_PEER,)
    """Who may connect to a model's port (`render.network_policy`)."""
    host_cache_max_size: str = DEFAULT_HOST_CACHE_MAX_SIZE
    """The most one node-bound cache directory (NodeLocal, Memory) may hold: a cache's
    `spec.storageSize` may not exceed it, and its download and flash loader stop there."""
    """False: every rendered pod requires a node without a control-plane label. A
    single-node cluster whose control plane is the GPU node sets it."""

    def gpu_node_tolerations(self) -> list[JSON]:
        """Tolerations of the GPU nodes' taints, for a pod that belongs on a GPU node."""
        return [taint.toleration() for taint in self.gpu_node_taints]


def quantity_bytes(text: str, *, field: str) -> int:
    """A Kubernetes quantity of bytes (`50Gi`, `1.5T`, `1048576`) as an integer."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise InvalidFieldError(field, text, "must be a quantity of bytes such as 50Gi")
    return int(Decimal(match[1]) * _UNITS[match[2]])


def key_allowed(key: str, patterns: Iterable[str]) -> bool:
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
        if item["key"] in CONTROL_PLANE_NODE_LABELS:
            raise InvalidFieldError(
                f"{where}.key",
                item["key"],
                "is the control plane's taint: tenants' pods never tolerate it "
                "(set allowControlPlaneNodes for a single-node cluster instead)",
            )
        effect = item.get("effect", "NoSchedule")
        if effect not in TAINT_EFFECTS:
            raise InvalidFieldError(f"{where}.effect", effect, f"must be one of {TAINT_EFFECTS}")
        taints.append(Taint(item["key"], str(item.get("value") or ""), effect))
    return tuple(taints)


def _peers(document: Mapping[str, Any]) -> tuple[JSON, ...]:
    field = "backendIngressFrom"
    if field not in document or document[field] is None:
        return AdminPolicy().backend_ingress_from
    value = document[field]
    if not isinstance(value, list):
        raise InvalidFieldError(field, value, "must be a list of NetworkPolicy peers")
    if len(value) > MAX_ENTRIES:
        raise InvalidFieldError(field, len(value), f"items: at most {MAX_ENTRIES}")
    for index, peer in enumerate(value):
        if (
            not isinstance(peer, Mapping)
            or not peer
            or not set(peer) <= set(PEER_FIELDS)
            or not all(isinstance(v, Mapping) for v in peer.values())
        ):
            raise InvalidFieldError(
                f"{field}[{index}]",
                peer,
                f"must be a NetworkPolicy peer: a mapping of {', '.join(PEER_FIELDS)}",
            )
    return tuple(dict(peer) for peer in value)


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
        "allowControlPlaneNodes",
        "backendIngressFrom",
        "hostCacheMaxSize",
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
    control_plane = document.get("allowControlPlaneNodes", False)
    if not isinstance(control_plane, bool):
        raise InvalidFieldError("allowControlPlaneNodes", control_plane, "must be true or false")
    max_size = str(document.get("hostCacheMaxSize") or DEFAULT_HOST_CACHE_MAX_SIZE)
    if quantity_bytes(max_size, field="hostCacheMaxSize") <= 0:
        raise InvalidFieldError("hostCacheMaxSize", max_size, "must be more than 0")
    return AdminPolicy(
        host_cache_max_size=max_size,
        allow_control_plane_nodes=control_plane,
        backend_ingress_from=_peers(document),
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
