"""Reconcile one ModelCache: its storage, the download that fills it, the finetune that
follows, and the GPU lease around that finetune.

1. The claim of a SharedPVC cache (`<cache>-models`, unless `existingClaimName`),
   server-side applied, owned by the cache.
2. The download Job `<cache>-download` (`render.cache.download_job`): created while
   the copy is not known complete; re-created when the source changes (its
   `ai.flexinfer/source` annotation no longer matches). A failed Job is `Failed` with
   the Job's own reason, on the cache and (through `CacheReady`) on every Model that
   references it; never "still downloading".
3. With `spec.finetune`: once the download succeeded, the GPU lease lifecycle
   (`flexinfer_core.plan_finetune_lease`: lease before the Job, refreshed while it
   runs, deleted when it ends or the cache goes) and the training Job
   (`render.finetune`).
4. Status: `phase` Pending → Downloading → (Finetuning →) Ready, or Failed; `ready`,
   `path`, `jobName`, `message`, a `Ready` condition with the reason.

Bad input (a NodeLocal cache without a node, a finetune without a trainer image, a
`gpuLease.ttlSeconds` no lease can carry) is a condition naming the field, with a
Warning Event; nothing is created for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs

from flexinfer_core import (
    Condition,
    FinetuneLeaseInput,
    InvalidFieldError,
    JobPhase,
    LeaseAction,
    finetune_lease_name,
    finetune_lease_ttl,
    plan_finetune_lease,
    reasons,
)
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_k8s.outcome import Outcome, Wiring
from flexinfer_k8s.render.cache import (
    CACHE_LABEL,
    CacheSpec,
    cache_from_k8s,
    claim_manifest,
    download_job,
    owner_reference,
)
from flexinfer_k8s.render.finetune import finetune_job, job_name
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_k8s.status_diff import merge_conditions, status_differs
from flexinfer_kube.objects import JSON, get_path
from flexinfer_kube.resources import (
    GPU_LEASES,
    JOBS,
    MODEL_CACHES,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
)

log = logging.getLogger("flexinfer.modelcache")

SOURCE_ANNOTATION = "ai.flexinfer/source"


def job_phase(job: Mapping[str, Any] | None) -> JobPhase:
    if job is None:
        return JobPhase.ABSENT
    for condition in get_path(job, "status", "conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return JobPhase.SUCCEEDED
        if condition.get("type") == "Failed":
            return JobPhase.FAILED
    return JobPhase.ACTIVE


def job_failure(job: Mapping[str, Any] | None, pods: list[JSON]) -> str:
    """Why a Job failed, in its own words (its Failed condition) and its last failed
    pod's (the container's termination reason and message: "401 Unauthorized" says
    more than "BackoffLimitExceeded")."""
    why = "the Job failed"
    for condition in get_path(job, "status", "conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            why = f"{condition.get('reason') or 'Failed'}: {condition.get('message') or why}"
    name = get_path(job, "metadata", "name")
    failed = [
        p
        for p in pods
        if (get_path(p, "metadata", "labels") or {}).get("job-name") == name
        and get_path(p, "status", "phase") == "Failed"
    ]
    failed.sort(key=lambda p: str(get_path(p, "metadata", "creationTimestamp") or ""))
    for pod in failed[-1:]:
        for container in get_path(pod, "status", "containerStatuses") or []:
            terminated = get_path(container, "state", "terminated") or {}
            if terminated:
                detail = terminated.get("message") or f"exit code {terminated.get('exitCode')}"
                why += f" (last pod: {terminated.get('reason') or 'Error'}: {str(detail)[:512]})"
                break
    return why


@attrs.frozen
class CacheStatus:
    phase: str
    ready: bool
    reason: str
    message: str
    job: str = ""


class CacheReconciler:
    def __init__(
        self,
        wiring: Wiring,
        *,
        settings: RenderSettings | None = None,
        finetune_image: str = "",
    ) -> None:
        self.cache = wiring.cache
        self.writer = wiring.writer
        self.clock = wiring.clock
        self.settings = settings or RenderSettings()
        self.images = self.settings.cache_images
        self.finetune_image = finetune_image

    def reconcile(self, namespace: str, name: str) -> Outcome:
        now = self.clock.now()
        obj = self.cache.get(MODEL_CACHES, namespace, name)
        lease = self.cache.get(GPU_LEASES, namespace, finetune_lease_name(name))
        if obj is None:
            # Garbage collection removes an owned lease too; deleting it ourselves
            # releases the group without waiting for the collector.
            if lease is not None and _owned_by_cache(lease, name):
                self.writer.delete(GPU_LEASES, namespace, finetune_lease_name(name))
                return Outcome(None, True, reasons.LEASE_RELEASE)
            return Outcome(None, False)
        try:
            spec = cache_from_k8s(obj)
        except InvalidFieldError as error:
            status = CacheStatus("Pending", False, reasons.INVALID_SPEC, str(error))
            return Outcome(None, self._write_status(obj, status, path="", now=now), status.reason)
        wrote = self._claim(spec)
        download = self.cache.get(JOBS, namespace, spec.download_job_name)
        if download is not None and _source_of(download) != spec.source.text:
            # The model changed: the old copy must not be taken for the new one.
            self.writer.delete(JOBS, namespace, spec.download_job_name)
            return Outcome(None, True, reasons.DOWNLOADING)
        phase = job_phase(download)
        if phase is JobPhase.ABSENT:
            job = download_job(spec, self.images)
            job["metadata"].setdefault("annotations", {})[SOURCE_ANNOTATION] = spec.source.text
            wrote = self.writer.create(JOBS, namespace, job) is not None or wrote
            phase = JobPhase.ACTIVE
        next_at: datetime | None = None
        if phase is JobPhase.FAILED:
            status = CacheStatus(
                "Failed",
                False,
                reasons.DOWNLOAD_FAILED,
                f"download Job {spec.download_job_name} failed: "
                f"{job_failure(download, self.cache.objects(PODS, namespace))}",
                spec.download_job_name,
            )
        elif phase is JobPhase.ACTIVE and self._claim_unbound(spec):
            status = CacheStatus(
                "Pending",
                False,
                reasons.CLAIM_PENDING,
                f"claim {spec.claim} is not bound yet: the download Job "
                f"{spec.download_job_name} starts once it is",
                spec.download_job_name,
            )
        elif phase is JobPhase.ACTIVE:
            status = CacheStatus(
                "Downloading",
                False,
                reasons.DOWNLOADING,
                f"download Job {spec.download_job_name} is copying {spec.source.text} to "
                f"{spec.path}",
                spec.download_job_name,
            )
        elif get_path(obj, "spec", "finetune"):
            status, next_at, tuned = self._finetune(obj, spec, lease, now=now)
            wrote = tuned or wrote
        else:
            status = CacheStatus(
                "Ready",
                True,
                reasons.CACHE_READY,
                f"{spec.source.text} is complete at {spec.path}",
                spec.download_job_name,
            )
        wrote = self._write_status(obj, status, path=spec.path, now=now) or wrote
        if wrote:
            log.info(
                "modelcache",
                extra={
                    "fields": {
                        "namespace": namespace,
                        "modelcache": name,
                        "phase": status.phase,
                        "reason": status.reason,
                        "message": status.message,
                    }
                },
            )
        return Outcome(next_at, wrote, status.reason)

    # -- storage ---------------------------------------------------------------------

    def _claim(self, spec: CacheSpec) -> bool:
        claim = claim_manifest(spec)
        if claim is None:
            return False
        live = self.cache.get(PERSISTENT_VOLUME_CLAIMS, spec.namespace, spec.claim)
        if live is not None:
            return False  # a claim's spec is immutable once bound; ours is never edited
        self.writer.apply(PERSISTENT_VOLUME_CLAIMS, claim)
        return True

    def _claim_unbound(self, spec: CacheSpec) -> bool:
        if not spec.claim:
            return False
        live = self.cache.get(PERSISTENT_VOLUME_CLAIMS, spec.namespace, spec.claim)
        return bool(get_path(live, "status", "phase") != "Bound")

    # -- finetune --------------------------------------------------------------------

    def _finetune(
        self, obj: JSON, spec: CacheSpec, lease: JSON | None, *, now: datetime
    ) -> tuple[CacheStatus, datetime | None, bool]:
        namespace, name = spec.namespace, spec.name
        finetune = get_path(obj, "spec", "finetune") or {}
        group = str(get_path(finetune, "gpuLease", "group") or "")
        try:
            job_body = finetune_job(
                spec,
                obj,
                default_image=self.finetune_image,
                video_gid=self.settings.video_gid,
                render_gid=self.settings.render_gid,
            )
            # Read before anything is created: a TTL no lease can carry (2**62 seconds,
            # stored before the CRD's bound) takes no lease and starts no Job.
            ttl = (
                finetune_lease_ttl(
                    get_path(finetune, "gpuLease", "ttlSeconds"),
                    timeout_seconds=finetune.get("timeoutSeconds"),
                )
                if group
                else None
            )
        except InvalidFieldError as error:
            return CacheStatus("Failed", False, reasons.INVALID_SPEC, str(error)), None, False
        job = self.cache.get(JOBS, namespace, job_name(name))
        phase = job_phase(job)
        wrote = False
        next_at: datetime | None = None
        create_job = phase is JobPhase.ABSENT
        if group and ttl is not None:
            plan = plan_finetune_lease(
                FinetuneLeaseInput(
                    cache_name=name,
                    namespace=namespace,
                    group=group,
                    ttl=ttl,
                    node=dict(spec.node_selector).get("kubernetes.io/hostname", ""),
                    job=phase,
                    lease_expires_at=parse_rfc3339(get_path(lease, "spec", "expiresAt")),
                    lease_exists=lease is not None,
                    cache_deleted=bool(get_path(obj, "metadata", "deletionTimestamp")),
                ),
                now=now,
            )
            next_at = plan.next_change_at
            wrote = self._lease(obj, spec, group, plan.action, plan.expires_at, now=now)
            if plan.action is LeaseAction.CREATE:
                next_at = now  # the Job comes next, once the lease is in place
            create_job = create_job and plan.create_job
        if create_job:
            wrote = self.writer.create(JOBS, namespace, job_body) is not None or wrote
            phase = JobPhase.ACTIVE if phase is JobPhase.ABSENT else phase
        held = f"; GPU lease {finetune_lease_name(name)} on group {group}" if group else ""
        if phase is JobPhase.SUCCEEDED:
            status = CacheStatus(
                "Ready",
                True,
                reasons.CACHE_READY,
                f"finetune Job {job_name(name)} succeeded{held}",
                job_name(name),
            )
        elif phase is JobPhase.FAILED:
            status = CacheStatus(
                "Failed",
                False,
                reasons.FINETUNE_FAILED,
                f"finetune Job {job_name(name)} failed: "
                f"{job_failure(job, self.cache.objects(PODS, namespace))}{held}",
                job_name(name),
            )
        else:
            doing = "waits for its GPU lease" if phase is JobPhase.ABSENT else "is running"
            status = CacheStatus(
                "Finetuning",
                False,
                reasons.FINETUNING,
                f"finetune Job {job_name(name)} {doing}{held}",
                job_name(name),
            )
        return status, next_at, wrote

    def _lease(
        self,
        obj: JSON,
        spec: CacheSpec,
        group: str,
        action: LeaseAction,
        expires_at: datetime | None,
        *,
        now: datetime,
    ) -> bool:
        namespace, name = spec.namespace, spec.name
        if action is LeaseAction.CREATE:
            created = self.writer.create(
                GPU_LEASES, namespace, self._lease_body(spec, group, expires_at)
            )
            if created is None:
                return False
            self.writer.patch_status(
                GPU_LEASES, created, {"acquiredAt": format_rfc3339(now), "active": True}
            )
            return True
        if action is LeaseAction.REFRESH:
            return (
                self.writer.patch(
                    GPU_LEASES,
                    namespace,
                    finetune_lease_name(name),
                    {"spec": {"expiresAt": format_rfc3339(expires_at)}},
                )
                is not None
            )
        if action is LeaseAction.DELETE:
            return self.writer.delete(GPU_LEASES, namespace, finetune_lease_name(name))
        return False

    def _lease_body(self, spec: CacheSpec, group: str, expires_at: datetime | None) -> JSON:
        body: JSON = {
            "apiVersion": GPU_LEASES.api_version,
            "kind": GPU_LEASES.kind,
            "metadata": {
                "name": finetune_lease_name(spec.name),
                "namespace": spec.namespace,
                "labels": {CACHE_LABEL: spec.name},
                "ownerReferences": [owner_reference(spec)],
            },
            "spec": {"group": group, "owner": spec.name},
        }
        node = dict(spec.node_selector).get("kubernetes.io/hostname")
        if node:
            body["spec"]["node"] = node
        if expires_at is not None:
            body["spec"]["expiresAt"] = format_rfc3339(expires_at)
        return body

    # -- status ----------------------------------------------------------------------

    def _write_status(self, obj: JSON, status: CacheStatus, *, path: str, now: datetime) -> bool:
        generation = get_path(obj, "metadata", "generation")
        generation = generation if isinstance(generation, int) else None
        wanted: JSON = {
            "phase": status.phase,
            "ready": status.ready,
            "path": path or None,
            "jobName": status.job or None,
            "message": status.message,
            "conditions": merge_conditions(
                get_path(obj, "status", "conditions"),
                [Condition("Ready", status.ready, status.reason, status.message)],
                now=now,
                generation=generation,
            ),
        }
        if generation is not None:
            wanted["observedGeneration"] = generation
        current = get_path(obj, "status") or {}
        if not status_differs(current, wanted):
            return False
        written = self.writer.patch_status(MODEL_CACHES, obj, wanted) is not None
        newly_failed = status.phase == "Failed" and (
            current.get("phase") != "Failed" or current.get("message") != status.message
        )
        if written and newly_failed:
            self.writer.event(
                obj, reason=status.reason, message=status.message, type="Warning", now=now
            )
        return written


def _source_of(job: Mapping[str, Any]) -> str:
    return str((get_path(job, "metadata", "annotations") or {}).get(SOURCE_ANNOTATION) or "")


def _owned_by_cache(lease: Mapping[str, Any], cache_name: str) -> bool:
    refs = get_path(lease, "metadata", "ownerReferences") or []
    return any(r.get("kind") == MODEL_CACHES.kind and r.get("name") == cache_name for r in refs)
