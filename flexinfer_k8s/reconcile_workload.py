"""Reconcile what a Model or ModelDeployment runs as: render, apply what differs, report.

Observe the resource, the ModelCache it references and the Deployment and Service
named like it; render them (`flexinfer_k8s.render`, pure); server-side apply each one
the live object does not already hold (one field manager, so labels, annotations or
env a user adds survive and ours converge); write `endpoint(s)`, `servedModelName`
and the `Rendered`, `CacheReady` and `VRAMFits` conditions; a Warning Event when a
condition turns bad. Replicas are never applied: a new Deployment is created at
`replicas: 0` and the field is handed to the election's scale writes
(`REPLICAS_MANAGER`) before anything else is applied, so no apply ever resets it to
the API server's default of 1 beside the group's holder. Who owns `spec.replicas` is
read from the live object's managedFields at every reconcile, never remembered.

Bad input (an invalid field, a missing or broken cache, a name another resource's
workload already has) becomes a condition naming it and touches nothing else.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from flexinfer_core import Condition, InvalidFieldError, reasons
from flexinfer_k8s.apply import FIELD_MANAGER, REPLICAS_MANAGER
from flexinfer_k8s.host_volumes import HostVolumes
from flexinfer_k8s.live_diff import holds
from flexinfer_k8s.outcome import RECHECK_AFTER, Outcome, Wiring
from flexinfer_k8s.render import backend_cache, gpu_claim
from flexinfer_k8s.render.cache import CacheSpec
from flexinfer_k8s.render.model_files import (
    implied_cache_manifest,
    implied_cache_name,
    implies_cache,
)
from flexinfer_k8s.render.tenant_policy import cache_within_policy
from flexinfer_k8s.render.workload import (
    Kind,
    Workload,
    workload_from_model,
    workload_from_model_deployment,
)
from flexinfer_k8s.render.workloads import (
    MANAGED_BY,
    RenderedWorkload,
    RenderSettings,
    owner_reference,
    render_workload,
    selector_labels,
)
from flexinfer_k8s.shared_card import (
    budgeted,
    claim_owner_problem,
    device_class_of,
    gpu_group_budgeted,
    in_use,
)
from flexinfer_k8s.status_diff import merge_conditions, status_differs
from flexinfer_kube.kubeapi import NotFound, Rejected
from flexinfer_kube.objects import JSON, get_path, name_of, namespace_of
from flexinfer_kube.resources import (
    DEPLOYMENTS,
    GPU_GROUPS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    NETWORK_POLICIES,
    PERSISTENT_VOLUME_CLAIMS,
    RESOURCE_CLAIMS,
    SERVICES,
    Resource,
)

log = logging.getLogger("flexinfer.workload")

APPLIED_HASH_ANNOTATION = "ai.flexinfer/applied-hash"
"""A digest of what flexinfer last applied: a render that drops a field changes it, so
the apply that removes the field is not skipped as 'already held'."""
REPLICAS_WARNED_ANNOTATION = "ai.flexinfer/replicas-warned"
"""On a rendered Deployment: the time of the last foreign write of `spec.replicas` a
Warning Event was sent for, so each `kubectl scale` is answered once."""
CLAIM_RECHECK = timedelta(seconds=5)
"""How often a group's claim that is going, or that keeps an old device class while a
pod holds it, is looked at again (no informer watches claims)."""
CLAIM_CLASH_RECHECK = timedelta(seconds=10)
"""How often a claim of the group's name that is not flexinfer's is looked at again."""
WORKLOAD_CONDITIONS = ("Rendered", "CacheReady", "VRAMFits", "BackendCache")


@attrs.frozen
class Problem:
    reason: str
    message: str


def _with_hash(body: JSON) -> JSON:
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    stamped = copy.deepcopy(body)
    stamped["metadata"].setdefault("annotations", {})[APPLIED_HASH_ANNOTATION] = digest
    return stamped


def replicas_need_handover(deployment: Mapping[str, Any]) -> bool:
    """Whether our applier is the only owner of `spec.replicas` (as after creating the
    Deployment at 0): its next apply, which leaves the field out, would drop it to the
    API server's default of 1. Owned by nobody (a scale to 0 through the subresource
    records no owner: the Scale's replicas is omitted when 0) or by anyone else, no
    apply of ours can reset it, and nothing is written."""
    ours = False
    for entry in get_path(deployment, "metadata", "managedFields") or []:
        if "f:replicas" not in (get_path(entry, "fieldsV1", "f:spec") or {}):
            continue
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply":
            ours = True
        else:
            return False
    return ours


# What a workload reconcile reads of a Model or ModelDeployment's status: the fields
# it writes (to put them back if someone else's write dropped them).
_OWNED_STATUS = ("endpoint", "endpoints", "servedModelName")


def workload_inputs_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an update of a Model, ModelDeployment, Deployment or Service can change
    what its workload reconcile renders, applies or reports. Status is read only for
    the fields that reconcile owns, so the election's status writes and a Deployment's
    rollout progress (most of the updates in a burst of swaps) queue no render."""

    def inputs(obj: Mapping[str, Any]) -> Any:
        meta = {
            k: v
            for k, v in (obj.get("metadata") or {}).items()
            if k not in ("resourceVersion", "managedFields", "generation")
        }
        status = obj.get("status") or {}
        owned = {k: status.get(k) for k in _OWNED_STATUS}
        owned["conditions"] = [
            c
            for c in status.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") in WORKLOAD_CONDITIONS
        ]
        return (meta, obj.get("spec"), owned)

    return bool(inputs(old) != inputs(new))


def _controlled_by(obj: Mapping[str, Any] | None, uid: Any) -> bool:
    owner = controller_of(obj)
    return owner is not None and bool(uid) and owner.get("uid") == uid


def _replicas_governed_by(
    resource: Resource, obj: Mapping[str, Any], *, groups_listing: Callable[[str, str], list[str]]
) -> str:
    """Which field to change instead of the Deployment's replicas."""
    if resource is MODELS:
        return (
            "change the Model's spec.serverless.minReplicas (pods kept while idle) or send "
            "requests through the proxy; in a shared group spec.gpu.priority and "
            "spec.gpu.forcePromotion decide who holds the card"
        )
    groups = groups_listing(namespace_of(obj), name_of(obj))
    if groups:
        return (
            f"it is a member of GPUGroup {', '.join(groups)}, whose decision says which members "
            "run: change the group's spec.models[].priority, or send requests through "
            "the proxy"
        )
    return (
        "change the ModelDeployment's spec.replicas (pods while in use) or spec.minReplicas "
        "(pods kept while idle)"
    )


def controller_of(obj: Mapping[str, Any] | None) -> JSON | None:
    for ref in get_path(obj, "metadata", "ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


class WorkloadReconciler:
    def __init__(self, wiring: Wiring, *, settings: RenderSettings | None = None) -> None:
        self.cache = wiring.cache
        self.writer = wiring.writer
        self.api = wiring.api
        self.clock = wiring.clock
        self.settings = settings or RenderSettings()
        self.host_volumes = HostVolumes(wiring, settings=self.settings)
        # The decision workers (before a scale write) and this reconciler both answer a
        # foreign replicas write; one at a time, so the annotation says it was answered.
        self._answering = threading.Lock()

    def reconcile_model(self, namespace: str, name: str) -> Outcome:
        model = self.cache.get(MODELS, namespace, name)
        if model is None or get_path(model, "metadata", "deletionTimestamp"):
            return Outcome(None, False)
        return self._reconcile(MODELS, model, workload_from_model)

    def reconcile_model_deployment(self, namespace: str, name: str) -> Outcome:
        md = self.cache.get(MODEL_DEPLOYMENTS, namespace, name)
        if md is None or get_path(md, "metadata", "deletionTimestamp"):
            return Outcome(None, False)
        groups = self.cache.gpu_groups_with_member(namespace, name)
        group = groups[0] if len(groups) == 1 else ""
        group_obj = self.cache.get(GPU_GROUPS, namespace, group) if group else None
        selector = get_path(group_obj, "spec", "nodeSelector") or {}
        group_selector = tuple(sorted((str(k), str(v)) for k, v in selector.items()))
        return self._reconcile(
            MODEL_DEPLOYMENTS,
            md,
            lambda obj: workload_from_model_deployment(
                obj, group=group, group_node_selector=group_selector
            ),
        )

    # -- the reconcile -----------------------------------------------------------------

    def _reconcile(
        self, resource: Resource, obj: JSON, read: Callable[[JSON], Workload]
    ) -> Outcome:
        now = self.clock.now()
        name = name_of(obj)
        conditions: list[Condition] = []
        rendered: RenderedWorkload | None = None
        problem: Problem | None = None
        wrote = False
        workload: Workload | None = None
        try:
            workload = read(obj)
            implied, wrote = self._implied_cache(workload)
            cache, cache_condition, problem = self._cache(workload, implied=implied)
            if cache_condition is not None:
                conditions.append(cache_condition)
            if problem is None:
                rendered = render_workload(
                    workload,
                    cache=cache,
                    settings=self.settings,
                    shared_card=self._shared_card(workload),
                )
        except InvalidFieldError as error:
            problem = Problem(reasons.INVALID_SPEC, str(error))
        if problem is None:
            problem = self._clash(resource, obj)
        if problem is None and rendered is not None and rendered.host_volumes:
            # A file:// source: its `local` volume and claim before the pod asks for them.
            made, host_problem = self.host_volumes.ensure(rendered.host_volumes)
            wrote = made or wrote
            if host_problem is not None:
                problem = Problem(
                    host_problem.reason,
                    f"{host_problem.message}: the model's host directory cannot be mounted",
                )
        recheck: datetime | None = None
        if (
            problem is None
            and rendered is not None
            and rendered.gpu_claim is not None
            and workload is not None
        ):
            # The group's card before any pod asks for it; a claim that is not ours
            # stops everything (the pods would use someone else's device).
            card_wrote, problem, wait = self._gpu_claim(workload, rendered.gpu_claim)
            wrote = card_wrote or wrote
            if wait is not None:
                recheck = now + wait
        if problem is None and rendered is not None and workload is not None:
            claim_wrote, claim_condition = self._backend_cache(workload, rendered)
            wrote = claim_wrote or wrote
            if claim_condition is not None:
                conditions.append(claim_condition)
            applied, problem = self._apply_admitted(rendered)
            wrote = applied or wrote
            if problem is None:
                self._answer_foreign_scale(resource, obj, now=now)
        if problem is None and rendered is not None and workload is not None:
            conditions.append(
                Condition(
                    "Rendered",
                    True,
                    reasons.RENDERED,
                    f"Deployment and Service {name} serve {rendered.served_name} on "
                    f"{rendered.endpoint}",
                )
            )
            if rendered.vram is not None:
                conditions.append(
                    Condition(
                        "VRAMFits",
                        rendered.vram.fits,
                        reasons.KV_CACHE_FITS
                        if rendered.vram.fits
                        else reasons.KV_CACHE_EXCEEDS_GPU_MEMORY,
                        rendered.vram.message,
                    )
                )
        elif problem is not None:
            conditions.append(Condition("Rendered", False, problem.reason, problem.message))
        wrote = self._write_status(resource, obj, rendered, conditions, now=now) or wrote
        return Outcome(recheck, wrote, problem.reason if problem else reasons.RENDERED)

    def _shared_card(self, workload: Workload) -> gpu_claim.SharedCard | None:
        """The group's card, for a Model of a budgeted shared group or a ModelDeployment of
        a GPUGroup that sets `spec.vramBudget`, when the controller has a DRA device class
        (`--gpu-device-class`); None renders exactly as without."""
        if not workload.group or not self.settings.gpu_device_class:
            return None
        if workload.kind is Kind.MODEL_DEPLOYMENT:
            group = self.cache.get(GPU_GROUPS, workload.namespace, workload.group)
            if group is None or not gpu_group_budgeted(group):
                return None
            return gpu_claim.shared_card_of_gpu_group(group)
        members = self.cache.shared_group_models(workload.namespace, workload.group)
        if not budgeted(members):
            return None
        return gpu_claim.shared_card_of_models(members)

    def _gpu_claim(
        self, workload: Workload, wanted: JSON
    ) -> tuple[bool, Problem | None, timedelta | None]:
        """The group's ResourceClaim: created when missing; its owners and labels kept
        up with the group. Never one flexinfer did not create (a Problem naming it). A
        claim's spec cannot change: one of another device class is deleted and made
        again, but only once no pod holds it. Returns (wrote, problem, when to look again:
        no informer watches claims, so what it waits for is polled)."""
        namespace, name = workload.namespace, str(wanted["metadata"]["name"])
        live = self._live_claim(namespace, name)
        if live is None:
            created = self.writer.create(RESOURCE_CLAIMS, namespace, wanted)
            if created is not None:
                log.info(
                    "created the group's claim",
                    extra={"fields": {"namespace": namespace, "claim": name}},
                )
                return True, None, None
            live = self._live_claim(namespace, name)  # someone was first: whose is it?
            if live is None:
                return False, None, RECHECK_AFTER
        gpu_group = workload.kind is Kind.MODEL_DEPLOYMENT
        owning: list[JSON | None] = (
            [self.cache.get(GPU_GROUPS, namespace, workload.group)]
            if gpu_group
            else list(self.cache.shared_group_models(namespace, workload.group))
        )
        uids = {str(get_path(o, "metadata", "uid") or "") for o in owning} - {""}
        clash = claim_owner_problem(
            live, group=workload.group, member_uids=uids, gpu_group=gpu_group
        )
        if clash:
            return False, Problem(reasons.NAME_CLASH, clash), CLAIM_CLASH_RECHECK
        if get_path(live, "metadata", "deletionTimestamp"):
            return False, None, CLAIM_RECHECK  # made again once it is gone
        wanted_class = self.settings.gpu_device_class
        if device_class_of(live) != wanted_class:
            if in_use(live):
                log.debug(
                    "the group's claim keeps its device class until no pod holds it",
                    extra={
                        "fields": {
                            "namespace": namespace,
                            "claim": name,
                            "class": device_class_of(live),
                            "wanted": wanted_class,
                        }
                    },
                )
                return False, None, CLAIM_RECHECK
            self.writer.delete(RESOURCE_CLAIMS, namespace, name)
            return True, None, RECHECK_AFTER
        labels = wanted["metadata"]["labels"]
        owners = wanted["metadata"]["ownerReferences"]
        live_owners = get_path(live, "metadata", "ownerReferences") or []
        if holds(labels, get_path(live, "metadata", "labels")) and sorted(
            str(o.get("uid")) for o in live_owners
        ) == sorted(str(o.get("uid")) for o in owners):
            return False, None, None
        # Metadata only (the spec is immutable); a merge patch replaces the owner list,
        # so a member that left the group no longer keeps the claim.
        self.writer.patch(
            RESOURCE_CLAIMS,
            namespace,
            name,
            {"metadata": {"labels": labels, "ownerReferences": owners}},
        )
        return True, None, None

    def _live_claim(self, namespace: str, name: str) -> JSON | None:
        """The claim as the API server has it now (no informer watches claims)."""
        try:
            return self.api.get(RESOURCE_CLAIMS, namespace, name)
        except NotFound:
            return None

    def _implied_cache(self, workload: Workload) -> tuple[JSON | None, bool]:
        """The ModelCache a Model's `spec.cache.strategy` implies, applied (or deleted
        when no longer implied), and whether anything was written. A ModelCache of that
        name that is not this Model's is refused, never taken over."""
        if workload.kind is not Kind.MODEL:
            return None, False
        namespace, name = workload.namespace, implied_cache_name(workload.name)
        live = self.cache.get(MODEL_CACHES, namespace, name)
        ours = live is not None and _controlled_by(live, workload.uid)
        if not implies_cache(workload):
            if ours and not get_path(live, "metadata", "deletionTimestamp"):
                self.writer.delete(MODEL_CACHES, namespace, name)
                return None, True
            return None, False
        if live is not None and not ours:
            raise InvalidFieldError(
                "spec.cache.strategy",
                workload.cache_strategy,
                f"implies the ModelCache {name}, but a ModelCache of that name exists and is "
                f"not this Model's: set spec.cache.modelCacheRef: {name} to serve from it, or "
                "rename it",
            )
        manifest = implied_cache_manifest(
            workload,
            owner=owner_reference(workload),
            labels={**MANAGED_BY, **selector_labels(workload.kind, workload.name)},
        )
        if live is not None and holds(manifest, live):
            return live, False
        return self.writer.apply(MODEL_CACHES, manifest), True

    def _cache(
        self, workload: Workload, *, implied: JSON | None
    ) -> tuple[CacheSpec | None, Condition | None, Problem | None]:
        """The ModelCache the workload serves from (`modelCacheRef`; the one its
        `spec.cache.strategy` implies; for a ModelDeployment's plain `model`, the one
        whose modelPath it is), its readiness condition, or why it cannot be used."""
        namespace = workload.namespace
        ref = workload.cache_ref
        obj: JSON | None = None
        how = ""
        if ref:
            obj = self.cache.get(MODEL_CACHES, namespace, ref)
        elif implied is not None:
            ref, obj, how = name_of(implied), implied, " (implied by spec.cache.strategy)"
        elif workload.kind is Kind.MODEL_DEPLOYMENT and workload.source is None:
            holding = self.cache.caches_holding(namespace, workload.model)
            if len(holding) > 1:
                names = ", ".join(name_of(c) for c in holding)
                return (
                    None,
                    None,
                    Problem(
                        reasons.INVALID_SPEC,
                        f"spec.model: {workload.model!r} is the modelPath of ModelCaches {names}: "
                        "set spec.modelCacheRef to the one to serve from",
                    ),
                )
            if holding:
                obj = holding[0]
                ref, how = name_of(obj), " (its modelPath is spec.model)"
        if not ref:
            return None, None, None
        if obj is None:
            message = f"ModelCache {ref} does not exist in namespace {namespace}"
            return (
                None,
                Condition("CacheReady", False, reasons.CACHE_NOT_FOUND, message),
                Problem(reasons.CACHE_NOT_FOUND, message),
            )
        try:
            spec = cache_within_policy(
                obj, self.settings.policy, images=self.settings.rendered_images()
            )
        except InvalidFieldError as error:
            message = f"ModelCache {ref}{how} cannot be used: {error}"
            return (
                None,
                Condition("CacheReady", False, reasons.INVALID_SPEC, message),
                Problem(reasons.INVALID_SPEC, message),
            )
        strategy = workload.cache_strategy
        if strategy and strategy != "None" and strategy != spec.strategy.value:
            return (
                spec,
                None,
                Problem(
                    reasons.INVALID_SPEC,
                    f"spec.cache.strategy: {strategy!r} differs from ModelCache {ref}'s "
                    f"storageStrategy {spec.strategy.value}",
                ),
            )
        status = get_path(obj, "status") or {}
        if status.get("ready"):
            condition = Condition(
                "CacheReady",
                True,
                reasons.CACHE_READY,
                f"ModelCache {ref}{how} is ready at {spec.path}",
            )
        elif status.get("phase") == "Failed":
            condition = Condition(
                "CacheReady",
                False,
                reasons.CACHE_FAILED,
                f"ModelCache {ref}{how} failed: {status.get('message') or 'no reason given'}",
            )
        else:
            condition = Condition(
                "CacheReady",
                False,
                reasons.CACHE_NOT_READY,
                f"ModelCache {ref}{how} is {status.get('phase') or 'Pending'}: the model runs "
                "once its copy is complete",
            )
        return spec, condition, None

    def _backend_cache(
        self, workload: Workload, rendered: RenderedWorkload
    ) -> tuple[bool, Condition | None]:
        """The backend-cache claim: created when the pod mounts it and it is missing,
        deleted when a render no longer mounts it; its condition."""
        namespace, name = workload.namespace, backend_cache.claim_name(workload)
        live = self.cache.get(PERSISTENT_VOLUME_CLAIMS, namespace, name)
        wanted = rendered.backend_cache_claim
        ours = live is not None and _controlled_by(live, workload.uid)
        if wanted is None:
            if ours and not get_path(live, "metadata", "deletionTimestamp"):
                self.writer.delete(PERSISTENT_VOLUME_CLAIMS, namespace, name)
                return True, None
            return False, None
        wrote = False
        if live is None:
            live = self.writer.create(PERSISTENT_VOLUME_CLAIMS, namespace, wanted)
            wrote = True
        elif not ours:
            raise InvalidFieldError(
                "spec.backendCache",
                {"claim": name},
                f"names the claim {name}, which exists and is not this resource's: delete or "
                "rename that claim, or set spec.backendCache.enabled: false",
            )
        phase = str(get_path(live, "status", "phase") or "Pending")
        size = get_path(live, "spec", "resources", "requests", "storage") or ""
        if phase == "Bound":
            return wrote, Condition(
                "BackendCache",
                True,
                reasons.CLAIM_BOUND,
                f"claim {name} ({size}) is Bound: the backend's downloads and compiled "
                "libraries outlive its pods",
            )
        storage_class = get_path(live, "spec", "storageClassName")
        which = f"StorageClass {storage_class}" if storage_class else "the default StorageClass"
        return wrote, Condition(
            "BackendCache",
            False,
            reasons.CLAIM_PENDING,
            f"claim {name} is {phase}: no volume of {which} is bound to it yet, and the pod "
            "starts once one is. If it stays so, set spec.backendCache.storageClassName to a "
            "class that provisions ReadWriteOnce claims, or spec.backendCache.enabled: false "
            "(every start then downloads again)",
        )

    def answer_foreign_scale(self, deployment: Mapping[str, Any]) -> None:
        """`_answer_foreign_scale` for the resource that owns `deployment`, called before
        an election's scale write takes its replicas back (the write removes the trace)."""
        owner = controller_of(deployment) or {}
        resource = {MODELS.kind: MODELS, MODEL_DEPLOYMENTS.kind: MODEL_DEPLOYMENTS}.get(
            str(owner.get("kind"))
        )
        obj = (
            self.cache.get(resource, namespace_of(deployment), str(owner.get("name")))
            if resource is not None
            else None
        )
        if resource is not None and obj is not None:
            self._answer_foreign_scale(resource, obj, now=self.clock.now())

    def _answer_foreign_scale(self, resource: Resource, obj: JSON, *, now: datetime) -> None:
        """A Warning Event, once per write, when someone else (`kubectl scale`) set the
        governed Deployment's replicas: the election sets them back, and the user should
        know which field to change instead."""
        with self._answering:
            self._answer_foreign_scale_locked(resource, obj, now=now)

    def _answer_foreign_scale_locked(self, resource: Resource, obj: JSON, *, now: datetime) -> None:
        namespace, name = namespace_of(obj), name_of(obj)
        deployment = self.cache.get(DEPLOYMENTS, namespace, name)
        if deployment is None or not _controlled_by(deployment, get_path(obj, "metadata", "uid")):
            return
        foreign = [
            entry
            for entry in get_path(deployment, "metadata", "managedFields") or []
            if "f:replicas" in (get_path(entry, "fieldsV1", "f:spec") or {})
            and entry.get("manager") not in (FIELD_MANAGER, REPLICAS_MANAGER)
        ]
        if not foreign:
            return
        latest = max(foreign, key=lambda e: str(e.get("time") or ""))
        stamp = f"{latest.get('manager')}@{latest.get('time')}"
        annotations = get_path(deployment, "metadata", "annotations") or {}
        if annotations.get(REPLICAS_WARNED_ANNOTATION) == stamp:
            return
        how = " through the scale subresource" if latest.get("subresource") == "scale" else ""
        replicas = get_path(deployment, "spec", "replicas")
        instead = _replicas_governed_by(
            resource, obj, groups_listing=self.cache.gpu_groups_with_member
        )
        self.writer.event(
            obj,
            reason=reasons.REPLICAS_GOVERNED,
            message=(
                f"Deployment {name}'s spec.replicas was set to {replicas} by "
                f"{latest.get('manager')}{how}; flexinfer's election governs it and sets it "
                f"back: {instead}"
            ),
            type="Warning",
            now=now,
        )
        self.writer.annotate(DEPLOYMENTS, namespace, name, {REPLICAS_WARNED_ANNOTATION: stamp})

    def _clash(self, resource: Resource, obj: JSON) -> Problem | None:
        """A Deployment or Service of this name that is not this resource's own."""
        namespace, name = namespace_of(obj), name_of(obj)
        uid = get_path(obj, "metadata", "uid")
        for kind in (DEPLOYMENTS, SERVICES, NETWORK_POLICIES):
            live = self.cache.get(kind, namespace, name)
            if live is None:
                continue
            owner = controller_of(live)
            if owner is not None and owner.get("uid") == uid:
                continue
            if owner is None:
                whose = "was not created by flexinfer"
            elif owner.get("kind") == resource.kind and owner.get("name") == name:
                whose = (
                    f"belongs to an earlier {resource.kind} {name} (waiting for the garbage "
                    "collector to remove it)"
                )
            else:
                whose = f"belongs to {owner.get('kind')} {owner.get('name')}"
            return Problem(
                reasons.NAME_CLASH,
                f"{kind.kind} {namespace}/{name} {whose}; a Model and a ModelDeployment with one "
                "name cannot share their workload: rename one",
            )
        return None

    def _apply_admitted(self, rendered: RenderedWorkload) -> tuple[bool, Problem | None]:
        """`_apply`, or why the API server refused it (422: an admission policy such as
        deploy/controller-policy.yaml, or a value it cannot store): said on the resource
        instead of a reconcile that fails and retries without a word."""
        try:
            return self._apply(rendered), None
        except Rejected as error:
            if error.status != 422:  # forbidden and the like are not the spec's fault
                raise
            name = str(rendered.deployment["metadata"]["name"])
            return True, Problem(
                reasons.INVALID_SPEC,
                f"the API server refused what flexinfer rendered for {name}: {error}",
            )

    def _apply(self, rendered: RenderedWorkload) -> bool:
        parts: list[str] = []  # what was written, for the log line
        deployment = _with_hash(rendered.deployment)
        meta = deployment["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        live = self.cache.get(DEPLOYMENTS, namespace, name)
        if live is None:
            # Created at 0; the field goes to the scale writes at once (below).
            first = copy.deepcopy(deployment)
            first["spec"]["replicas"] = 0
            live = self.writer.apply(DEPLOYMENTS, first)
            parts.append("created")
        if replicas_need_handover(live):
            current = int(get_path(live, "spec", "replicas") or 0)
            live = self.writer.apply(
                DEPLOYMENTS,
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"replicas": current},
                },
                field_manager=REPLICAS_MANAGER,
            )
            parts.append("replicas handed over")
        if not holds(deployment, live):
            self.writer.apply(DEPLOYMENTS, deployment)
            parts.append("deployment")
        service = _with_hash(rendered.service)
        if not holds(service, self.cache.get(SERVICES, namespace, name)):
            self.writer.apply(SERVICES, service)
            parts.append("service")
        network = _with_hash(rendered.network_policy)
        if not holds(network, self.cache.get(NETWORK_POLICIES, namespace, name)):
            self.writer.apply(NETWORK_POLICIES, network)
            parts.append("networkpolicy")
        if parts:
            log.info(
                "applied workload",
                extra={
                    "fields": {
                        "namespace": namespace,
                        "name": name,
                        "kind": meta.get("labels", {}).get("ai.flexinfer/kind"),
                        "wrote": parts,
                    }
                },
            )
        return bool(parts)

    def _write_status(
        self,
        resource: Resource,
        obj: JSON,
        rendered: RenderedWorkload | None,
        conditions: list[Condition],
        *,
        now: datetime,
    ) -> bool:
        status = get_path(obj, "status") or {}
        generation = get_path(obj, "metadata", "generation")
        current = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
        # Conditions this reconciler owns but no longer reports (a cache reference
        # removed, a backend that is not mlc-llm) are dropped, others' kept.
        kept = [
            c
            for c in current
            if c.get("type") not in WORKLOAD_CONDITIONS
            or any(w.type == c.get("type") for w in conditions)
        ]
        wanted: JSON = {
            "conditions": merge_conditions(
                kept,
                conditions,
                now=now,
                generation=generation if isinstance(generation, int) else None,
            ),
            "servedModelName": rendered.served_name if rendered else None,
        }
        if resource is MODELS:
            wanted["endpoint"] = rendered.endpoint if rendered else None
        else:
            wanted["endpoints"] = [rendered.endpoint] if rendered else None
        if not status_differs(status, wanted):
            return False
        written = self.writer.patch_status(resource, obj, wanted)
        if written is None:
            return False
        now_bad = {c.type: c for c in conditions if not c.status}
        before = {str(c.get("type")): c for c in current}
        for condition in now_bad.values():
            old = before.get(condition.type)
            if (
                old is not None
                and old.get("status") == "False"
                and old.get("reason") == condition.reason
            ):
                continue  # already reported
            self.writer.event(
                obj, reason=condition.reason, message=condition.message, type="Warning", now=now
            )
        return True
