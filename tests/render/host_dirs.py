"""Follow a rendered pod's claim to the host directory behind it, as the API server's
binder and the kubelet would: the claim named by the volume, the `local` volume it is
pre-bound to (`volumeName`, and the volume's `claimRef` back), its path and the mount's
`subPath`. The volumes and claims are those the render says the pod needs."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from flexinfer_k8s.render.local_volume import HostVolume, claim, persistent_volume


def host_dir(
    volume: Mapping[str, Any], mount: Mapping[str, Any], needed: Iterable[HostVolume]
) -> str:
    """The node path a mount of a rendered pod reaches; fails when the volume is not a
    claim on one of `needed`, or the pair is not bound to each other."""
    assert "hostPath" not in volume, volume
    name = volume["persistentVolumeClaim"]["claimName"]
    matches = [claim(v) for v in needed if claim(v)["metadata"]["name"] == name]
    assert len(matches) == 1, f"claim {name} is not one the render asks for"
    pvc = matches[0]
    (pv,) = [persistent_volume(v) for v in needed if v.claim_name == name]
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    ref = pv["spec"]["claimRef"]
    assert (ref["namespace"], ref["name"]) == (pvc["metadata"]["namespace"], name)
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    root = str(pv["spec"]["local"]["path"])
    sub = str(mount.get("subPath") or "")
    return posixpath.join(root, sub) if sub else root


def node_terms(volume: HostVolume) -> list[Any]:
    """The volume's node affinity, as (key, operator, values) triples."""
    terms = persistent_volume(volume)["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    return [(e["key"], e["operator"], e.get("values")) for t in terms
            for e in t["matchExpressions"]]
