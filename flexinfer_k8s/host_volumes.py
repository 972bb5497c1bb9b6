"""Make the `local` volumes, claims and directory Jobs a rendered pod's host directories
need (`render.local_volume`), before the pod asks for them.

Owns: creating a missing volume (cluster-scoped) and claim (the tenant's namespace), and
the directory Job in the controller's namespace. Never deletes any of them, and changes
only one thing: a volume of ours `Released` by a deleted claim loses that claim's uid,
so the claim made again binds. A volume or claim of that name that is not flexinfer's,
or is bound elsewhere, is a clash the caller reports; what a user made is never taken
over. Volumes and claims
outlive the caches and Models that asked for them (they hold no data of their own; the
directory keeps its files whatever happens to them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flexinfer_core import reasons
from flexinfer_k8s.outcome import Wiring
from flexinfer_k8s.render.local_volume import (
    HostVolume,
    claim,
    directory_job,
    persistent_volume,
)
from flexinfer_k8s.render.pod_security import secure_job
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_kube.kubeapi import NotFound, Rejected
from flexinfer_kube.objects import get_path
from flexinfer_kube.resources import JOBS, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES

log = logging.getLogger("flexinfer.hostvolumes")


def _ours(obj: Mapping[str, Any]) -> bool:
    labels = get_path(obj, "metadata", "labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == "flexinfer"


def volume_clash(volume: HostVolume, live: Mapping[str, Any]) -> str:
    """Why a live volume of the wanted name is not the wanted one ("" when it is)."""
    name = volume.volume_name
    if not _ours(live):
        return f"PersistentVolume {name} exists and is not flexinfer's; it is never taken over"
    ref = get_path(live, "spec", "claimRef") or {}
    path = get_path(live, "spec", "local", "path")
    if (ref.get("namespace"), ref.get("name")) != (volume.namespace, volume.claim_name):
        return (
            f"PersistentVolume {name} is bound to {ref.get('namespace')}/{ref.get('name')}, "
            f"not {volume.namespace}/{volume.claim_name}"
        )
    if path != volume.root:
        return f"PersistentVolume {name} holds {path}, not {volume.root}"
    return ""


def claim_clash(volume: HostVolume, live: Mapping[str, Any]) -> str:
    name = f"{volume.namespace}/{volume.claim_name}"
    if not _ours(live):
        return f"PersistentVolumeClaim {name} exists and is not flexinfer's; it is never taken over"
    if get_path(live, "spec", "volumeName") != volume.volume_name:
        return (
            f"PersistentVolumeClaim {name} is bound to {get_path(live, 'spec', 'volumeName')}, "
            f"not {volume.volume_name}"
        )
    return ""


@attrs.frozen
class HostProblem:
    """Why a host directory cannot be mounted: a clash (`NameClash`), or the API server
    refused what flexinfer rendered (`InvalidSpec`: an admission policy, 422)."""

    reason: str
    message: str


def _released_from_an_earlier_claim(
    live: Mapping[str, Any], pvc: Mapping[str, Any] | None
) -> bool:
    uid = get_path(live, "spec", "claimRef", "uid")
    if not uid or get_path(live, "status", "phase") != "Released":
        return False
    return pvc is None or get_path(pvc, "metadata", "uid") != uid


class HostVolumes:
    """The volumes, claims and directory Jobs of host directories, made on demand."""

    def __init__(self, wiring: Wiring, *, settings: RenderSettings) -> None:
        self.cache = wiring.cache
        self.writer = wiring.writer
        self.api = wiring.api
        self.settings = settings

    def ensure(self, volumes: Iterable[HostVolume]) -> tuple[bool, HostProblem | None]:
        """Create what is missing; (whether anything was written, the first problem)."""
        wrote = False
        for volume in dict.fromkeys(volumes):
            try:
                made, clash = self._one(volume)
            except Rejected as error:
                if error.status != 422:  # forbidden and the like are not the spec's fault
                    raise
                return wrote, HostProblem(
                    reasons.INVALID_SPEC,
                    f"the API server refused what flexinfer rendered for the host directory "
                    f"{volume.root}: {error}",
                )
            wrote = wrote or made
            if clash:
                return wrote, HostProblem(reasons.NAME_CLASH, clash)
        return wrote, None

    def _one(self, volume: HostVolume) -> tuple[bool, str]:
        wrote = False
        # The claim first: a user's claim of that name must never meet a volume
        # pre-bound to it (the binder would give it ours).
        pvc = self.cache.get(PERSISTENT_VOLUME_CLAIMS, volume.namespace, volume.claim_name)
        if pvc is None:
            try:
                # The informer sees only flexinfer's claims: a user's is asked for.
                pvc = self.api.get(PERSISTENT_VOLUME_CLAIMS, volume.namespace, volume.claim_name)
            except NotFound:
                pvc = None
        if pvc is not None:
            clash = claim_clash(volume, pvc)
            if clash:
                return wrote, clash
        try:
            live = self.api.get(PERSISTENT_VOLUMES, "", volume.volume_name)
        except NotFound:
            created = self.writer.create(PERSISTENT_VOLUMES, "", persistent_volume(volume))
            wrote = created is not None
            # None: someone was first; read what they made.
            live = created or self.api.get(PERSISTENT_VOLUMES, "", volume.volume_name)
        clash = volume_clash(volume, live)
        if clash:
            return wrote, clash
        if _released_from_an_earlier_claim(live, pvc):
            # Its claim was deleted (a namespace deleted and made again): the volume keeps
            # the old claim's uid and would never bind the new one. Dropping the uid
            # pre-binds it to the claim of that name again; the directory is untouched.
            self.writer.patch(
                PERSISTENT_VOLUMES,
                "",
                volume.volume_name,
                {"spec": {"claimRef": {"uid": None, "resourceVersion": None}}},
            )
            wrote = True
        if pvc is None:
            made = self.writer.create(PERSISTENT_VOLUME_CLAIMS, volume.namespace, claim(volume))
            wrote = wrote or made is not None
        job = directory_job(
            volume,
            controller_namespace=self.settings.controller_namespace,
            policy=self.settings.policy,
            image=self.settings.cache_images.copy,
        )
        if job is not None:
            namespace = str(job["metadata"]["namespace"])
            if self.cache.get(JOBS, namespace, volume.directory_job_name) is None:
                body = secure_job(job, policy=self.settings.policy, writers=["directory"])
                created = self.writer.create(JOBS, namespace, body)
                if created is not None:
                    wrote = True
                    log.info(
                        "directory job",
                        extra={"fields": {"root": volume.root, "job": volume.directory_job_name}},
                    )
        return wrote, ""

