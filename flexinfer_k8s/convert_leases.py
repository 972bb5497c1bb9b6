"""GPU leases from Kubernetes JSON: a `GPULease`, or the legacy ConfigMap carrier.

Pure readers (docs/election.md section 2): an object that names no group is not a
lease and reads as None; one whose `expiresAt` does not parse reads with its
`problem` said. Which lease governs a group, and what an unreadable
source means, is the core's to decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexinfer_core import GpuLease, LeaseSource
from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_kube.objects import get_path, name_of, namespace_of

GPU_LEASE_LABEL = "ai.flexinfer/gpu-lease"


def gpu_lease_from_k8s(obj: Mapping[str, Any]) -> GpuLease | None:
    """A `GPULease`; None when it names no group."""
    spec = get_path(obj, "spec") or {}
    group = str(spec.get("group") or "")
    return _lease(obj, spec, group=group, source=LeaseSource.GPU_LEASE) if group else None


def gpu_lease_from_config_map(obj: Mapping[str, Any]) -> GpuLease | None:
    """The legacy `gpu-lease-<group>` ConfigMap; the group comes from data, else the label."""
    data = get_path(obj, "data") or {}
    labels = get_path(obj, "metadata", "labels") or {}
    group = str(data.get("group") or labels.get(GPU_LEASE_LABEL) or "")
    return _lease(obj, data, group=group, source=LeaseSource.CONFIG_MAP) if group else None


def _lease(
    obj: Mapping[str, Any], fields: Mapping[str, Any], *, group: str, source: LeaseSource
) -> GpuLease:
    """Both carriers name the same fields (`owner`, `node`, `expiresAt`).

    An `expiresAt` that is present but does not parse is the lease's `problem` (the
    core then lets it govern nothing), never "no expiry".
    """
    raw_expiry = fields.get("expiresAt")
    expires_at = parse_rfc3339(raw_expiry)
    problem = ""
    if expires_at is None and raw_expiry not in (None, ""):
        where = "data" if source is LeaseSource.CONFIG_MAP else "spec"
        problem = f"{where}.expiresAt: {raw_expiry!r} is not an RFC 3339 time"
    return GpuLease(
        name=name_of(obj),
        group=group,
        namespace=namespace_of(obj) or "default",
        owner=str(fields.get("owner") or ""),
        node=str(fields.get("node") or ""),
        expires_at=expires_at,
        source=source,
        problem=problem,
    )
