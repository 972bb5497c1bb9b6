"""The controller: informers -> keys -> work queue -> reconcilers, with timers.

Every watched change is mapped to the keys it can affect and queued; workers take
keys one at a time (never one key on two workers) and run the matching reconciler;
the reconciler's `next_change_at` arms that key's timer. Keys:

- ("shared", namespace, group): a Model shared group;
- ("model", namespace, name): a Model without a shared group (a group of one);
- ("gpugroup", namespace, name): a GPUGroup;
- ("modeldeployment", namespace, name): a ModelDeployment no GPUGroup governs
  (flexinfer_core.membership): standalone, scaled to zero when idle, or held at
  zero by a membership conflict;
- ("modelcache", namespace, name): a ModelCache (storage, download, finetune and its
  GPU lease);
- ("model-workload" | "md-workload", namespace, name): what a Model or ModelDeployment
  runs as (its rendered Deployment and Service, `reconcile_workload`).

A slow resync (default 5 min) re-queues every key as a safety net; correctness
never depends on it. Failures back off per key (doubling from 0.1 s up to 30 s, each
delay ±20 % so that keys failing together do not retry together), logged once per
change of error and once on recovery, never a traceback per retry. A status conflict
(`RetryNow`: the decision was made on a stale object, now re-read) is retried at once
up to `MAX_IMMEDIATE_RETRIES` times; after that the key backs off, and its next
attempts `insist`: the scale-downs that park members go out even if a status write
conflicts again. The controller owns threads and wiring; decisions are the core's,
writes are `apply`'s.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import attrs

from flexinfer_core import DEFAULT_POLICY, FlexinferError, MembershipKind, Policy
from flexinfer_k8s.apply import RetryNow, Writer
from flexinfer_k8s.cache import INFORMER_SELECTORS, WATCHED, ClusterCache
from flexinfer_k8s.convert_leases import (
    gpu_lease_from_config_map,
    gpu_lease_from_k8s,
)
from flexinfer_k8s.convert_models import model_state_group
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_k8s.outcome import Outcome, Wiring
from flexinfer_k8s.reconcile_cache import CacheReconciler, CacheTimeouts
from flexinfer_k8s.reconcile_gpugroup import GpuGroupReconciler
from flexinfer_k8s.reconcile_shared import DEFAULT_COALESCE, SharedGroupReconciler
from flexinfer_k8s.reconcile_standalone import StandaloneReconciler
from flexinfer_k8s.reconcile_workload import WorkloadReconciler, workload_inputs_changed
from flexinfer_k8s.render.cache import CACHE_LABEL
from flexinfer_k8s.render.workloads import GROUP_LABEL, KIND_LABEL, RenderSettings
from flexinfer_k8s.workqueue import WorkQueue
from flexinfer_kube.clock import Clock, SystemClock
from flexinfer_kube.informers import Informer, wait_all
from flexinfer_kube.kubeapi import JSON, KubeApi, KubeError
from flexinfer_kube.objects import gpu_group_member_names, gpu_group_ref, name_of, namespace_of
from flexinfer_kube.resources import (
    CONFIG_MAPS,
    DEPLOYMENTS,
    GPU_GROUPS,
    GPU_LEASES,
    JOBS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    NETWORK_POLICIES,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    SERVICES,
    Resource,
)

log = logging.getLogger("flexinfer.controller")

WorkKey = tuple[str, str, str]
TIMER_SLACK = timedelta(milliseconds=5)
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 30.0
BACKOFF_JITTER = 0.2
MAX_IMMEDIATE_RETRIES = 3


# What moves at every write of an object without being an input of any reconcile.
BOOKKEEPING = frozenset({"resourceVersion", "managedFields", "generation"})


def deployment_inputs_changed(old: JSON, new: JSON) -> bool:
    """Whether a Deployment's update changed anything a reconcile reads of it: its
    metadata (owner, labels, deletion) or spec (replicas, selector, template). Its
    status is read by none (a member's state comes from its pods), so the rollout
    progress the cluster's own controllers write, two or three updates a swap, queues
    nothing; nor does the watch's echo of the controller's own scale write, whose
    replicas the cache already holds."""

    def inputs(obj: JSON) -> tuple[JSON, Any]:
        meta = obj.get("metadata") or {}
        return ({k: v for k, v in meta.items() if k not in BOOKKEEPING}, obj.get("spec"))

    return inputs(old) != inputs(new)


def backoff_delay(failures: int, *, jitter: float) -> float:
    """Seconds before retrying a key after its `failures`-th failure in a row: doubling
    from `FIRST_BACKOFF`, times (1 + `jitter`), never more than `MAX_BACKOFF`."""
    base = FIRST_BACKOFF * 2 ** min(failures - 1, 32)
    return float(min(min(base, MAX_BACKOFF) * (1 + jitter), MAX_BACKOFF))


class Controller:
    def __init__(
        self,
        api: KubeApi,
        *,
        metrics: ControllerMetrics,
        namespaces: Sequence[str] = (),
        clock: Clock | None = None,
        policy: Policy = DEFAULT_POLICY,
        status_coalesce: timedelta = DEFAULT_COALESCE,
        workers: int = 2,
        resync_seconds: float = 300.0,
        watch_timeout: int = 60,
        identity: str = "flexinfer-controller",
        render_settings: RenderSettings | None = None,
        finetune_image: str = "",
        cache_timeouts: CacheTimeouts | None = None,
        shared_card: bool = False,
        events_in_background: bool = False,
    ) -> None:
        self.api = api
        self.metrics = metrics
        self.namespaces: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self.clock: Clock = clock or SystemClock()
        self.cache = ClusterCache()
        self.queue: WorkQueue[WorkKey] = WorkQueue()
        # `python -m flexinfer_k8s` sends Events from a thread of their own (a swap's
        # decision is then two API calls, not three); in-process tests keep them in
        # order with the writes they follow.
        self.writer = Writer(
            api, self.cache.stores, identity=identity, events_in_background=events_in_background
        )
        wiring = Wiring(
            cache=self.cache, writer=self.writer, api=api, metrics=metrics, clock=self.clock
        )
        settings = render_settings or RenderSettings()
        if finetune_image:
            settings = attrs.evolve(settings, finetune_image=finetune_image)
        # The cluster has a DRA driver for its GPUs (`--gpu-device-class`, or `shared_card`
        # for a test): a shared group with a VRAM budget may pack, its members' pods
        # sharing the group's ResourceClaim; without, it runs one member at a time and
        # says so (docs/election.md 1.7).
        self.device_class = settings.gpu_device_class
        self.shared = SharedGroupReconciler(
            wiring,
            policy=policy,
            coalesce=status_coalesce,
            shared_card=shared_card or bool(self.device_class),
            device_class=self.device_class,
        )
        self.gpugroups = GpuGroupReconciler(wiring, device_class=self.device_class)
        self.caches = CacheReconciler(
            wiring, settings=settings, finetune_image=finetune_image, timeouts=cache_timeouts
        )
        self.standalone = StandaloneReconciler(wiring)
        self.workloads = WorkloadReconciler(wiring, settings=settings)
        self.writer.before_replicas_override = self.workloads.answer_foreign_scale
        self._workers = workers
        self._resync_seconds = resync_seconds
        self._failures: dict[WorkKey, int] = {}
        self._failing_with: dict[WorkKey, str] = {}
        self._conflicts: dict[WorkKey, int] = {}
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()
        self._started = threading.Event()
        for namespace in self.namespaces:
            for resource in WATCHED:
                self.cache.informers.append(
                    Informer(
                        api,
                        resource,
                        self.cache.store(resource),
                        namespace=namespace,
                        on_change=self._handler(resource),
                        on_health=self._health_changed,
                        label_selector=INFORMER_SELECTORS.get(resource),
                        watch_timeout=watch_timeout,
                    )
                )

    # -- lifecycle --------------------------------------------------------------------

    def start(self, *, sync_timeout: float = 60.0) -> Controller:
        for informer in self.cache.informers:
            informer.start()
        # Decide only on a full view: every informer has listed, or failed to (a lease
        # source that cannot be read fails open; one that was never tried must not).
        if not wait_all(self.cache.informers, timeout=sync_timeout, attempted_only=True):
            log.warning("some informers have not listed yet; starting anyway")
        self.enqueue_all()
        for index in range(self._workers):
            self._spawn(self._work, f"worker-{index}")
        self._spawn(self._timers, "timers")
        if self._resync_seconds > 0:
            self._spawn(self._resync, "resync")
        self._started.set()
        self.metrics.leading.set(1)
        log.info("controller started", extra={"fields": {"namespaces": self.namespace_names}})
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        self.queue.shutdown()
        for informer in self.cache.informers:
            informer.stop()
        for thread in self._threads:
            thread.join(timeout)
        self.writer.stop_events(timeout)
        self.metrics.leading.set(0)

    @property
    def namespace_names(self) -> list[str]:
        return [n or "*" for n in self.namespaces]

    def healthy(self) -> tuple[bool, str]:
        dead = [t.name for t in self._threads if not t.is_alive()]
        if dead and not self._stopped.is_set():
            return False, f"threads stopped: {', '.join(dead)}"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if not self._started.is_set():
            return False, "not started"
        unsynced = [i.name for i in self.cache.informers if not i.attempted.is_set()]
        if unsynced:
            return False, f"informers not listed yet: {', '.join(unsynced)}"
        return True, "ok"

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    # -- keys -------------------------------------------------------------------------

    def enqueue_all(self) -> None:
        for key in self.all_keys():
            self.queue.add(key)

    def all_keys(self) -> set[WorkKey]:
        keys: set[WorkKey] = set()
        for model in self.cache.objects(MODELS):
            keys |= self._model_keys(model)
        for group in self.cache.objects(GPU_GROUPS):
            keys.add(("gpugroup", namespace_of(group), name_of(group)))
        for cache in self.cache.objects(MODEL_CACHES):
            keys.add(("modelcache", namespace_of(cache), name_of(cache)))
        for md in self.cache.objects(MODEL_DEPLOYMENTS):
            keys |= self._model_deployment_keys(md)
            keys.add(("md-workload", namespace_of(md), name_of(md)))
        return keys

    def _model_keys(self, model: JSON) -> set[WorkKey]:
        namespace, name = namespace_of(model), name_of(model)
        group = model_state_group(model)
        keys: set[WorkKey] = {
            ("shared", namespace, group) if group else ("model", namespace, name),
            ("model-workload", namespace, name),
        }
        if group and self.device_class:
            # Every member renders the group's card from the whole group (is a budget
            # set; who owns the claim): one member's change may change theirs.
            keys |= {
                ("model-workload", namespace, name_of(member))
                for member in self.cache.shared_group_models(namespace, group)
            }
        return keys

    def _model_deployment_keys(self, md: JSON) -> set[WorkKey]:
        """The keys whose decision reads a ModelDeployment, by its membership as this
        object states it (so that setting or clearing `gpuGroupRef` queues the keys
        either way): every GPUGroup that lists it, and its own key when no single
        group governs it (standalone, or held at zero by a membership conflict). The
        reconcilers check the cache again."""
        namespace, name = namespace_of(md), name_of(md)
        membership = self.cache.membership(md)
        keys: set[WorkKey] = {("gpugroup", namespace, group) for group in membership.listed_by}
        if membership.kind is not MembershipKind.MEMBER:
            keys.add(("modeldeployment", namespace, name))
        return keys

    def _workload_keys(self, namespace: str, name: str) -> set[WorkKey]:
        """Keys whose decision reads the Deployment/Service/pods named `name`."""
        keys: set[WorkKey] = set()
        if self.cache.get(MODEL_DEPLOYMENTS, namespace, name) is not None:
            keys.add(("md-workload", namespace, name))
        model = self.cache.get(MODELS, namespace, name)
        if model is not None:
            keys |= self._model_keys(model)
        for group in self.cache.gpu_groups_with_member(namespace, name):
            keys.add(("gpugroup", namespace, group))
        md = self.cache.get(MODEL_DEPLOYMENTS, namespace, name)
        if md is not None:
            keys |= self._model_deployment_keys(md)
        return keys

    def keys_for(self, resource: Resource, obj: JSON) -> set[WorkKey]:
        namespace, name = namespace_of(obj), name_of(obj)
        keys: set[WorkKey]
        if resource is MODELS:
            return self._model_keys(obj)
        if resource in (DEPLOYMENTS, SERVICES, NETWORK_POLICIES):
            return self._workload_keys(namespace, name)
        if resource is PODS:
            keys = set()
            for deployment in self.cache.deployments_selecting(obj):
                keys |= self._workload_keys(namespace, name_of(deployment))
            # By its group label too: a deleted member's pods still hold the card, and
            # their going is what lets the next holder in.
            labels = (obj.get("metadata") or {}).get("labels") or {}
            group = str(labels.get(GROUP_LABEL) or "")
            if group and labels.get(KIND_LABEL) == MODELS.kind:
                keys.add(("shared", namespace, group))
            elif group and labels.get(KIND_LABEL) == MODEL_DEPLOYMENTS.kind:
                keys.add(("gpugroup", namespace, group))
            # A ModelCache's Job pods (download, finetune, cleanup): what the scheduler
            # and the scripts say is read from them.
            cache = str(labels.get(CACHE_LABEL) or "")
            if cache and labels.get("job-name"):
                keys.add(("modelcache", namespace, cache))
            # A pod changes no rendering: only the decisions that read pods.
            return {k for k in keys if not k[0].endswith("-workload")}
        if resource is GPU_LEASES:
            keys = set()
            lease = gpu_lease_from_k8s(obj)
            if lease is not None:
                keys.add(("shared", namespace, lease.group))
            for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
                if ref.get("kind") == MODEL_CACHES.kind:
                    keys.add(("modelcache", namespace, str(ref.get("name"))))
            return keys
        if resource is CONFIG_MAPS:
            lease = gpu_lease_from_config_map(obj)
            return {("shared", namespace, lease.group)} if lease is not None else set()
        if resource is GPU_GROUPS:
            # A ModelDeployment that leaves or joins the group changes hands, and so
            # may every other group that lists it (a conflict starts or ends); one whose
            # gpuGroupRef names the group is told whether it now exists.
            keys = {("gpugroup", namespace, name)}
            listed = gpu_group_member_names(obj)
            for md in self.cache.objects(MODEL_DEPLOYMENTS, namespace):
                if name_of(md) in listed or gpu_group_ref(md) == name:
                    keys |= self._model_deployment_keys(md)
                    keys.add(("md-workload", namespace, name_of(md)))  # its group label
            return keys
        if resource is MODEL_DEPLOYMENTS:
            return self._model_deployment_keys(obj) | {("md-workload", namespace, name)}
        if resource is MODEL_CACHES:
            keys = {("modelcache", namespace, name)}
            for model in self.cache.objects(MODELS, namespace):
                if self.cache.model_cache_name(model) == name:
                    keys |= self._model_keys(model)
            # A ModelDeployment that names it by reference or by its modelPath (a cache
            # that appears, goes or changes its modelPath changes which one it serves).
            path = str((obj.get("spec") or {}).get("modelPath") or "").strip("/") or name
            for md in self.cache.objects(MODEL_DEPLOYMENTS, namespace):
                spec = md.get("spec") or {}
                if str(spec.get("modelCacheRef") or "") == name or (
                    not spec.get("modelCacheRef") and str(spec.get("model") or "") == path
                ):
                    keys |= self._model_deployment_keys(md)
                    keys.add(("md-workload", namespace, name_of(md)))
            return keys
        if resource in (JOBS, PERSISTENT_VOLUME_CLAIMS):
            keys = set()
            for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
                owner = str(ref.get("name"))
                if ref.get("kind") == MODEL_CACHES.kind:
                    keys.add(("modelcache", namespace, owner))
                elif ref.get("kind") == MODELS.kind:  # a backend-cache claim
                    keys.add(("model-workload", namespace, owner))
                elif ref.get("kind") == MODEL_DEPLOYMENTS.kind:
                    keys.add(("md-workload", namespace, owner))
            # The cleanup Job is not owned (it runs while its cache goes): by its label.
            cache = str(((obj.get("metadata") or {}).get("labels") or {}).get(CACHE_LABEL) or "")
            if resource is JOBS and cache:
                keys.add(("modelcache", namespace, cache))
            return keys
        return set()

    def _handler(self, resource: Resource) -> Any:
        def on_change(old: JSON | None, new: JSON | None) -> None:
            if (
                resource is DEPLOYMENTS
                and old is not None
                and new is not None
                and not deployment_inputs_changed(old, new)
            ):
                return
            keys: set[WorkKey] = set()
            for obj in (old, new):
                if obj is not None:
                    keys |= self.keys_for(resource, obj)
            if (
                resource in (MODELS, MODEL_DEPLOYMENTS, DEPLOYMENTS, SERVICES, NETWORK_POLICIES)
                and old is not None
                and new is not None
                and not workload_inputs_changed(old, new)
            ):
                keys = {k for k in keys if not k[0].endswith("-workload")}
            for key in keys:
                self.queue.add(key)

        return on_change

    def _health_changed(self, informer: Informer) -> None:
        if informer.resource in (GPU_LEASES, CONFIG_MAPS):
            log.log(
                logging.INFO if informer.healthy else logging.WARNING,
                "lease source health changed",
                extra={
                    "fields": {
                        "informer": informer.name,
                        "healthy": informer.healthy,
                        "error": informer.last_error,
                    }
                },
            )
            for model in self.cache.objects(MODELS, informer.namespace):
                for key in self._model_keys(model):
                    self.queue.add(key)

    # -- loops ------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stopped.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            try:
                self.process(key)
            finally:
                self.queue.done(key)

    def process(self, key: WorkKey) -> Outcome | None:
        """Reconcile one key now (workers call this; tests may too)."""
        kind, namespace, name = key
        queued_at = self.queue.queued_since(key)
        began = time.monotonic()
        outcome: Outcome | None = None
        insist = self._conflicts.get(key, 0) >= MAX_IMMEDIATE_RETRIES
        try:
            outcome = self._reconcile(kind, namespace, name, insist=insist)
        except RetryNow as retry:
            conflicts = self._conflicts.get(key, 0) + 1
            self._conflicts[key] = conflicts
            if conflicts <= MAX_IMMEDIATE_RETRIES:
                self.metrics.reconcile_errors.labels(kind=kind, error="Conflict").inc()
                log.debug(
                    "conflict; reconciling again",
                    extra={"fields": {"key": list(key), "why": str(retry)}},
                )
                self.queue.add(key)
            else:
                self._failed(key, retry)
            return None
        except (KubeError, FlexinferError) as error:
            self._failed(key, error)
            return None
        except Exception as error:
            self._failed(key, error, unexpected=True)
            return None
        finally:
            self.metrics.reconcile_seconds.labels(kind=kind).observe(time.monotonic() - began)
        self._conflicts.pop(key, None)
        if self._failures.pop(key, None) is not None:
            log.info(
                "reconcile recovered",
                extra={"fields": {"key": list(key), "after": self._failing_with.pop(key, "")}},
            )
        ended = time.monotonic()
        if outcome.wrote and queued_at is not None:
            self.metrics.decision_applied_seconds.labels(kind=kind).observe(ended - queued_at)
        if log.isEnabledFor(logging.DEBUG):
            # Where a slow decision's time went: waiting in the queue (since the first
            # change it covers was seen), or reconciling (API calls included).
            log.debug(
                "reconciled",
                extra={
                    "fields": {
                        "key": list(key),
                        "waited_ms": round((began - (queued_at or began)) * 1000, 1),
                        "took_ms": round((ended - began) * 1000, 1),
                        "wrote": outcome.wrote,
                    }
                },
            )
        when = outcome.next_change_at
        self.queue.arm(key, None if when is None else when + TIMER_SLACK)
        return outcome

    def _reconcile(self, kind: str, namespace: str, name: str, *, insist: bool) -> Outcome:
        if kind == "shared":
            return self.shared.reconcile_group(namespace, name, insist=insist)
        if kind == "model":
            return self.shared.reconcile_standalone(namespace, name, insist=insist)
        if kind == "gpugroup":
            return self.gpugroups.reconcile(namespace, name, insist=insist)
        if kind == "modelcache":
            return self.caches.reconcile(namespace, name)
        if kind == "modeldeployment":
            return self.standalone.reconcile(namespace, name)
        if kind == "model-workload":
            return self.workloads.reconcile_model(namespace, name)
        if kind == "md-workload":
            return self.workloads.reconcile_model_deployment(namespace, name)
        raise ValueError(f"unknown key kind {kind!r}")

    def _failed(self, key: WorkKey, error: Exception, *, unexpected: bool = False) -> None:
        """Back the key off; log only when its error changes (a stored value that no
        decision can use fails the same way at every retry)."""
        count = self._failures.get(key, 0) + 1
        self._failures[key] = count
        delay = backoff_delay(count, jitter=random.uniform(-BACKOFF_JITTER, BACKOFF_JITTER))
        label = "Conflict" if isinstance(error, RetryNow) else type(error).__name__
        self.metrics.reconcile_errors.labels(kind=key[0], error=label).inc()
        why = f"{type(error).__name__}: {error}"
        fields = {"key": list(key), "error": str(error), "retry_in": round(delay, 3)}
        if self._failing_with.get(key) != why:
            self._failing_with[key] = why
            log.warning(
                "reconcile crashed; retrying" if unexpected else "reconcile failed; retrying",
                exc_info=error if unexpected else None,
                extra={"fields": fields},
            )
        else:
            log.debug("reconcile failed again; retrying", extra={"fields": fields})
        self.queue.arm(key, self.clock.now() + timedelta(seconds=delay))

    def _timers(self) -> None:
        while not self._stopped.is_set():
            now = self.clock.now()
            upcoming = self.queue.fire_due(now)
            wait = 1.0 if upcoming is None else (upcoming - now).total_seconds()
            self.queue.wait_for_timers(min(max(wait, 0.001), 1.0))

    def _resync(self) -> None:
        while not self._stopped.wait(self._resync_seconds):
            self.enqueue_all()

    # -- test helpers -----------------------------------------------------------------

    def wait_idle(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.queue.is_idle():
                return True
            time.sleep(0.02)
        return False
