"""Reconcile one ModelCache: its storage, the download that fills it, the finetune that
follows, the GPU lease around that finetune, and the cleanup when it goes.

0. A node-bound cache's (and a `file://` source's or dataset's) host directories: the
   namespace's `local` volumes, claims and directory Jobs (`host_volumes`), before any
   pod needs them; a volume or claim of that name that is not flexinfer's is
   `NameClash`, one the API server refuses `InvalidSpec`.
1. The claim of a SharedPVC cache (`<cache>-models`, unless `existingClaimName`),
   server-side applied, owned by the cache; a claim that stays Pending says why in the
   binder's or provisioner's words (the claim's Events), with a Warning Event; a Pending
   claim of ours whose access modes or class the spec no longer asks for is re-created
   (it holds nothing yet).
2. The download Job `<cache>-download` (`render.cache.download_job`): created while
   the copy is not known complete; re-created when the source changes (its
   `ai.flexinfer/source` annotation no longer matches). What the Job found is its pod's
   termination message (`cache_dir.parse_result`), kept on the Job as an annotation:
   downloaded, already present, adopted (a user's model: `Adopted` condition, never
   written), or refused (files flexinfer did not write and no model). A failed Job is
   `Failed` with the Job's own reason, on the cache and (through `CacheReady`) on every
   Model that references it; never "still downloading".
3. With `spec.finetune`: once the download succeeded, the GPU lease lifecycle
   (`flexinfer_core.plan_finetune_lease`: lease before the Job, refreshed while it
   runs, deleted when it ends or the cache goes) and the training Job
   (`render.finetune`). A training pod the scheduler cannot place for a reason other
   than the GPU itself (a taint, a selector, no such node) has its Job suspended and its
   lease released after `CacheTimeouts.finetune_unschedulable`.
4. A node-bound cache (NodeLocal, Memory with a `nodeSelector`) carries the finalizer
   `CLEANUP_FINALIZER`; when it is deleted a cleanup Job removes its node directories
   (only flexinfer's) and the finalizer goes once the Job ends, or after
   `CacheTimeouts.cleanup` whatever happened (a Warning Event says so).
5. Status: `phase` Pending → Downloading → (Finetuning →) Ready, or Failed, or Deleting;
   `ready`, `path`, `jobName`, `message`, a `Ready` condition with the reason, and
   `Adopted` for a user's copy.

Bad input (a NodeLocal cache without a node, a finetune without a trainer image, a
`gpuLease.ttlSeconds` no lease can carry) and anything outside the administrator's
policy (`render.tenant_policy`: an image, a host path, a node selector key, a pod
annotation) is a condition naming the field, with a Warning Event; nothing is created
for it. Every Job's pod is hardened (`render.pod_security`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
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
from flexinfer_k8s.host_volumes import HostVolumes
from flexinfer_k8s.outcome import Outcome, Wiring
from flexinfer_k8s.reconcile_workload import controller_of
from flexinfer_k8s.render.cache import (
    ADOPTED_CONDITION,
    CACHE_LABEL,
    CacheSpec,
    claim_differs,
    claim_manifest,
    cleanup_job,
    download_job,
    job_placement,
    owner_reference,
    status_says_adopted,
)
from flexinfer_k8s.render.cache_dir import DirResult, ScriptReport, parse_result
from flexinfer_k8s.render.finetune import finetune_job, finetune_volumes, job_name
from flexinfer_k8s.render.pod_security import secure_job
from flexinfer_k8s.render.tenant_policy import cache_within_policy, check_finetune
from flexinfer_k8s.render.workload import Vendor
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_k8s.scrub import scrub
from flexinfer_k8s.status_diff import merge_conditions, status_differs
from flexinfer_kube.kubeapi import KubeError, NotFound, Rejected
from flexinfer_kube.objects import JSON, get_path
from flexinfer_kube.resources import (
    EVENTS,
    GPU_LEASES,
    JOBS,
    MODEL_CACHES,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
)

log = logging.getLogger("flexinfer.modelcache")

SOURCE_ANNOTATION = "ai.flexinfer/source"
RESULT_ANNOTATION = "ai.flexinfer/result"
"""On the download Job: what its pod found (`cache_dir` result line), kept after the
pod is gone."""
UNSCHEDULABLE_ANNOTATION = "ai.flexinfer/unschedulable"
"""On a finetune Job the controller suspended: the scheduler's message."""
UID_ANNOTATION = "ai.flexinfer/modelcache-uid"
CLEANUP_FINALIZER = "ai.flexinfer/node-cleanup"
CLAIM_RECHECK = timedelta(seconds=10)
"""How often a Pending claim's Events are read again (no watch on Events)."""
CLEANUP_GRACE = timedelta(seconds=30)
"""Past the cleanup Job's own deadline, before the controller stops waiting for it."""
MESSAGE_LIMIT = 512


@attrs.frozen
class CacheTimeouts:
    """Controller flags: the bounds a ModelCache's Jobs can hit."""

    finetune_unschedulable: timedelta = timedelta(minutes=5)
    """`--finetune-unschedulable-timeout`: how long a training pod may stay unschedulable
    for a reason other than the GPU before its GPU lease is released."""
    cleanup: timedelta = timedelta(minutes=5)
    """`--cache-cleanup-timeout`: the cleanup Job's deadline, and (with `CLEANUP_GRACE`)
    the longest a deleted cache waits for it."""


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
    more than "BackoffLimitExceeded"), scrubbed of secrets (`flexinfer_k8s.scrub`)."""
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
                said = scrub(f"{terminated.get('reason') or 'Error'}: {detail}")
                why += f" (last pod: {said})"
                break
    return why


def job_pods(pods: list[JSON], job_name: str) -> list[JSON]:
    """The Job's pods, oldest first."""
    found = [
        p for p in pods if (get_path(p, "metadata", "labels") or {}).get("job-name") == job_name
    ]
    found.sort(key=lambda p: str(get_path(p, "metadata", "creationTimestamp") or ""))
    return found


def pod_report(pods: list[JSON]) -> ScriptReport | None:
    """What the newest finished pod's script said (its termination message)."""
    for pod in reversed(pods):
        for container in get_path(pod, "status", "containerStatuses") or []:
            report = parse_result(get_path(container, "state", "terminated", "message"))
            if report is not None:
                return report
    return None


def unschedulable(pods: list[JSON]) -> tuple[str, datetime | None] | None:
    """The scheduler's message for the newest pod it cannot place, and since when; None
    when that pod is placed (or not yet tried)."""
    for pod in reversed(pods):
        if get_path(pod, "status", "phase") not in (None, "Pending"):
            return None
        for condition in get_path(pod, "status", "conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                return (
                    str(condition.get("message") or "unschedulable")[:MESSAGE_LIMIT],
                    parse_rfc3339(condition.get("lastTransitionTime")),
                )
        return None
    return None


def waits_for_gpu(message: str, resource: str) -> bool:
    """Whether the scheduler found a node that lacks only free GPUs: the one wait a GPU
    lease ends (serving pods park and give the card back). A node that fails for a
    taint or a selector is reported by that filter and never reaches the GPU count."""
    return bool(resource) and f"Insufficient {resource}" in message


def claim_hint(spec: CacheSpec, message: str) -> str:
    """What to set when a claim's Events say it cannot be provided as asked."""
    lowered = message.lower()
    if "ReadWriteMany" in spec.access_modes and (
        "readwriteonce" in lowered or "access mode" in lowered or "local-path" in lowered
    ):
        return (
            " — the storage class cannot share a volume between nodes (ReadWriteMany): set "
            "spec.accessModes: [ReadWriteOnce] and pin the cache to one node with "
            "spec.nodeSelector kubernetes.io/hostname: <node> (RWO is then the default), or "
            "set spec.storageClassName to a class that provides ReadWriteMany (NFS, CephFS)"
        )
    if "no persistent volumes available" in lowered or "storageclass" in lowered:
        return (
            " — set spec.storageClassName to a StorageClass of the cluster (kubectl get "
            "storageclass), or spec.existingClaimName to a claim you made"
        )
    return ""


@attrs.frozen
class CacheStatus:
    phase: str
    ready: bool
    reason: str
    message: str
    job: str = ""
    adopted: bool | None = None
    """True: the copy is a user's (condition Adopted); None: not known (no condition)."""


class CacheReconciler:
    def __init__(
        self,
        wiring: Wiring,
        *,
        settings: RenderSettings | None = None,
        finetune_image: str = "",
        timeouts: CacheTimeouts | None = None,
    ) -> None:
        self.cache = wiring.cache
        self.writer = wiring.writer
        self.api = wiring.api
        self.clock = wiring.clock
        self.timeouts = timeouts or CacheTimeouts()
        self.settings = settings or RenderSettings()
        self.images = self.settings.cache_images
        self.finetune_image = finetune_image
        self.allowed_images = attrs.evolve(
            self.settings, finetune_image=finetune_image or self.settings.finetune_image
        ).rendered_images()
        self.policy = self.settings.policy
        self.host_volumes = HostVolumes(wiring, settings=self.settings)

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
        deleting = bool(get_path(obj, "metadata", "deletionTimestamp"))
        try:
            spec = cache_within_policy(obj, self.policy, images=self.allowed_images)
            # Before anything is made: the download of a cache whose training is outside
            # the policy would be for nothing.
            finetune = get_path(obj, "spec", "finetune")
            if finetune:
                check_finetune(finetune, spec, self.policy, images=self.allowed_images)
            host_volumes = spec.host_volumes(self.policy)
            if finetune:
                host_volumes += finetune_volumes(spec, obj, self.policy)
        except InvalidFieldError as error:
            if deleting:  # nothing known to clean: never hold the deletion
                return Outcome(None, self._release(obj, lease), reasons.DELETING)
            status = CacheStatus("Pending", False, reasons.INVALID_SPEC, str(error))
            return Outcome(None, self._write_status(obj, status, path="", now=now), status.reason)
        # The node directories' `local` volumes and claims, and the Jobs that make the
        # directories (the cleanup mounts them too).
        made, host_problem = self.host_volumes.ensure(host_volumes)
        if host_problem is not None and not deleting:
            status = CacheStatus(
                "Pending",
                False,
                host_problem.reason,
                f"{host_problem.message}: the cache's node directory cannot be mounted",
            )
            return Outcome(None, self._write_status(obj, status, path="", now=now) or made,
                           status.reason)
        if deleting:
            return self._delete(obj, spec, lease, now=now)
        clash = self._foreign_job(spec, spec.download_job_name) or (
            self._foreign_job(spec, job_name(name)) if get_path(obj, "spec", "finetune") else None
        )
        if clash is not None:
            return Outcome(None, self._write_status(obj, clash, path="", now=now), clash.reason)
        wrote = self._finalizer(obj, spec) or made
        wrote = self._claim(spec) or wrote
        download = self.cache.get(JOBS, namespace, spec.download_job_name)
        if download is not None and _source_of(download) != spec.source_text:
            # The model changed: the old copy must not be taken for the new one.
            self.writer.delete(JOBS, namespace, spec.download_job_name)
            return Outcome(None, True, reasons.DOWNLOADING)
        pods = job_pods(self.cache.objects(PODS, namespace), spec.download_job_name)
        if download is not None and self._never_placed_elsewhere(spec, download, pods):
            # A pod template cannot change: a download that never reached a node is made
            # again with the node and tolerations the cache now asks for (the fix its
            # condition asked for).
            self.writer.delete(JOBS, namespace, spec.download_job_name)
            return Outcome(None, True, reasons.DOWNLOADING)
        phase = job_phase(download)
        if phase is JobPhase.ABSENT:
            job = secure_job(
                download_job(spec, self.images, policy=self.policy),
                policy=self.policy,
                writers=["download"],
            )
            job["metadata"].setdefault("annotations", {})[SOURCE_ANNOTATION] = spec.source_text
            try:
                created = self.writer.create(JOBS, namespace, job)
            except Rejected as error:
                if error.status != 422:  # forbidden and the like are not the spec's fault
                    raise
                status = CacheStatus(
                    "Failed",
                    False,
                    reasons.INVALID_SPEC,
                    f"the download Job {spec.download_job_name} was refused by the API server "
                    f"(check spec.downloadResources, spec.tolerations): {error}",
                )
                return Outcome(
                    None, self._write_status(obj, status, path=spec.path, now=now), status.reason
                )
            if created is None:
                # It existed after all (re-read into the cache, though it may be one the
                # informer does not watch): decide again on what it is.
                return Outcome(now, wrote, reasons.DOWNLOADING)
            wrote = True
            phase = JobPhase.ACTIVE
        next_at: datetime | None = None
        if phase is JobPhase.FAILED:
            status = self._download_failed(spec, download, pods)
        elif phase is JobPhase.ACTIVE and not pods and (
            # First: a claim that binds on its first consumer waits for this very pod.
            refused := self._job_refused(obj, spec.namespace, spec.download_job_name, now=now)
        ):
            status, wrote_event = refused
            wrote = wrote_event or wrote
            next_at = now + CLAIM_RECHECK
        elif phase is JobPhase.ACTIVE and self._claim_unbound(spec):
            status, wrote_event = self._claim_pending(obj, spec, now=now)
            wrote = wrote_event or wrote
            next_at = now + CLAIM_RECHECK
        elif phase is JobPhase.ACTIVE:
            waiting = unschedulable(pods)
            status = CacheStatus(
                "Downloading",
                False,
                reasons.DOWNLOADING,
                f"download Job {spec.download_job_name} is copying "
                f"{spec.source_text or '(no source)'} to {spec.path}"
                + (f" (its pod cannot be scheduled yet: {waiting[0]})" if waiting else ""),
                spec.download_job_name,
            )
        else:
            report, wrote_result = self._download_report(obj, download, pods)
            wrote = wrote_result or wrote
            adopted = report is not None and report.result is DirResult.ADOPTED
            if adopted != spec.adopted:
                spec = attrs.evolve(spec, adopted=adopted)
            if get_path(obj, "spec", "finetune"):
                status, next_at, tuned = self._finetune(obj, spec, lease, now=now)
                wrote = tuned or wrote
            elif adopted:
                assert report is not None
                status = CacheStatus(
                    "Ready",
                    True,
                    reasons.ADOPTED,
                    f"{spec.path} holds a model flexinfer did not write ({report.detail}): "
                    "adopted as it is; flexinfer never writes, rewrites or removes it"
                    + (
                        f", and does not download spec.source {spec.source_text}"
                        if spec.source_text
                        else ""
                    ),
                    spec.download_job_name,
                )
            elif report is not None and report.result is DirResult.PRESENT:
                status = CacheStatus(
                    "Ready",
                    True,
                    reasons.CACHE_READY,
                    f"{report.detail or spec.source_text} was already complete at {spec.path} "
                    "(flexinfer's copy): nothing downloaded",
                    spec.download_job_name,
                )
            else:
                status = CacheStatus(
                    "Ready",
                    True,
                    reasons.CACHE_READY,
                    f"{spec.source_text} is complete at {spec.path}",
                    spec.download_job_name,
                )
            status = attrs.evolve(status, adopted=adopted)
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

    def _never_placed_elsewhere(self, spec: CacheSpec, job: JSON, pods: list[JSON]) -> bool:
        """Whether an active download Job asks for another placement than the cache now
        does while none of its pods ever reached a node (nothing ran, nothing written)."""
        if job_phase(job) is not JobPhase.ACTIVE:
            return False
        template = get_path(job, "spec", "template", "spec") or {}
        wanted = job_placement(spec, self.settings.policy)
        if (template.get("nodeSelector") or {}) == (wanted.get("nodeSelector") or {}) and (
            template.get("tolerations") or []
        ) == (wanted.get("tolerations") or []):
            return False
        return all(not get_path(p, "spec", "nodeName") for p in pods)

    # -- what the download found -----------------------------------------------------

    def _download_report(
        self, obj: JSON, download: JSON | None, pods: list[JSON]
    ) -> tuple[ScriptReport | None, bool]:
        """The succeeded download's result: from the Job's annotation, else its pod's
        termination message (then kept on the Job), else what the status already said."""
        kept = parse_result(
            (get_path(download, "metadata", "annotations") or {}).get(RESULT_ANNOTATION)
        )
        if kept is not None:
            return kept, False
        report = pod_report(pods)
        if report is not None and download is not None:
            line = f"flexinfer: {report.result.value} {report.detail}".strip()
            wrote = (
                self.writer.annotate(
                    JOBS,
                    str(get_path(download, "metadata", "namespace")),
                    str(get_path(download, "metadata", "name")),
                    {RESULT_ANNOTATION: line},
                )
                is not None
            )
            return report, wrote
        if status_says_adopted(obj):
            return ScriptReport(DirResult.ADOPTED, "as said before"), False
        return None, False

    def _download_failed(
        self, spec: CacheSpec, download: JSON | None, pods: list[JSON]
    ) -> CacheStatus:
        report = pod_report(pods)
        if report is not None and report.result is DirResult.FOREIGN:
            return CacheStatus(
                "Failed",
                False,
                reasons.FOREIGN_DIRECTORY,
                f"{spec.path} holds files flexinfer did not write ({report.detail.strip()}) and "
                "no model it recognises (the file the source names, mlc-chat-config.json, "
                "*.gguf, config.json with *.safetensors or *.bin, or an Ollama manifests/ and "
                "blobs/): flexinfer never writes into such a directory; point spec.modelPath "
                "at an empty or new directory, or put the model there, then delete the Job "
                f"{spec.download_job_name}",
                spec.download_job_name,
            )
        if report is not None and report.result is DirResult.EMPTY:
            return CacheStatus(
                "Failed",
                False,
                reasons.NO_MODEL,
                f"{spec.path} holds no model and spec.source is empty: set spec.source to the "
                "model to download (e.g. HF://org/name), or put the model there and delete "
                f"the Job {spec.download_job_name}",
                spec.download_job_name,
            )
        return CacheStatus(
            "Failed",
            False,
            reasons.DOWNLOAD_FAILED,
            f"download Job {spec.download_job_name} failed: "
            f"{job_failure(download, self.cache.objects(PODS, spec.namespace))}",
            spec.download_job_name,
        )

    # -- the finalizer and the cleanup -----------------------------------------------

    def _finalizer(self, obj: JSON, spec: CacheSpec) -> bool:
        """A node-bound cache carries the cleanup finalizer (added once)."""
        finalizers = list(get_path(obj, "metadata", "finalizers") or [])
        if (
            CLEANUP_FINALIZER in finalizers
            or cleanup_job(spec, self.images, deadline_seconds=1) is None
        ):
            return False
        return self._set_finalizers(obj, [*finalizers, CLEANUP_FINALIZER])

    def _set_finalizers(self, obj: JSON, finalizers: list[str]) -> bool:
        meta = obj.get("metadata") or {}
        body: JSON = {"metadata": {"finalizers": finalizers}}
        if meta.get("resourceVersion"):
            # Another writer's finalizer added meanwhile must not be lost: conflict instead.
            body["metadata"]["resourceVersion"] = meta["resourceVersion"]
        return (
            self.writer.patch(MODEL_CACHES, str(meta.get("namespace")), str(meta.get("name")), body)
            is not None
        )

    def _release(self, obj: JSON, lease: JSON | None) -> bool:
        """Let a deleted cache go: its lease, then the finalizer."""
        name = str(get_path(obj, "metadata", "name"))
        namespace = str(get_path(obj, "metadata", "namespace"))
        wrote = False
        if lease is not None and _owned_by_cache(lease, name):
            wrote = self.writer.delete(GPU_LEASES, namespace, finetune_lease_name(name))
        finalizers = list(get_path(obj, "metadata", "finalizers") or [])
        if CLEANUP_FINALIZER in finalizers:
            finalizers.remove(CLEANUP_FINALIZER)
            wrote = self._set_finalizers(obj, finalizers) or wrote
        return wrote

    def _delete(self, obj: JSON, spec: CacheSpec, lease: JSON | None, *, now: datetime) -> Outcome:
        """A deleted cache: the cleanup Job on its node, then the finalizer goes; bounded."""
        namespace = spec.namespace
        finalizers = get_path(obj, "metadata", "finalizers") or []
        if CLEANUP_FINALIZER not in finalizers:
            return Outcome(None, self._release(obj, lease), reasons.DELETING)
        bound = self.timeouts.cleanup
        body = cleanup_job(
            spec,
            self.images,
            deadline_seconds=max(1, int(bound.total_seconds())),
            policy=self.policy,
        )
        if body is not None:
            body = secure_job(body, policy=self.policy, writers=["cleanup"])
        if body is None:
            return Outcome(None, self._release(obj, lease), reasons.DELETING)
        dirs = " and ".join(spec.node_dirs)
        node = ", ".join(f"{k}={v}" for k, v in spec.node_selector)
        by_hand = f"remove it on the node by hand: rm -rf {' '.join(spec.node_dirs)}"
        job = self.cache.get(JOBS, namespace, spec.cleanup_job_name)
        labels = get_path(job, "metadata", "labels") or {}
        if job is not None and labels.get(CACHE_LABEL) != spec.name:
            # Not flexinfer's (someone else's Job of that name): never deleted or read.
            return self._give_up(
                obj,
                lease,
                f"Job {namespace}/{spec.cleanup_job_name} is not flexinfer's; {by_hand}",
                now=now,
            )
        if (
            job is not None
            and (get_path(job, "metadata", "annotations") or {}).get(UID_ANNOTATION) != spec.uid
        ):
            # A cleanup Job of an earlier cache of this name: not ours to read.
            self.writer.delete(JOBS, namespace, spec.cleanup_job_name)
            return Outcome(now + CLAIM_RECHECK, True, reasons.DELETING)
        deleted_at = parse_rfc3339(get_path(obj, "metadata", "deletionTimestamp")) or now
        if job is None:
            if now >= deleted_at + bound + CLEANUP_GRACE:
                return self._give_up(
                    obj,
                    lease,
                    f"the cleanup Job could not be created within {bound}; {by_hand}",
                    now=now,
                )
            try:
                self.writer.create(JOBS, namespace, body)
            except KubeError as error:
                log.warning(
                    "cleanup job refused",
                    extra={
                        "fields": {
                            "namespace": namespace,
                            "modelcache": spec.name,
                            "error": str(error),
                        }
                    },
                )
                return Outcome(deleted_at + bound + CLEANUP_GRACE, False, reasons.DELETING)
            status = CacheStatus(
                "Deleting",
                False,
                reasons.DELETING,
                f"cleanup Job {spec.cleanup_job_name} removes {dirs} on {node} (only what "
                f"flexinfer wrote); the cache goes when it ends, or after {bound}",
                spec.cleanup_job_name,
            )
            self._write_status(obj, status, path=spec.path, now=now)
            return Outcome(now + bound + CLEANUP_GRACE, True, reasons.DELETING)
        phase = job_phase(job)
        pods = job_pods(self.cache.objects(PODS, namespace), spec.cleanup_job_name)
        if phase is JobPhase.SUCCEEDED:
            report = pod_report(pods)
            said = report.detail if report is not None else f"removed {dirs}"
            kept = "kept:" in said and not said.rstrip().endswith("kept: none")
            self.writer.event(
                obj,
                reason=reasons.CLEANED_UP,
                message=f"cleanup Job {spec.cleanup_job_name} on {node}: {said}"
                + ("; a kept directory was not flexinfer's and stays" if kept else ""),
                type="Normal",
                now=now,
            )
            return Outcome(None, self._release(obj, lease) or True, reasons.CLEANED_UP)
        if phase is JobPhase.FAILED:
            return self._give_up(
                obj,
                lease,
                f"cleanup Job {spec.cleanup_job_name} failed: {job_failure(job, pods)}; {by_hand}",
                now=now,
            )
        started = parse_rfc3339(get_path(job, "metadata", "creationTimestamp")) or deleted_at
        waiting = unschedulable(pods)
        if now >= started + bound + CLEANUP_GRACE:
            self.writer.delete(JOBS, namespace, spec.cleanup_job_name)
            why = f"its pod could not be scheduled: {waiting[0]}" if waiting else "it did not end"
            return self._give_up(
                obj,
                lease,
                f"cleanup Job {spec.cleanup_job_name} on {node} did not finish within {bound} "
                f"({why}); {by_hand}",
                now=now,
            )
        status = CacheStatus(
            "Deleting",
            False,
            reasons.DELETING,
            f"cleanup Job {spec.cleanup_job_name} removes {dirs} on {node}"
            + (f"; its pod cannot be scheduled yet: {waiting[0]}" if waiting else "")
            + "; the cache goes when it ends, or by "
            + str(format_rfc3339(started + bound + CLEANUP_GRACE)),
            spec.cleanup_job_name,
        )
        wrote = self._write_status(obj, status, path=spec.path, now=now)
        return Outcome(started + bound + CLEANUP_GRACE, wrote, reasons.DELETING)

    def _give_up(self, obj: JSON, lease: JSON | None, message: str, *, now: datetime) -> Outcome:
        self.writer.event(
            obj, reason=reasons.CLEANUP_FAILED, message=message, type="Warning", now=now
        )
        return Outcome(None, self._release(obj, lease) or True, reasons.CLEANUP_FAILED)

    def _foreign_job(self, spec: CacheSpec, name: str) -> CacheStatus | None:
        """A Job of one of this cache's names that this cache does not control: it is
        never used, nor deleted (someone else's work), and the cache says so."""
        job = self.cache.get(JOBS, spec.namespace, name)
        owner = controller_of(job)
        if job is None or (owner is not None and owner.get("uid") == spec.uid):
            return None
        whose = (
            f"belongs to {owner.get('kind')} {owner.get('name')}"
            if owner is not None
            else "was not created by flexinfer"
        )
        return CacheStatus(
            "Failed",
            False,
            reasons.NAME_CLASH,
            f"Job {spec.namespace}/{name} {whose}: flexinfer neither uses nor deletes it; "
            "delete or rename it, or rename the ModelCache",
        )

    # -- storage ---------------------------------------------------------------------

    def _claim(self, spec: CacheSpec) -> bool:
        claim = claim_manifest(spec)
        if claim is None:
            return False
        live = self.cache.get(PERSISTENT_VOLUME_CLAIMS, spec.namespace, spec.claim)
        if live is not None:
            # A claim's spec is immutable once bound; ours is never edited. A Pending one
            # holds no data yet: when the spec now asks for other access modes or another
            # class (the fix its condition asked for), it is made again.
            if get_path(live, "status", "phase") == "Pending" and claim_differs(spec, live):
                # Its download pod goes too: a pod that names a claim holds it (the
                # pvc-protection finalizer) and it never ran (the claim was not bound).
                self.writer.delete(JOBS, spec.namespace, spec.download_job_name)
                if not get_path(live, "metadata", "deletionTimestamp"):
                    self.writer.delete(PERSISTENT_VOLUME_CLAIMS, spec.namespace, spec.claim)
                return True
            return False
        self.writer.apply(PERSISTENT_VOLUME_CLAIMS, claim)
        return True

    def _claim_unbound(self, spec: CacheSpec) -> bool:
        if not spec.claim:
            return False
        live = self.cache.get(PERSISTENT_VOLUME_CLAIMS, spec.namespace, spec.claim)
        if live is None and not spec.create_claim:
            # The controller watches only the claims it made; the user's is asked for.
            try:
                live = self.api.get(PERSISTENT_VOLUME_CLAIMS, spec.namespace, spec.claim)
            except NotFound:
                return True
        return bool(get_path(live, "status", "phase") != "Bound")

    def _claim_events(self, spec: CacheSpec) -> tuple[bool, str]:
        """The newest Event on the claim, Warnings first: whether it is a Warning, and
        the binder's or the provisioner's own words ("" when none or unreadable)."""
        return self._newest_event(spec.namespace, "PersistentVolumeClaim", spec.claim)

    def _newest_event(self, namespace: str, kind: str, name: str) -> tuple[bool, str]:
        """The newest Event on an object, Warnings first: whether it is a Warning, and
        its reason and message ("" when none or unreadable)."""
        try:
            listed = self.api.request(
                "GET",
                EVENTS.path(namespace),
                query={"fieldSelector": f"involvedObject.kind={kind},involvedObject.name={name}"},
            )
        except KubeError as error:
            log.debug(
                "events unreadable", extra={"fields": {"kind": kind, "error": str(error)}}
            )
            return False, ""

        def when(event: JSON) -> str:
            return str(
                event.get("lastTimestamp")
                or event.get("eventTime")
                or get_path(event, "metadata", "creationTimestamp")
                or ""
            )

        items = sorted(
            listed.get("items") or [], key=lambda e: (e.get("type") == "Warning", when(e))
        )
        if not items:
            return False, ""
        newest = items[-1]
        text = f"{newest.get('reason') or 'Event'}: {newest.get('message') or ''}".strip()
        return newest.get("type") == "Warning", text[:MESSAGE_LIMIT]

    def _claim_pending(
        self, obj: JSON, spec: CacheSpec, *, now: datetime
    ) -> tuple[CacheStatus, bool]:
        warning, said = self._claim_events(spec)
        message = (
            f"claim {spec.claim} is not bound yet: the download Job {spec.download_job_name} "
            "starts once it is"
            + (f"; the claim says {said}{claim_hint(spec, said)}" if said else "")
        )
        status = CacheStatus(
            "Pending", False, reasons.CLAIM_PENDING, message, spec.download_job_name
        )
        wrote = False
        if warning and get_path(obj, "status", "message") != message:
            self.writer.event(
                obj, reason=reasons.CLAIM_PENDING, message=message, type="Warning", now=now
            )
            wrote = True
        return status, wrote

    def _job_refused(
        self, obj: JSON, namespace: str, job: str, *, now: datetime
    ) -> tuple[CacheStatus, bool] | None:
        """A Job that has no pod because the API server refuses to create it (a
        ResourceQuota, a Pod Security level, an admission policy): the Job controller
        says so only in a `FailedCreate` Event on the Job, and the Job stays active for
        ever. The status quotes it (a Warning Event on the cache when it changes), so the
        user sees what to fix rather than a copy that never starts. None when the Job's
        newest Warning is not that."""
        warning, said = self._newest_event(namespace, "Job", job)
        if not warning or not said.startswith("FailedCreate"):
            return None
        message = f"the Job {job} cannot create its pod: {said}"
        status = CacheStatus("Pending", False, reasons.JOB_POD_REFUSED, message, job)
        if get_path(obj, "status", "message") == message:
            return status, False
        self.writer.event(
            obj, reason=reasons.JOB_POD_REFUSED, message=message, type="Warning", now=now
        )
        return status, True

    # -- finetune --------------------------------------------------------------------

    def _finetune(
        self, obj: JSON, spec: CacheSpec, lease: JSON | None, *, now: datetime
    ) -> tuple[CacheStatus, datetime | None, bool]:
        namespace, name = spec.namespace, spec.name
        finetune = get_path(obj, "spec", "finetune") or {}
        group = str(get_path(finetune, "gpuLease", "group") or "")
        try:
            job_body = secure_job(
                finetune_job(
                    spec,
                    obj,
                    default_image=self.finetune_image,
                    video_gid=self.settings.video_gid,
                    render_gid=self.settings.render_gid,
                    policy=self.policy,
                ),
                policy=self.policy,
                writers=["finetune"],
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
        pods = job_pods(self.cache.objects(PODS, namespace), job_name(name))
        parked = (get_path(job, "metadata", "annotations") or {}).get(UNSCHEDULABLE_ANNOTATION)
        waiting: str | None = None
        release_at: datetime | None = None
        if phase is JobPhase.ACTIVE and not parked:
            stuck = unschedulable(pods)
            if stuck is None and not pods:
                # No pod at all: the API server may be refusing it (a quota, the
                # namespace's Pod Security level). The lease would park serving for
                # nothing just the same; the bound counts from the Job's creation.
                warning, said = self._newest_event(namespace, "Job", job_name(name))
                if warning and said.startswith("FailedCreate"):
                    stuck = (
                        f"the API server refuses its pod: {said}",
                        parse_rfc3339(get_path(job, "metadata", "creationTimestamp")),
                    )
            resource = _gpu_resource(finetune)
            if stuck is not None and not waits_for_gpu(stuck[0], resource):
                waiting = stuck[0]
                release_at = (stuck[1] or now) + self.timeouts.finetune_unschedulable
                if now >= release_at:
                    # Not the GPU: the lease would park serving for nothing until the
                    # Job's deadline. Suspend the Job (its pod goes, it stays readable)
                    # and let the lease go with it.
                    updated = self.writer.patch(
                        JOBS,
                        namespace,
                        job_name(name),
                        {
                            "metadata": {"annotations": {UNSCHEDULABLE_ANNOTATION: waiting}},
                            "spec": {"suspend": True},
                        },
                    )
                    wrote = updated is not None
                    parked = waiting
        if parked:
            phase = JobPhase.FAILED
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
        if plan_next := (release_at if waiting else None):
            next_at = plan_next if next_at is None else min(next_at, plan_next)
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
        elif parked:
            limit = self.timeouts.finetune_unschedulable
            status = CacheStatus(
                "Failed",
                False,
                reasons.FINETUNE_UNSCHEDULABLE,
                f"finetune Job {job_name(name)} was suspended: its pod could not be scheduled "
                f"for {limit} (--finetune-unschedulable-timeout) for a reason other than the "
                f"GPU: {parked}"
                + (f"; GPU lease {finetune_lease_name(name)} released" if group else "")
                + "; fix what that names (spec.nodeSelector, spec.tolerations, the "
                "namespace's quota), then delete the Job "
                f"{job_name(name)} to train again",
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
            if waiting and release_at is not None:
                doing = (
                    f"cannot be scheduled: {waiting}; unless it is, the Job is suspended and "
                    f"its GPU lease released at {format_rfc3339(release_at)}"
                )
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
                [Condition("Ready", status.ready, status.reason, status.message)]
                + (
                    [
                        Condition(
                            ADOPTED_CONDITION,
                            status.adopted,
                            reasons.ADOPTED if status.adopted else reasons.CACHE_READY,
                            (
                                f"{path} is a directory flexinfer did not write: used as it "
                                "is; flexinfer never writes, rewrites or removes it"
                            )
                            if status.adopted
                            else f"flexinfer wrote {path} and keeps it",
                        )
                    ]
                    if status.adopted is not None
                    else []
                ),
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


def _gpu_resource(finetune: Mapping[str, Any]) -> str:
    try:
        return Vendor(str(get_path(finetune, "gpu", "vendor") or "amd")).resource or ""
    except ValueError:
        return ""


def _source_of(job: Mapping[str, Any]) -> str:
    return str((get_path(job, "metadata", "annotations") or {}).get(SOURCE_ANNOTATION) or "")


def _owned_by_cache(lease: Mapping[str, Any], cache_name: str) -> bool:
    refs = get_path(lease, "metadata", "ownerReferences") or []
    return any(r.get("kind") == MODEL_CACHES.kind and r.get("name") == cache_name for r in refs)
