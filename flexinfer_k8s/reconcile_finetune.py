"""The finetune GPU lease lifecycle for `ModelCache.spec.finetune.gpuLease`.

`flexinfer_core.plan_finetune_lease` decides; this module observes the ModelCache,
its GPULease `<cache>-gpu-lease` and its Job `<cache>-finetune`, and performs the
plan: create the lease (owner reference to the ModelCache) *before* the Job,
refresh `expiresAt` while the Job is active, delete the lease once the Job is
terminal or the cache is being deleted. The Job is minimal until the rendering issue
fleshes it out: one container requesting `amd.com/gpu: 1`, the cache's
`nodeSelector`, `activeDeadlineSeconds = timeoutSeconds`; pod annotations under
`flexinfer.test/` are copied from the ModelCache so the local cluster can time it.

Reading leases for the election lives in `cache.ClusterCache.leases`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from flexinfer_core import (
    FinetuneLeaseInput,
    JobPhase,
    LeaseAction,
    finetune_lease_ttl,
    plan_finetune_lease,
)
from flexinfer_k8s import convert
from flexinfer_k8s.apply import Writer
from flexinfer_k8s.cache import ClusterCache
from flexinfer_k8s.reconcile_shared import Outcome
from flexinfer_kube.clock import Clock
from flexinfer_kube.kubeapi import JSON
from flexinfer_kube.resources import GPU_LEASES, JOBS, MODEL_CACHES

log = logging.getLogger("flexinfer.leases")

DEFAULT_FINETUNE_IMAGE = "busybox:1.36"
POD_ANNOTATION_PREFIX = "flexinfer.test/"
CACHE_LABEL = "ai.flexinfer/modelcache"


def lease_name(cache_name: str) -> str:
    return f"{cache_name}-gpu-lease"


def job_name(cache_name: str) -> str:
    return f"{cache_name}-finetune"


def job_phase(job: Mapping[str, Any] | None) -> JobPhase:
    if job is None:
        return JobPhase.ABSENT
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return JobPhase.SUCCEEDED
        if condition.get("type") == "Failed":
            return JobPhase.FAILED
    return JobPhase.ACTIVE


def owner_reference(obj: Mapping[str, Any]) -> JSON:
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": MODEL_CACHES.api_version,
        "kind": MODEL_CACHES.kind,
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def finetune_job(cache: Mapping[str, Any]) -> JSON:
    meta = cache.get("metadata") or {}
    spec = cache.get("spec") or {}
    finetune = spec.get("finetune") or {}
    name = str(meta.get("name"))
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k.startswith(POD_ANNOTATION_PREFIX)
    }
    pod_spec: JSON = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "finetune",
                "image": finetune.get("image") or DEFAULT_FINETUNE_IMAGE,
                "command": ["sh", "-c", f"echo finetune {name} ({finetune.get('mode', 'qlora')})"],
                "resources": {"limits": {"amd.com/gpu": "1"}, "requests": {"amd.com/gpu": "1"}},
            }
        ],
    }
    if spec.get("nodeSelector"):
        pod_spec["nodeSelector"] = dict(spec["nodeSelector"])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(name),
            "namespace": meta.get("namespace"),
            "labels": {CACHE_LABEL: name},
            "ownerReferences": [owner_reference(cache)],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(finetune.get("timeoutSeconds") or 21600),
            "template": {
                "metadata": {"labels": {CACHE_LABEL: name}, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


class FinetuneLeaseReconciler:
    def __init__(self, cache: ClusterCache, writer: Writer, clock: Clock) -> None:
        self.cache = cache
        self.writer = writer
        self.clock = clock

    def reconcile(self, namespace: str, name: str) -> Outcome:
        now = self.clock.now()
        obj = self.cache.get(MODEL_CACHES, namespace, name)
        lease = self.cache.get(GPU_LEASES, namespace, lease_name(name))
        if obj is None:
            # Garbage collection removes an owned lease too; deleting it ourselves
            # releases the group without waiting for the collector.
            if lease is not None and _owned_by_cache(lease, name):
                self.writer.delete(GPU_LEASES, namespace, lease_name(name))
                return Outcome(None, True, "LeaseRelease")
            return Outcome(None, False)
        spec = obj.get("spec") or {}
        finetune = spec.get("finetune") or {}
        gpu_lease = finetune.get("gpuLease") or {}
        group = str(gpu_lease.get("group") or "")
        if not group:
            return Outcome(None, False)
        ttl = finetune_lease_ttl(
            gpu_lease.get("ttlSeconds"), timeout_seconds=finetune.get("timeoutSeconds")
        )
        job = self.cache.get(JOBS, namespace, job_name(name))
        phase = job_phase(job)
        plan = plan_finetune_lease(
            FinetuneLeaseInput(
                cache_name=name,
                namespace=namespace,
                group=group,
                ttl=ttl,
                node=str((spec.get("nodeSelector") or {}).get("kubernetes.io/hostname") or ""),
                job=phase,
                lease_expires_at=convert.parse_time(
                    ((lease or {}).get("spec") or {}).get("expiresAt")
                ),
                lease_exists=lease is not None,
                cache_deleted=bool((obj.get("metadata") or {}).get("deletionTimestamp")),
            ),
            now=now,
        )
        wrote = False
        next_at = plan.next_change_at
        if plan.action is LeaseAction.CREATE:
            created = self.writer.create(
                GPU_LEASES, namespace, self._lease_body(obj, group, plan.expires_at)
            )
            if created is not None:
                wrote = True
                self.writer.patch_status(
                    GPU_LEASES, created, {"acquiredAt": convert.format_time(now), "active": True}
                )
            next_at = now  # the Job comes next, once the lease is in place
        elif plan.action is LeaseAction.REFRESH:
            wrote = (
                self.writer.patch(
                    GPU_LEASES,
                    namespace,
                    lease_name(name),
                    {"spec": {"expiresAt": convert.format_time(plan.expires_at)}},
                )
                is not None
            )
        elif plan.action is LeaseAction.DELETE:
            wrote = self.writer.delete(GPU_LEASES, namespace, lease_name(name))
        if plan.create_job and job is None:
            wrote = self.writer.create(JOBS, namespace, finetune_job(obj)) is not None or wrote
        wrote = self._write_status(obj, phase, group) or wrote
        if wrote:
            log.info(
                "finetune lease",
                extra={
                    "fields": {
                        "namespace": namespace,
                        "modelcache": name,
                        "group": group,
                        "action": plan.action.value,
                        "reason": plan.reason,
                        "message": plan.message,
                        "job": phase.value,
                    }
                },
            )
        return Outcome(next_at, wrote, plan.reason)

    def _lease_body(self, cache: JSON, group: str, expires_at: datetime | None) -> JSON:
        meta = cache.get("metadata") or {}
        spec = cache.get("spec") or {}
        name = str(meta.get("name"))
        body: JSON = {
            "apiVersion": GPU_LEASES.api_version,
            "kind": GPU_LEASES.kind,
            "metadata": {
                "name": lease_name(name),
                "namespace": meta.get("namespace"),
                "labels": {CACHE_LABEL: name},
                "ownerReferences": [owner_reference(cache)],
            },
            "spec": {"group": group, "owner": name},
        }
        node = (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
        if node:
            body["spec"]["node"] = node
        if expires_at is not None:
            body["spec"]["expiresAt"] = convert.format_time(expires_at)
        return body

    def _write_status(self, cache: JSON, phase: JobPhase, group: str) -> bool:
        name = convert.name_of(cache)
        if phase is JobPhase.SUCCEEDED:
            wanted: JSON = {"phase": "Ready", "ready": True}
        elif phase is JobPhase.FAILED:
            wanted = {"phase": "Failed", "ready": False}
        else:
            wanted = {"phase": "Finetuning", "ready": False}
        wanted["jobName"] = job_name(name)
        # A message per Job phase, not per plan: refreshes must not rewrite the status.
        wanted["message"] = (
            f"finetune Job {job_name(name)} {phase.value.lower()}; "
            f"GPU lease {lease_name(name)} on group {group}"
        )
        if not convert.status_differs(cache.get("status"), wanted):
            return False
        return self.writer.patch_status(MODEL_CACHES, cache, wanted) is not None


def _owned_by_cache(lease: Mapping[str, Any], cache_name: str) -> bool:
    refs = (lease.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == MODEL_CACHES.kind and r.get("name") == cache_name for r in refs)
