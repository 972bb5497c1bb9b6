"""A real Kubernetes control plane on loopback, for tests, benchmarks and the demo.

`LocalCluster` runs etcd, kube-apiserver (RBAC on), kube-controller-manager, kube-scheduler
and kwok from `assets.ensure_assets()` in a private temporary directory on free ports,
with freshly generated certificates. kwok plays the kubelet for its nodes: a pod bound to
one starts at once and becomes Ready after the delay in its `flexinfer.test/ready-delay`
annotation (the simulated model load time); a deleted pod disappears after
`flexinfer.test/terminate-delay`; a Job's pod succeeds after
`flexinfer.test/complete-delay`.

It looks like the homelab clusters flexinfer runs on (k3s, kind): the GPU nodes advertise
`amd.com/gpu` and are tainted `dedicated=gpu:NoSchedule` (`GPU_NODE_TAINT`), one untainted
CPU node takes everything else, and the only StorageClass is the default `local-path`
(ReadWriteOnce, WaitForFirstConsumer) whose static hostPath volumes the binder hands to
claims. `populate_claim` pre-binds a volume holding given files to a claim, as a user's
existing storage would be. A fake DRA driver (`gpudriver`) publishes AMD's DeviceClass
and a ResourceSlice per GPU node, so the scheduler allocates ResourceClaims for real.

Opt-in (`process_node=True` or `add_process_node()`): one process-backed node whose pods
run as real local `llama-server` and `ollama` processes (`processnode`), with the hosts
file that maps Service names to their loopback addresses at `hosts_file`.

Each process runs in its own process group with its log in the directory; `stop()` (also
run at interpreter exit) ends the groups and removes the directory. This module owns
process lifecycle only; it makes no flexinfer decisions.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import attrs
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from flexinfer_devcluster import gpudriver, localpki
from flexinfer_devcluster.assets import (
    AssetsError,
    ensure_assets,
    ensure_llama_server,
    ensure_ollama,
)
from flexinfer_devcluster.processes import die_with_thread_hook, terminate_group
from flexinfer_devcluster.processnode import ProcessNode
from flexinfer_kube.kubeapi import KubeApi

READY_DELAY_ANNOTATION = "flexinfer.test/ready-delay"
"""Pod annotation: Go duration ("3s") from container start to Ready. Default 0s."""
TERMINATE_DELAY_ANNOTATION = "flexinfer.test/terminate-delay"
"""Pod annotation: Go duration from deletion request to the pod being gone. Default 1s."""
COMPLETE_DELAY_ANNOTATION = "flexinfer.test/complete-delay"
"""Pod annotation (Job pods): Go duration from Ready to Succeeded. Default 1s."""
FAIL_ANNOTATION = "flexinfer.test/fail"
"""Pod annotation (Job pods): fail instead of succeeding, with this termination message."""

GPU_RESOURCE = "amd.com/gpu"
GPU_NODE_TAINT: Mapping[str, str] = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
"""How homelab GPU nodes are tainted (`kubectl taint nodes gpu-1 dedicated=gpu:NoSchedule`),
and so every GPU node here: a pod must tolerate it to land on one."""
GPU_NODE_TOLERATION: Mapping[str, str] = {"operator": "Equal", **GPU_NODE_TAINT}
"""The toleration of `GPU_NODE_TAINT` (what flexinfer renders for pods that need a GPU node)."""
STORAGE_CLASS = "local-path"
"""The only StorageClass, and the default one, as on k3s and kind."""
STORAGE_PROVISIONER = "rancher.io/local-path"
"""Named like k3s's; nothing runs it here, so a claim no static volume fits stays Pending
"waiting for a volume to be created" as on a cluster whose provisioner cannot serve it."""
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
KWOK_NODE_LABEL = "type"
KWOK_NODE_LABEL_VALUE = "kwok"

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/16"
"""Room for a Service per Model at benchmark scale (1,000 Models need more than a /24)."""
STATIC_VOLUMES = 32
"""Static hostPath PersistentVolumes (ReadWriteOnce, class `local-path`) the binder hands
to claims (ModelCache SharedPVC)."""
CONTROLLER_NAMESPACE = "flexinfer-system"
CONTROLLER_NAMESPACE_MANIFEST: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Namespace",
    "metadata": {
        "name": CONTROLLER_NAMESPACE,
        "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
    },
}
STATIC_VOLUME_LABEL = "flexinfer.dev/static"
POPULATED_VOLUME_LABEL = "flexinfer.dev/populated"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "pod-garbage-collector-controller",
    "ttl-after-finished-controller",
    "persistentvolume-binder-controller",
    # Releases a ResourceClaim's reservation for a pod that is gone, and its device
    # once no pod uses it (the scheduler only allocates and reserves).
    "resourceclaim-controller",
)
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  # Who wrote what, and when: the admin user's writes (the controller, the proxy and the
  # tests all use the admin kubeconfig and tell themselves apart by their User-Agent).
  - level: Metadata
    users: ["flexinfer-admin"]
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
"""
LOG_TAIL_LINES = 30
PORT_ATTEMPTS = 3

_T = TypeVar("_T")


class LocalClusterError(RuntimeError):
    """The control plane failed to start or misbehaved; the message names the binary."""


def _default_taints(node: KwokNode) -> tuple[Mapping[str, str], ...]:
    return (GPU_NODE_TAINT,) if node.gpus > 0 else ()


@attrs.frozen
class KwokNode:
    """A simulated node; `gpus` becomes `amd.com/gpu` capacity and allocatable, and as
    many devices in the fake DRA driver's ResourceSlice for it (`gpudriver`).

    A GPU node is tainted `GPU_NODE_TAINT` unless `taints` says otherwise (`taints=()`
    for an untainted one); a node without GPUs is untainted.
    """

    name: str
    gpus: int = 1
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110
    labels: Mapping[str, str] = attrs.field(factory=dict)
    taints: tuple[Mapping[str, str], ...] = attrs.field(
        default=attrs.Factory(_default_taints, takes_self=True), converter=tuple
    )

    def manifest(self) -> dict[str, Any]:
        resources_ = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        if self.gpus > 0:
            resources_[GPU_RESOURCE] = str(self.gpus)
        manifest: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE},
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    KWOK_NODE_LABEL: KWOK_NODE_LABEL_VALUE,
                    **self.labels,
                },
            },
            "status": {"capacity": resources_, "allocatable": dict(resources_)},
        }
        if self.taints:
            manifest["spec"] = {"taints": [dict(taint) for taint in self.taints]}
        return manifest


def default_nodes(count: int = 2, *, gpus: int = 1, cpu_nodes: int = 1) -> tuple[KwokNode, ...]:
    """`count` tainted GPU nodes `kwok-gpu-N` and `cpu_nodes` untainted `kwok-cpu-N` (a
    homelab's server node: where pods that need no GPU, such as a shared claim's
    download, run)."""
    return tuple(KwokNode(name=f"kwok-gpu-{index}", gpus=gpus) for index in range(count)) + tuple(
        KwokNode(name=f"kwok-cpu-{index}", gpus=0) for index in range(cpu_nodes)
    )


@attrs.define
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


_live_clusters: set[LocalCluster] = set()
_live_lock = threading.Lock()


def _stop_live_clusters() -> None:
    with _live_lock:
        clusters = list(_live_clusters)
    for cluster in clusters:
        cluster.stop()


atexit.register(_stop_live_clusters)


class LocalCluster:
    """One loopback control plane. Use as a context manager or call `start()`/`stop()`.

    After `start()`: `kubeconfig` (admin, system:masters), `server`, `api_client`
    (a ready `kubernetes.client.ApiClient`), `workdir`, `pids()`.
    """

    def __init__(
        self,
        *,
        nodes: Sequence[KwokNode] | None = None,
        assets_dir: Path | None = None,
        startup_timeout: float = 90.0,
        name: str = "flexinfer-local",
        audit: bool = False,
        client_qps: int | None = None,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        process_node: bool = False,
        llama_server: Path | None = None,
        ollama: Path | None = None,
    ) -> None:
        self._nodes = tuple(default_nodes() if nodes is None else nodes)
        self._assets_dir = assets_dir
        self._want_process_node = process_node
        self._llama_server = llama_server
        self._ollama = ollama
        self._process_node: ProcessNode | None = None
        self._startup_timeout = startup_timeout
        self.name = name
        self.audit = audit
        """Record the admin user's writes in an audit log (`audit_events()`)."""
        self.client_qps = client_qps
        """Raise the controller manager's and scheduler's client QPS (burst twice that):
        their defaults (20/30) throttle a benchmark of hundreds of swaps, so the cluster,
        not flexinfer, would be measured."""
        self.extra_args = {name: tuple(args) for name, args in (extra_args or {}).items()}
        """More flags for a component, by binary name (`kube-controller-manager`: ...), after
        its own: a benchmark trying one of the cluster's settings."""
        self._workdir: Path | None = None
        self._processes: list[_Process] = []
        self._api_client: Any = None
        self._server: str | None = None
        self._ca: localpki.CertPair | None = None
        self._admin: localpki.CertPair | None = None
        self.started_seconds: float | None = None
        """Seconds `start()` took to a usable cluster (for the benchmark)."""

    # -- public surface -------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        return self._require(self._workdir, "workdir")

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return self._require(self._server, "server")

    @property
    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` authenticated as a cluster admin."""
        if self._api_client is None:
            self._api_client = self.new_api_client()
        return self._api_client

    def new_api_client(self) -> Any:
        """A fresh admin ApiClient (for a thread or a component under test)."""
        load: Any = k8s_config.new_client_from_config  # untyped in the client
        return load(config_file=str(self.kubeconfig), persist_config=False)

    def api_client_for_token(self, token: str) -> Any:
        """An ApiClient that authenticates with a bearer token (e.g. a ServiceAccount's)."""
        configuration = k8s_client.Configuration()
        configuration.host = self.server
        configuration.ssl_ca_cert = str(self._require(self._ca, "ca").cert)
        configuration.api_key = {"authorization": f"Bearer {token}"}
        return k8s_client.ApiClient(configuration)

    def pids(self) -> dict[str, int]:
        return {process.name: process.popen.pid for process in self._processes}

    def log_path(self, binary: str) -> Path:
        return self.workdir / f"{binary}.log"

    @property
    def hosts_file(self) -> Path:
        """`<ip> <service>.<namespace>.svc` per Service with a ready pod on the process node
        (empty without one); the proxy's `--resolve-file` reads it."""
        return self.workdir / "hosts"

    @property
    def process_node(self) -> ProcessNode:
        """The process-backed node (after `add_process_node()` or `process_node=True`)."""
        return self._require(self._process_node, "process node")

    def add_process_node(
        self, *, name: str = "process-node", gpus: int = 1, ollama: Path | None = None
    ) -> ProcessNode:
        """Register the node whose pods run as local `llama-server` and `ollama`
        processes, and run it.

        Pods reach it with `processnode.PROCESS_NODE_SELECTOR` as nodeSelector and
        `processnode.PROCESS_NODE_TOLERATION` (it is tainted so that nothing else lands
        there) and, as a GPU node, with the toleration of `GPU_NODE_TAINT` (flexinfer
        renders it). Builds llama-server first if the cache lacks it (minutes, once);
        `ollama` is the given binary, else the cached one if it is built (never built
        here: without it, Ollama pods are refused saying how to build it).
        """
        if self._process_node is not None:
            raise LocalClusterError(
                f"{self.name} already has process node {self._process_node.name}"
            )
        if self._llama_server is None:
            self._llama_server = ensure_llama_server()
        binary = ollama or self._ollama
        if binary is None:
            with contextlib.suppress(AssetsError):
                binary = ensure_ollama(build=False, log=False)
        node = ProcessNode(
            self.kubeconfig,
            self._llama_server,
            workdir=self.workdir / "process-node",
            hosts_file=self.hosts_file,
            ollama=binary,
            name=name,
            gpus=gpus,
            taints=(GPU_NODE_TAINT,),
        )
        node.start()
        self._process_node = node
        gpudriver.publish(self._kube_api(), name, gpus)
        return node

    def remove_process_node(self) -> None:
        """Stop every server the process node started and delete the node."""
        node, self._process_node = self._process_node, None
        if node is not None:
            with contextlib.suppress(Exception):
                gpudriver.withdraw(self._kube_api(), node.name)
            node.stop()

    def audit_events(self) -> list[dict[str, Any]]:
        """The API server's audit events so far (writes by the admin user), oldest first."""
        if not self.audit:
            raise LocalClusterError(f"{self.name} was started without audit=True")
        path = self.workdir / "audit.log"
        if not path.exists():
            return []
        events = []
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self._assets() / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def install_crds(self, crd_dir: Path, *, timeout: float = 60.0) -> list[str]:
        """Apply a kustomization of CRDs and return their names once all are Established.

        Polls the CRDs' conditions rather than `kubectl wait`, which fails outright
        ("accessor error") on a CRD whose status the API server has not written yet.
        """
        applied = self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-k", str(crd_dir), "-o", "name"
        ).stdout.split()
        names = [name.split("/", 1)[1] for name in applied if "/" in name]
        extensions: Any = k8s_client.ApiextensionsV1Api(self.api_client)

        def established() -> bool:
            for name in names:
                crd = extensions.read_custom_resource_definition(name)
                conditions = (crd.status.conditions if crd.status else None) or []
                if not any(c.type == "Established" and c.status == "True" for c in conditions):
                    return False
            return True

        self._wait(
            established,
            timeout=timeout,
            what=f"CRDs {', '.join(names)} to be Established",
            blame=("kube-apiserver",),
        )
        return names

    def add_node(self, node: KwokNode, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Register a kwok node and publish its GPUs' devices; with `wait`, return once
        kwok has marked it Ready."""
        core: Any = k8s_client.CoreV1Api(self.api_client)
        core.create_node(node.manifest())
        gpudriver.publish(self._kube_api(), node.name, node.gpus)
        if wait:
            self._wait(
                lambda: _node_is_ready(core, node.name),
                timeout=timeout,
                what=f"kwok to mark node {node.name} Ready",
                blame=("kwok",),
            )

    def rss_bytes(self) -> int:
        """Resident memory of the control plane: the sum over its live processes."""
        return sum(self.rss_by_process().values())

    def rss_by_process(self) -> dict[str, int]:
        """Resident bytes per binary (each process group summed, from /proc)."""
        return {process.name: _rss_of_group(process.popen.pid) for process in self._processes}

    # -- lifecycle ------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        if self._workdir is not None:
            raise LocalClusterError(f"{self.name} is already started at {self._workdir}")
        began = time.monotonic()
        assets = self._assets()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_once(assets)
            except LocalClusterError as error:
                # A free port is only free until someone binds it; another cluster
                # starting at the same moment may win the race. Fresh ports fix that.
                if attempt == PORT_ATTEMPTS or "address already in use" not in str(error):
                    raise
                continue
            break
        self.started_seconds = time.monotonic() - began
        return self

    def _start_once(self, assets: Path) -> None:
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        with _live_lock:
            _live_clusters.add(self)
        try:
            self._start_processes(assets)
            core: Any = k8s_client.CoreV1Api(self.api_client)
            gpudriver.install(self._kube_api())
            for node in self._nodes:
                core.create_node(node.manifest())
                gpudriver.publish(self._kube_api(), node.name, node.gpus)
            # The controller's namespace, as docs/security.md asks of an administrator:
            # the only one where flexinfer's pods mount host paths (the Jobs that make
            # node cache directories), so Pod Security "privileged".
            core.create_namespace(CONTROLLER_NAMESPACE_MANIFEST)
            storage: Any = k8s_client.StorageV1Api(self.api_client)
            storage.create_storage_class(STORAGE_CLASS_MANIFEST)
            for index in range(STATIC_VOLUMES):
                core.create_persistent_volume(self._static_volume(index))
            self._wait(
                lambda: all(_node_is_ready(core, node.name) for node in self._nodes),
                timeout=self._startup_timeout,
                what="kwok to mark the nodes Ready",
                blame=("kwok",),
            )
            self._wait(
                lambda: _exists(lambda: core.read_namespaced_service_account("default", "default")),
                timeout=self._startup_timeout,
                what="the controller manager to create ServiceAccount default/default",
                blame=("kube-controller-manager",),
            )
            self.hosts_file.touch()
            if self._want_process_node:
                self.add_process_node()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """End every process group this cluster started and remove its directory."""
        with _live_lock:
            _live_clusters.discard(self)
        # The servers first, while the API server can still take their last statuses.
        with contextlib.suppress(Exception):
            self.remove_process_node()
        if self._api_client is not None:
            with contextlib.suppress(Exception):
                self._api_client.close()
            self._api_client = None
        for process in reversed(self._processes):
            terminate_group(process.popen)
        self._processes = []
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None
        self._server = None

    # -- internals ------------------------------------------------------------------

    def _assets(self) -> Path:
        if self._assets_dir is None:
            self._assets_dir = ensure_assets()
        return self._assets_dir

    def _kube_api(self) -> KubeApi:
        return KubeApi(self.api_client)

    @staticmethod
    def _require(value: _T | None, what: str) -> _T:
        if value is None:
            raise LocalClusterError(f"the cluster is not started (no {what} yet)")
        return value

    def _start_processes(self, assets: Path) -> None:
        work = self.workdir
        pki = work / "pki"
        pki.mkdir()
        authority = localpki.create_authority(pki, common_name=f"{self.name}-ca")
        self._ca = authority.pair
        serving = authority.issue(
            pki,
            "apiserver",
            common_name="kube-apiserver",
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server_ips=("127.0.0.1", "10.0.0.1"),
        )
        self._admin = authority.issue(
            pki, "admin", common_name="flexinfer-admin", organizations=("system:masters",)
        )
        controller_manager = authority.issue(
            pki, "kube-controller-manager", common_name="system:kube-controller-manager"
        )
        scheduler = authority.issue(pki, "kube-scheduler", common_name="system:kube-scheduler")
        # kwok writes status for many nodes and their pods; the Node authorizer would only
        # let a kubelet identity touch its own node, so kwok runs as an admin.
        kwok = authority.issue(pki, "kwok", common_name="kwok", organizations=("system:masters",))
        service_accounts = localpki.create_signing_key(pki, "service-account")

        etcd_port, etcd_peer_port, apiserver_port = _free_ports(3)
        self._server = f"https://127.0.0.1:{apiserver_port}"
        for name, pair in (
            ("admin", self._admin),
            ("kube-controller-manager", controller_manager),
            ("kube-scheduler", scheduler),
            ("kwok", kwok),
        ):
            _write_kubeconfig(
                work / f"{name}.kubeconfig",
                server=self._server,
                ca=authority.pair.cert,
                client=pair,
                user=name,
                cluster=self.name,
            )
        stages = work / "kwok-stages.yaml"
        stages.write_text(
            resources.files("flexinfer_devcluster").joinpath("kwok_stages.yaml").read_text()
        )

        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._launch(
            assets,
            "etcd",
            [
                "--name=default",
                f"--data-dir={work / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{etcd_peer_port}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._launch(
            assets,
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={apiserver_port}",
                f"--cert-dir={work / 'apiserver-certs'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={authority.pair.cert}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={service_accounts.cert}",
                f"--service-account-signing-key-file={service_accounts.key}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # 127.0.0.1 may not back the `kubernetes` Service's endpoints; nothing here
                # reaches the API server through that Service.
                "--endpoint-reconciler-type=none",
                # That plugin taints new nodes not-ready until the node lifecycle controller
                # lifts it; kwok nodes are Ready at once and that controller is not run.
                "--disable-admission-plugins=TaintNodesByCondition",
                "--profiling=false",
                *self._audit_args(work),
            ],
        )
        # The controller manager gives up (exits) when the API server is not healthy
        # within 10 s, which a loaded 2-core machine can exceed: start the others only
        # once it is ready.
        self._wait(
            self._apiserver_ready,
            timeout=self._startup_timeout,
            what=f"kube-apiserver {self._server}/readyz",
            blame=("kube-apiserver", "etcd"),
        )
        self._launch(
            assets,
            "kube-controller-manager",
            [
                f"--kubeconfig={work / 'kube-controller-manager.kubeconfig'}",
                "--secure-port=0",
                "--leader-elect=false",
                f"--controllers={','.join(CONTROLLERS)}",
                *self._qps_args(),
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={service_accounts.key}",
                f"--root-ca-file={authority.pair.cert}",
                "--profiling=false",
            ],
        )
        self._launch(
            assets,
            "kube-scheduler",
            [
                f"--kubeconfig={work / 'kube-scheduler.kubeconfig'}",
                "--secure-port=0",
                "--leader-elect=false",
                *self._qps_args(),
                "--profiling=false",
            ],
        )
        self._launch(
            assets,
            "kwok",
            [
                f"--kubeconfig={work / 'kwok.kubeconfig'}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector="
                f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
            ],
        )

    def _static_volume(self, index: int) -> dict[str, Any]:
        """A PersistentVolume on loopback storage: kwok pods never write to it (the
        process node does), but the binder, the scheduler's volume checks and claim
        status all run for real. ReadWriteOnce only, as `local-path` offers."""
        directory = self.workdir / "volumes" / f"{index:02d}"
        directory.mkdir(parents=True, exist_ok=True)
        return _host_volume(
            f"local-pv-{index:02d}", directory, size="100Gi", labels={STATIC_VOLUME_LABEL: "yes"}
        )

    def populate_claim(
        self,
        namespace: str,
        claim: str,
        *,
        files: Mapping[str, bytes | str] | None = None,
        directory: Path | None = None,
        size: str = "10Gi",
        create_claim: bool = True,
    ) -> Path:
        """Storage a user already has: a volume holding `files` (relative path → content)
        and/or a copy of `directory`, pre-bound (`claimRef`) to the claim
        `namespace/claim`, which is created too unless `create_claim` is False.

        Returns the volume's host directory, so a test can check its bytes afterwards.
        The volume is ReadWriteOnce in class `local-path`, `Retain`; the claim asks for
        `size` in that class and binds to this volume only.
        """
        root = self.workdir / "volumes" / "claims" / namespace / claim
        if root.exists():
            raise LocalClusterError(f"{root} already holds the volume of {namespace}/{claim}")
        root.mkdir(parents=True)
        if directory is not None:
            shutil.copytree(directory, root, dirs_exist_ok=True, symlinks=True)
        for relative, content in (files or {}).items():
            target = root / relative
            if root not in target.resolve().parents:
                raise LocalClusterError(f"files: {relative!r} is not a path inside the volume")
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):
                target.write_text(content)
            else:
                target.write_bytes(content)
        volume = _host_volume(
            f"populated-{namespace}-{claim}"[:253],
            root,
            size=size,
            labels={POPULATED_VOLUME_LABEL: "yes"},
        )
        volume["spec"]["claimRef"] = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": namespace,
            "name": claim,
        }
        core: Any = k8s_client.CoreV1Api(self.api_client)
        core.create_persistent_volume(volume)
        if create_claim:
            core.create_namespaced_persistent_volume_claim(
                namespace,
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": STORAGE_CLASS,
                        "volumeName": volume["metadata"]["name"],
                        "resources": {"requests": {"storage": size}},
                    },
                },
            )
        return root

    def _qps_args(self) -> list[str]:
        if self.client_qps is None:
            return []
        return [f"--kube-api-qps={self.client_qps}", f"--kube-api-burst={2 * self.client_qps}"]

    def _audit_args(self, work: Path) -> list[str]:
        if not self.audit:
            return []
        policy = work / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={work / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxsize=0",
        ]

    def _launch(self, assets: Path, binary: str, args: list[str]) -> None:
        args = [*args, *self.extra_args.get(binary, ())]
        log = self.log_path(binary)
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        # kwok merges ~/.kwok/kwok.yaml if it exists; a private HOME keeps runs hermetic.
        env["HOME"] = str(self.workdir)
        with log.open("wb") as log_file:
            try:
                popen = subprocess.Popen(
                    [str(assets / binary), *args],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent_hook(),
                )
            except OSError as error:
                raise LocalClusterError(
                    f"cannot start {binary} ({assets / binary}): {error}"
                ) from error
        self._processes.append(_Process(name=binary, popen=popen, log=log))

    def _apiserver_ready(self) -> bool:
        ca = self._require(self._ca, "ca")
        admin = self._require(self._admin, "admin")
        context = ssl.create_default_context(cafile=str(ca.cert))
        context.load_cert_chain(str(admin.cert), str(admin.key))
        try:
            with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _wait(
        self,
        condition: Callable[[], bool],
        *,
        timeout: float,
        what: str,
        blame: Sequence[str],
    ) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            self.check_alive()
            if condition():
                return
            if time.monotonic() > deadline:
                tails = "\n".join(self._tail(name) for name in blame)
                raise LocalClusterError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n{tails}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def check_alive(self) -> None:
        """Raise LocalClusterError naming the first process that has exited."""
        for process in self._processes:
            code = process.popen.poll()
            if code is not None:
                raise LocalClusterError(
                    f"{process.name} exited with code {code} while {self.name} was running\n"
                    f"{self._tail(process.name)}"
                )

    def _tail(self, binary: str) -> str:
        path = self.log_path(binary)
        try:
            lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError:
            lines = ["(no log)"]
        return f"--- last lines of {path} ---\n" + "\n".join(lines)


STORAGE_CLASS_MANIFEST: Mapping[str, Any] = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {
        "name": STORAGE_CLASS,
        "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
    },
    "provisioner": STORAGE_PROVISIONER,
    "reclaimPolicy": "Delete",
    "volumeBindingMode": "WaitForFirstConsumer",
}


def _host_volume(
    name: str, directory: Path, *, size: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(directory), "type": "Directory"},
        },
    }


def _node_is_ready(core: Any, name: str) -> bool:
    try:
        node = core.read_node(name)
    except k8s_client.ApiException:
        return False
    conditions = node.status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _exists(read: Callable[[], object]) -> bool:
    try:
        read()
    except k8s_client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def _free_ports(count: int) -> list[int]:
    """Ports the kernel has just handed out on loopback (held together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _write_kubeconfig(
    path: Path, *, server: str, ca: Path, client: localpki.CertPair, user: str, cluster: str
) -> None:
    def encoded(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": encoded(ca),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": encoded(client.cert),
                    "client-key-data": encoded(client.key),
                },
            }
        ],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(document))


def _die_with_parent_hook() -> Callable[[], None] | None:
    """Kill a child if the test process dies (see `processes.die_with_thread_hook`).

    The kernel ties that to the starting *thread*, so it is only used from the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    return die_with_thread_hook()


def _rss_of_group(pid: int) -> int:
    total = 0
    for member in _group_members(pid):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def _group_members(pgid: int) -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            # Fields after the parenthesised command: state ppid pgrp ...
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid:
                yield int(entry.name)


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains `text` (used to prove `stop()` left nothing)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found
