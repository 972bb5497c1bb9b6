"""Helpers for the controller's real-cluster tests.

The controller runs in-process (a `Controller` on its own ApiClient) or as
`python -m flexinfer_k8s` subprocesses; the test plays the user and the proxy
through an admin `KubeApi`. The controller renders every Model's Deployment and
Service; `on_kwok` gives a spec the pod annotations and node selector that put its
pods on a kwok node with a simulated load time (`amd.com/gpu: 1` comes from the
Model's `gpu.count`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from flexinfer_core import Policy
from flexinfer_core.timestamps import format_rfc3339
from flexinfer_devcluster.localcluster import (
    KWOK_NODE_LABEL,
    KWOK_NODE_LABEL_VALUE,
    READY_DELAY_ANNOTATION,
    TERMINATE_DELAY_ANNOTATION,
    KwokNode,
    LocalCluster,
)
from flexinfer_devcluster.policy import dev_policy, dev_policy_yaml
from flexinfer_k8s.cache import INFORMER_SELECTORS
from flexinfer_k8s.controller import Controller
from flexinfer_k8s.metrics import ControllerMetrics, HttpEndpoints
from flexinfer_k8s.pods import pod_is_finished, pod_is_ready
from flexinfer_k8s.reconcile_cache import CacheTimeouts
from flexinfer_k8s.reconcile_shared import DEFAULT_COALESCE
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_kube.clock import SystemClock
from flexinfer_kube.kubeapi import JSON, KubeApi, KubeError, NotFound, Transient, new_api_client
from flexinfer_kube.recorded_status import card_holders
from flexinfer_kube.resources import (
    DEPLOYMENTS,
    EVENTS,
    MODEL_CACHES,
    MODELS,
    NODES,
    PODS,
)
from tests.k8s.kubectl import (
    Kubectl,
    create_namespace,
    delete_namespace,
    install_crds,
    kubectl_for,
)
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
TEST_POLICY = Policy(
    demand_window=timedelta(seconds=4),
    recent_window=timedelta(seconds=6),
    default_swap_cooldown=timedelta(seconds=3),
)


MODEL_LABEL = "ai.flexinfer/model"


def on_kwok(*, ready_delay: str = "1s", terminate_delay: str = "1s") -> JSON:
    """Spec fields that run a Model's or ModelDeployment's pods on a kwok node, Ready
    after `ready_delay` (the simulated load) and gone `terminate_delay` after deletion.
    A kwok pod downloads nothing, so it gets no backend-cache claim (the tests of that
    claim say so themselves): a claim per test Model would take the local cluster's
    static volumes."""
    return {
        "backendCache": {"enabled": False},
        "nodeSelector": {KWOK_NODE_LABEL: KWOK_NODE_LABEL_VALUE},
        "podAnnotations": {
            READY_DELAY_ANNOTATION: ready_delay,
            TERMINATE_DELAY_ANNOTATION: terminate_delay,
        },
    }


def foreign_claim(name: str, device_class: str) -> JSON:
    """A ResourceClaim of `name` that someone other than flexinfer made (no flexinfer
    labels, no owner): one device of `device_class`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": {"team": "ml"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": device_class,
            "allocationMode": "ExactCount", "count": 1}}]}},
    }  # fmt: skip


def now_text() -> str:
    return str(format_rfc3339(datetime.now(UTC)))


# --- objects -------------------------------------------------------------------------


def model_body(
    name: str,
    *,
    group: str = "g",
    priority: int = 100,
    swap_cooldown: str = "2s",
    idle_timeout: str = "5m",
    min_replicas: int = 0,
    service_labels: tuple[str, ...] = (),
    ready_delay: str = "1s",
    terminate_delay: str = "1s",
    default: bool = False,
    drain_timeout: str | None = None,
    vram: tuple[str, str] | None = None,
) -> JSON:
    gpu: JSON = {"shared": group, "priority": priority, "swapCooldown": swap_cooldown}
    if default:
        gpu["default"] = True
    if vram is not None:  # (spec.gpu.vramBudget, spec.gpu.vramEstimate)
        gpu["vramBudget"], gpu["vramEstimate"] = vram
    if drain_timeout is not None:
        gpu["drainTimeout"] = drain_timeout
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name},
        "spec": {
            "backend": "vllm",
            "source": f"HF://test/{name}",
            "gpu": gpu,
            "serverless": {
                "idleTimeout": idle_timeout,
                "minReplicas": min_replicas,
                "coldStartTimeout": "10s",
            },
            "serviceLabels": list(service_labels or (f"{name}-svc",)),
            **on_kwok(ready_delay=ready_delay, terminate_delay=terminate_delay),
        },
    }


class Cluster:
    """The test's hands on the cluster: an admin `KubeApi` scoped to one namespace."""

    def __init__(self, local: LocalCluster, namespace: str) -> None:
        self.local = local
        self.namespace = namespace
        self.api = KubeApi(new_api_client(str(local.kubeconfig)))

    def add_model(self, name: str, **spec: Any) -> None:
        """A Model whose pods kwok runs; the controller renders its Deployment and Service."""
        self.api.create(MODELS, self.namespace, model_body(name, **spec))

    def model(self, name: str) -> JSON:
        return self.api.get(MODELS, self.namespace, name)

    def status(self, name: str) -> JSON:
        return dict(self.model(name).get("status") or {})

    def demand(self, name: str, when: str | None = None) -> None:
        """What the proxy does for a request on a parked model."""
        self.api.patch(
            MODELS, self.namespace, name, {"status": {"lastActiveTime": when or now_text()}},
            subresource="status",
        )

    def in_flight(self, name: str, count: int) -> None:
        """What the proxy writes while it has `count` requests in flight to `name`'s
        server (docs/election.md 1.6)."""
        self.api.patch(
            MODELS, self.namespace, name,
            {"status": {"inFlight": {"count": count, "reportedAt": now_text()}}},
            subresource="status",
        )

    def replicas(self, name: str) -> int:
        """The replicas of the rendered Deployment (0 while it is not rendered yet)."""
        try:
            deployment = self.api.get(DEPLOYMENTS, self.namespace, name)
        except NotFound:
            return 0
        return int(deployment["spec"].get("replicas") or 0)

    def pods(self, app: str | None = None) -> list[JSON]:
        items = self.api.list(PODS, self.namespace).get("items") or []
        return [
            p for p in items
            if app is None or (p["metadata"].get("labels") or {}).get(MODEL_LABEL) == app
        ]

    def ready_pods(self, app: str) -> list[JSON]:
        return [p for p in self.pods(app) if pod_is_ready(p)
                and not p["metadata"].get("deletionTimestamp")]

    def holders(self) -> set[str]:
        """The Models the proxy sends their service labels to: those whose status says
        they hold the card, as the proxy reads it (one shared group per test)."""
        return set(card_holders(self.api.list(MODELS, self.namespace).get("items") or []))

    def events(self, name: str | None = None) -> list[JSON]:
        items = self.api.list(EVENTS, self.namespace).get("items") or []
        return [
            e for e in items
            if e.get("source", {}).get("component") == "flexinfer-controller"
            and (name is None or e["involvedObject"]["name"] == name)
        ]

    def wait_serving(self, name: str, *, timeout: float = 60.0) -> JSON:
        def serving() -> JSON | None:
            status = self.status(name)
            ok = (
                status.get("phase") == "Ready"
                and (status.get("sharedGroup") or {}).get("state") == "Active"
            )
            return status if ok else None

        return wait_until(serving, what=f"{name} to be Ready and Active", timeout=timeout)

    def wait_parked(self, name: str, *, timeout: float = 60.0) -> JSON:
        def parked() -> JSON | None:
            status = self.status(name)
            ok = (
                (status.get("sharedGroup") or {}).get("state") == "Queued"
                and self.replicas(name) == 0
                and not self.pods(name)
            )
            return status if ok else None

        return wait_until(parked, what=f"{name} to be Queued with no pods", timeout=timeout)


# --- the controller ----------------------------------------------------------------------


class RunningController:
    def __init__(self, controller: Controller, metrics: ControllerMetrics,
                 endpoints: HttpEndpoints) -> None:
        self.controller = controller
        self.metrics = metrics
        self.endpoints = endpoints

    def scrape(self, path: str = "/metrics") -> str:
        url = f"http://127.0.0.1:{self.endpoints.port}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())

    def writes(self) -> float:
        return self.metrics.writes()

    def settle(self, cluster: Cluster, *, timeout: float = 60.0) -> None:
        """Return once the controller has acted on the cluster as it is now: its cache
        holds every pod, Deployment and Model of the namespace at the API server's
        resourceVersion, and a full pass over every key, started after that, is done.
        A test that counts writes from here on counts only what it causes itself: a
        pod that became Ready a moment ago is no longer a status write on its way (the
        watch delivered it, and the pass wrote it)."""
        def versions(objects: list[JSON]) -> dict[str, str]:
            return {o["metadata"]["name"]: str(o["metadata"]["resourceVersion"]) for o in objects}

        def caught_up() -> bool:
            for resource in (PODS, DEPLOYMENTS, MODELS):
                # What the controller's informer lists, with the same selector.
                live = cluster.api.list(
                    resource, cluster.namespace, label_selector=INFORMER_SELECTORS.get(resource)
                )
                cached = self.controller.cache.objects(resource, cluster.namespace)
                if versions(live.get("items") or []) != versions(cached):
                    return False
            return True

        wait_until(caught_up, what="the controller's cache to catch up", timeout=timeout)
        # The pass covers a change whose watch event was stored but not yet queued when
        # the cache was compared (the informer stores, then queues).
        self.controller.enqueue_all()
        assert self.controller.wait_idle(timeout), "the controller never went idle"


@contextlib.contextmanager
def controller(
    local: LocalCluster,
    namespace: str,
    *,
    impersonate: str | None = None,
    policy: Policy = TEST_POLICY,
    cache_timeouts: CacheTimeouts | None = None,
    settings: RenderSettings | None = None,
    status_coalesce: timedelta = DEFAULT_COALESCE,
) -> Iterator[RunningController]:
    """An in-process controller; it renders under the local cluster's administrator
    policy (`flexinfer_devcluster.policy`) unless `settings` say otherwise."""
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    api = KubeApi(
        new_api_client(
            str(local.kubeconfig),
            impersonate=impersonate,
            # Its writes tell themselves apart in the audit log (`controller_writes`).
            user_agent=f"{CONTROLLER_AGENT}test-{namespace}",
        ),
        on_request=metrics.count_request,
    )
    ctl = Controller(
        api,
        metrics=metrics,
        namespaces=[namespace],
        clock=SystemClock(),
        policy=policy,
        resync_seconds=0,
        watch_timeout=30,
        identity=f"test-{namespace}",
        cache_timeouts=cache_timeouts,
        render_settings=settings or RenderSettings(policy=dev_policy()),
        status_coalesce=status_coalesce,
    )
    endpoints = HttpEndpoints(
        0, registry=registry, healthz=ctl.healthy, readyz=ctl.ready, host="127.0.0.1"
    ).start()
    ctl.start(sync_timeout=30)
    try:
        yield RunningController(ctl, metrics, endpoints)
    finally:
        ctl.stop()
        endpoints.stop()


CONTROLLER_AGENT = "flexinfer-controller/"
"""How every controller's User-Agent starts (`python -m flexinfer_k8s` and `controller`)."""


def controller_writes(
    local: LocalCluster, namespace: str, *, since: datetime | None = None
) -> list[tuple[str, str, str, int]]:
    """(when, identity, what, HTTP status) for every write a controller sent to the API
    server about `namespace`, oldest first, from the API server's audit log (lease
    renewals, which carry their own User-Agent, left out). `what` is `verb
    resource/name[/subresource]`; `since` drops the writes received before it."""
    writes = []
    for event in local.audit_events():
        agent = str(event.get("userAgent") or "")
        ref = event.get("objectRef") or {}
        if not agent.startswith(CONTROLLER_AGENT) or agent.endswith("/leader-election"):
            continue
        if ref.get("namespace") != namespace:
            continue
        received = str(event["requestReceivedTimestamp"])
        if since is not None and datetime.fromisoformat(received.replace("Z", "+00:00")) < since:
            continue
        what = f"{event.get('verb')} {ref.get('resource')}/{ref.get('name')}"
        if ref.get("subresource"):
            what += f"/{ref['subresource']}"
        identity = agent.removeprefix(CONTROLLER_AGENT)
        code = int((event.get("responseStatus") or {}).get("code") or 0)
        writes.append((received, identity, what, code))
    return sorted(writes)


class ControllerProcess:
    """`python -m flexinfer_k8s` as a child process (killable for real)."""

    def __init__(self, local: LocalCluster, namespace: str, *, log: Path,
                 extra: tuple[str, ...] = (), kubeconfig: Path | None = None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT)
        self.log_path = log
        policy = log.with_name(f"{log.name}.policy.yaml")
        policy.write_text(dev_policy_yaml())
        self._log = log.open("ab")
        self.popen = subprocess.Popen(
            [
                sys.executable, "-m", "flexinfer_k8s",
                "--kubeconfig", str(kubeconfig or local.kubeconfig),
                "--namespace", namespace,
                "--metrics-port", "0", "--health-port", "0",
                "--bind-address", "127.0.0.1",
                "--demand-window", "4s", "--recent-window", "6s",
                "--default-swap-cooldown", "3s",
                "--policy", str(policy),
                *extra,
            ],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
        )

    def log_lines(self) -> list[JSON]:
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    lines.append(entry)
        return lines

    def health_port(self) -> int:
        """The /healthz port it picked (from its "listening" log line)."""
        def port() -> int | None:
            for entry in self.log_lines():
                if entry.get("msg") == "listening":
                    return int(entry["ports"][-1])
            return None

        return wait_until(port, what=f"{self.log_path.name} to log its ports", timeout=30)

    def healthz(self) -> int:
        """The status code of GET /healthz (0 when nothing answers)."""
        url = f"http://127.0.0.1:{self.health_port()}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
        self._log.close()

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()


# --- the Pod watch that proves break-before-make ---------------------------------------------


class PodTimeline:
    """Watches the namespace's workload pods and records any moment two members had pods.

    One watch stream is ordered by the API server, so "a pod of A still existed when
    a pod of B was created" shows up as a B ADDED while A's pod is still in the set.

    A timeline that stopped watching proves nothing, so it cannot pass silently: a
    watch that ends in an error (an ERROR event, 410 Gone, repeated failures) is
    recorded in `failure`, and `stop()` first waits until the pods it believes alive
    are exactly those a fresh list returns (it kept up to the end), then fails the
    test if the watch broke.
    """

    MAX_FAILURES = 50

    def __init__(self, cluster: Cluster, *, exclusive: set[str] | None = None) -> None:
        self.cluster = cluster
        self.exclusive = exclusive
        self.live: dict[str, str] = {}  # pod name -> app
        self.violations: list[str] = []
        self.created: list[tuple[str, str]] = []  # (app, pod) in order of creation
        self.deleted: list[tuple[str, str]] = []
        self.failure: str | None = None
        self.events = 0
        self._stop = threading.Event()
        self._response: Any = None
        self._lock = threading.Lock()
        listing = cluster.api.list(PODS, cluster.namespace)
        for pod in listing.get("items") or []:
            self._add(pod)
        self._version = str(listing["metadata"]["resourceVersion"])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _app(self, pod: JSON) -> str | None:
        labels = pod["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") != "flexinfer":
            return None
        app = labels.get(MODEL_LABEL)
        if self.exclusive is not None and app not in self.exclusive:
            return None
        return str(app) if app else None

    def _add(self, pod: JSON) -> None:
        app = self._app(pod)
        if app is None or pod_is_finished(pod):
            return
        name = pod["metadata"]["name"]
        if name not in self.live:
            others = sorted({a for a in self.live.values() if a != app})
            if others:
                self.violations.append(f"pod {name} of {app} created while {others} had pods")
            self.created.append((app, name))
        self.live[name] = app

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                for event in self.cluster.api.watch(
                    PODS, self.cluster.namespace, resource_version=self._version,
                    timeout_seconds=30, on_open=self._opened,
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        # 410 Gone included: re-listing would skip the events in between,
                        # and one of them may be the overlap this timeline is for.
                        self.failure = f"watch error {obj.get('code')}: {obj.get('message')}"
                        return
                    self._version = obj["metadata"].get("resourceVersion", self._version)
                    with self._lock:
                        self.events += 1
                        if event["type"] == "ADDED":
                            self._add(obj)
                        elif event["type"] == "DELETED" or pod_is_finished(obj):
                            # A Succeeded or Failed pod runs nothing and holds no device
                            # (the kubelet frees a terminated pod's): gone for the GPU,
                            # as the controller counts it, though its object may linger.
                            app = self.live.pop(obj["metadata"]["name"], None)
                            if app is not None:
                                self.deleted.append((app, obj["metadata"]["name"]))
            except Transient as error:
                # Resuming from the last resourceVersion loses nothing; a stream that
                # keeps failing is a broken timeline, not a quiet one.
                failures += 1
                if self._stop.is_set():
                    return
                if failures > self.MAX_FAILURES:
                    self.failure = f"{failures} watch failures, the last: {error}"
                    return
                self._stop.wait(0.2)
            except Exception as error:
                if not self._stop.is_set():
                    self.failure = f"watch thread died: {type(error).__name__}: {error}"
                return

    def _opened(self, response: Any) -> None:
        self._response = response

    def _caught_up(self) -> bool:
        pods = self.cluster.api.list(PODS, self.cluster.namespace).get("items") or []
        current = {
            p["metadata"]["name"]
            for p in pods
            if self._app(p) is not None and not pod_is_finished(p)
        }
        with self._lock:
            return current == set(self.live) or self.failure is not None

    def stop(self, *, check: bool = True) -> None:
        """Stop watching; with `check`, fail unless the watch kept up to the end."""
        caught_up = False
        if check and self.failure is None and self._thread.is_alive():
            with contextlib.suppress(AssertionError):
                caught_up = wait_until(self._caught_up, what="catching up", timeout=30)
        alive = self._thread.is_alive()
        self._stop.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.shutdown()
        self._thread.join(5)
        if not check:
            return
        assert self.failure is None, f"the pod timeline is broken: {self.failure}"
        assert alive, "the pod watch thread ended before stop()"
        assert caught_up, f"the pod watch fell behind: it believes {sorted(self.live)} are alive"

    def created_apps(self) -> list[str]:
        with self._lock:
            return [app for app, _ in self.created]


class MemoryTimeline(PodTimeline):
    """A `PodTimeline` for a packed group (docs/election.md 1.7, "Break-before-make by
    memory"): at every pod created it sums the footprints of the members with live pods
    (terminating ones included; a member missing from `footprints` takes the whole
    card) and records a violation when the sum exceeds `budget`. The sum only grows
    when a pod is created, so checking there checks every moment of the watch."""

    def __init__(self, cluster: Cluster, *, footprints: dict[str, int], budget: int) -> None:
        self.footprints = dict(footprints)
        self.budget = budget
        self.peak = 0
        super().__init__(cluster)

    def _add(self, pod: JSON) -> None:
        app = self._app(pod)
        if app is None or pod_is_finished(pod):
            return
        name = pod["metadata"]["name"]
        if name not in self.live:
            self.live[name] = app
            members = sorted(set(self.live.values()))
            held = sum(self.footprints.get(member, self.budget + 1) for member in members)
            self.peak = max(self.peak, held)
            if held > self.budget:
                self.violations.append(
                    f"pod {name} of {app} created while {members} had pods: "
                    f"{held} of {self.budget} in use"
                )
            self.created.append((app, name))
        self.live[name] = app


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """One sample from Prometheus text exposition."""
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if "{" in head:
            metric, _, rest = head.partition("{")
            pairs = dict(
                part.split("=", 1) for part in rest.rstrip("}").split(",") if "=" in part
            )
            found = {k: json.loads(v) for k, v in pairs.items()}
        else:
            metric, found = head, {}
        if metric == name and all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


def drains_observed(text: str, namespace: str, model: str) -> dict[str, tuple[float, float]]:
    """`flexinfer_drain_seconds` of one model by outcome: (count, sum of seconds)."""
    out = {}
    for outcome in ("drained", "deadline"):
        labels = {"namespace": namespace, "model": model, "outcome": outcome}
        count = metric_value(text, "flexinfer_drain_seconds_count", **labels)
        seconds = metric_value(text, "flexinfer_drain_seconds_sum", **labels)
        if count is not None:
            out[outcome] = (count, seconds or 0.0)
    return out


# --- fixtures (imported by the controller test modules) ---------------------------------------


@pytest.fixture(scope="module")
def kubectl(local_cluster: LocalCluster) -> Kubectl:
    return kubectl_for(local_cluster)


@pytest.fixture(scope="module")
def crds(local_cluster: LocalCluster) -> None:
    install_crds(local_cluster)


@pytest.fixture
def cluster(local_cluster: LocalCluster, kubectl: Kubectl, crds: None) -> Iterator[Cluster]:
    namespace = create_namespace(kubectl, "ctl")
    try:
        yield Cluster(local_cluster, namespace)
    finally:
        release_finalizers(local_cluster, namespace)
        delete_namespace(kubectl, namespace)


@contextlib.contextmanager
def kwok_nodes(local: LocalCluster, nodes: tuple[KwokNode, ...]) -> Iterator[None]:
    """kwok nodes exactly as `nodes` says for the duration, removed afterwards.

    The local cluster lives for the whole session: a node of the same name left by an
    earlier module (other capacity, other labels) is replaced, not reused, or a test
    would depend on which modules ran before it (one GPU where it needs four leaves its
    last pod Pending on a full node)."""
    api = KubeApi(new_api_client(str(local.kubeconfig)))
    for node in nodes:
        with contextlib.suppress(NotFound):
            api.delete(NODES, "", node.name)
            _wait_node_gone(api, node.name)
        local.add_node(node)
    try:
        yield
    finally:
        for node in nodes:
            with contextlib.suppress(NotFound):
                api.delete(NODES, "", node.name)


def _wait_node_gone(api: KubeApi, name: str) -> None:
    def gone() -> bool:
        try:
            api.get(NODES, "", name)
        except NotFound:
            return True
        return False

    wait_until(gone, what=f"the earlier node {name} gone", timeout=60)


def release_finalizers(local: LocalCluster, namespace: str) -> None:
    """Drop the node-cleanup finalizer of the namespace's ModelCaches: the test's
    controller is gone, so nothing would release them and the namespace would stay
    Terminating for the rest of the session."""
    api = KubeApi(new_api_client(str(local.kubeconfig)))
    try:
        caches = api.list(MODEL_CACHES, namespace).get("items") or []
    except KubeError:
        return
    for cache in caches:
        if cache["metadata"].get("finalizers"):
            with contextlib.suppress(KubeError):
                api.patch(MODEL_CACHES, namespace, cache["metadata"]["name"],
                          {"metadata": {"finalizers": None}})
