"""A node whose pods run as local processes: the dev control plane's kubelet for real servers.

`ProcessNode` registers a Node labelled `flexinfer.dev/process-node=true` and tainted
with it (NoSchedule, so only pods that tolerate it land here; other backends stay on the
kwok nodes) and with the cluster's GPU-node taints (`taints`), that advertises
`amd.com/gpu`. It carries no kwok annotation, so kwok leaves it alone; the runner keeps
its Ready condition fresh.

Each pod the scheduler binds to it runs as local processes (`podcommand` maps the
containers): its init containers one after the other as shell scripts, then its server,
the cached `llama-server` or `ollama`, on a loopback address of its own, 127.0.0.N,
reserved machine-wide with a lock file so concurrent clusters never share one (ollama
listens on all addresses at a port of its own, relayed from the pod's: `relay`). Volumes
are host directories: a hostPath (the node's own directories, `/var/lib/flexinfer` and
`/dev/shm/flexinfer`, live under `<workdir>/root/` so clusters never share them), a
PersistentVolumeClaim's bound volume (its hostPath or local path), an emptyDir.

The pod's status is written as a kubelet would: init container statuses, Running with
`podIP` = that address, `containerStatuses`, and the probes run as the kubelet runs
them, with their timings: the startup probe gates liveness and readiness, a liveness or
startup probe that fails its threshold kills and restarts the server, readiness follows
its period and thresholds. A container that exits is restarted with the kubelet's
back-off (`CrashLoopBackOff`, the log tail as the termination message) or ends the pod
under its `restartPolicy`; a pod it cannot run is `Failed` with the reason. A deleted
pod's process gets SIGTERM, then SIGKILL once the pod's grace period is over, and the
pod is finally deleted as a kubelet does.

Service names do not resolve on this machine (no cluster DNS, no kube-proxy), so the
runner also keeps a hosts file, one `<ip> <service>.<namespace>.svc` line per Service
that selects a ready pod here (`--resolve-file` of the proxy reads it). The hosts file
drops a pod before its server is told to stop, and gains it before its Ready is written.

Dev control plane only: this is never part of the controller image.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import posixpath
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import attrs

from flexinfer_core.timestamps import format_rfc3339
from flexinfer_devcluster.podcommand import (
    Binaries,
    ContainerRun,
    PodRun,
    Probe,
    UnsupportedPod,
    pod_run,
    volume_names,
)
from flexinfer_devcluster.processes import die_with_thread_hook, signal_group, terminate_group
from flexinfer_devcluster.relay import Relay, free_port
from flexinfer_kube.informers import Informer, Store, wait_all
from flexinfer_kube.kubeapi import JSON, Conflict, KubeApi, KubeError, NotFound, new_api_client
from flexinfer_kube.objects import get_path, name_of, namespace_of
from flexinfer_kube.resources import (
    EVENTS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    SERVICES,
    Resource,
)

log = logging.getLogger("flexinfer.processnode")

NODES = Resource("", "v1", "nodes", "Node", namespaced=False)

PROCESS_NODE_LABEL = "flexinfer.dev/process-node"
PROCESS_NODE_SELECTOR = {PROCESS_NODE_LABEL: "true"}
"""The nodeSelector that sends a pod to a process node."""
PROCESS_NODE_TAINT = {"key": PROCESS_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
PROCESS_NODE_TOLERATION = {
    "key": PROCESS_NODE_LABEL,
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}
"""The toleration a pod needs to be scheduled onto a process node."""
NODE_PRIVATE_PREFIXES = ("/var/lib/flexinfer", "/dev/shm/flexinfer")
"""hostPaths under these are the node's own directories (NodeLocal and Memory caches):
they live under `<workdir>/root/`, so a cluster never touches the machine's, nor another
cluster's."""
GPU_RESOURCE = "amd.com/gpu"
HOST_IP = "127.0.0.1"
LOOPBACK_HOSTS = range(2, 255)
"""127.0.0.2 … 127.0.0.254; 127.0.0.1 is the control plane's."""
LOOPBACK_LOCK_DIR = Path(tempfile.gettempdir()) / "flexinfer-loopback"
DEFAULT_GRACE_SECONDS = 30.0
STOP_GRACE_SECONDS = 5.0
TURN_BUSY_SECONDS = 0.2
TURN_IDLE_SECONDS = 1.0
PROBE_WORKERS = 4
HEARTBEAT_SECONDS = 20.0
BACK_OFF_FIRST_SECONDS = 10.0
BACK_OFF_MAX_SECONDS = 300.0
TERMINATION_MESSAGE_BYTES = 2048
"""What the kubelet keeps of a log for `FallbackToLogsOnError`."""


class ProcessNodeError(RuntimeError):
    """The runner could not register its node or start; the message says why."""


class _NotYet(Exception):
    """A pod's volumes cannot be set up yet (the kubelet keeps it ContainerCreating)."""


def _now() -> str:
    # Whole seconds, as the kubelet writes them.
    return str(format_rfc3339(datetime.now(UTC).replace(microsecond=0)))


# -- loopback addresses -------------------------------------------------------------


@attrs.define
class AddressReservation:
    """One 127.0.0.N held for a pod: a lock file open with an exclusive flock."""

    address: str
    _handle: IO[str] | None

    def release(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._handle, fcntl.LOCK_UN)
                self._handle.close()
        self._handle = None


def reserve_address(port: int, *, lock_dir: Path = LOOPBACK_LOCK_DIR) -> AddressReservation:
    """A loopback address nobody on this machine holds and whose `port` is free.

    The lock is released when the holder closes it or dies, so a killed test run
    never leaks an address.
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    for host in LOOPBACK_HOSTS:
        address = f"127.0.0.{host}"
        handle = (lock_dir / f"{address}.lock").open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        if _port_free(address, port):
            return AddressReservation(address, handle)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
    raise ProcessNodeError(
        f"no free loopback address for port {port} in 127.0.0.{LOOPBACK_HOSTS.start}-"
        f"127.0.0.{LOOPBACK_HOSTS.stop - 1} (locks in {lock_dir})"
    )


def _port_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


# -- probes ---------------------------------------------------------------------------


def check(probe: Probe, address: str) -> tuple[bool, str]:
    """Run one probe against the pod's address, as the kubelet probes the pod IP; the
    result and, on failure, the kubelet-style reason."""
    if probe.kind == "none":
        return True, ""
    if probe.kind == "tcp":
        try:
            with socket.create_connection((address, probe.port), timeout=probe.timeout):
                return True, ""
        except OSError as error:
            return False, f"dial tcp {address}:{probe.port}: {error}"
    url = f"http://{address}:{probe.port}{probe.path}"
    try:
        with urllib.request.urlopen(url, timeout=probe.timeout) as response:
            if 200 <= response.status < 400:
                return True, ""
            return False, f"HTTP probe failed with statuscode: {response.status}"
    except urllib.error.HTTPError as error:
        return False, f"HTTP probe failed with statuscode: {error.code}"
    except (urllib.error.URLError, OSError, ValueError) as error:
        return False, f"Get {url!r}: {getattr(error, 'reason', error)}"


@attrs.define
class _ProbeState:
    """One probe of a running container: when it runs next and its consecutive results."""

    kind: str  # "startup", "liveness" or "readiness"
    probe: Probe
    started: float
    next_at: float
    successes: int = 0
    failures: int = 0
    pending: Future[tuple[bool, str]] | None = None

    def next_tick(self, now: float) -> float:
        """The worker's next tick after `now` (its ticker runs from the container start)."""
        period = self.probe.period
        return self.started + period * (math.floor((now - self.started) / period) + 1)


# -- one pod --------------------------------------------------------------------------


@attrs.define
class _Container:
    """One container of an admitted pod as the runner drives it (runner thread only)."""

    run: ContainerRun
    log_path: Path
    init: bool
    popen: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    restarts: int = 0
    waiting: dict[str, str] | None = None
    last_terminated: JSON | None = None
    terminated: JSON | None = None
    back_off_until: float | None = None
    started: bool = False
    """The startup probe passed (or there is none) since the last start."""
    ready: bool = False
    probes: list[_ProbeState] = attrs.field(factory=list)
    killed_for: str = ""
    kill_at: float | None = None
    term_sent: bool = False

    @property
    def succeeded(self) -> bool:
        return self.terminated is not None and self.terminated.get("exitCode") == 0

    def state(self) -> JSON:
        if self.terminated is not None:
            return {"terminated": self.terminated}
        if self.popen is not None and self.started_at:
            return {"running": {"startedAt": self.started_at}}
        return {"waiting": self.waiting or {"reason": "ContainerCreating"}}

    def status(self, *, ready: bool) -> JSON:
        state = self.state()
        status: JSON = {
            "name": self.run.name,
            "image": self.run.image,
            "imageID": "",
            "ready": ready,
            "started": "running" in state and self.started,
            "restartCount": self.restarts,
            "state": state,
        }
        if self.popen is not None:
            status["containerID"] = f"process://{self.popen.pid}"
        if self.last_terminated is not None:
            status["lastState"] = {"terminated": self.last_terminated}
        return status


@attrs.define
class _PodProcess:
    """What the runner knows of one admitted pod; mutated by the runner thread only."""

    uid: str
    namespace: str
    name: str
    reservation: AddressReservation
    restart_policy: str
    grace: float
    home: Path
    log_path: Path
    port: int
    run: PodRun | None = None
    """Set once its volumes are set up (until then it is ContainerCreating)."""
    waiting: dict[str, str] | None = None
    containers: list[_Container] = attrs.field(factory=list)
    pod_started_at: str = attrs.field(factory=_now)
    failed: JSON | None = None
    """The pod ended without its server: an init container failed under `Never`."""
    terminating: bool = False
    written: JSON | None = None
    relay: Relay | None = None
    """Carries the pod's address and port to a server listening on all addresses."""
    empty_dirs: set[str] = attrs.field(factory=set)
    """Names of its emptyDir volumes: directories of the pod's own."""

    @property
    def address(self) -> str:
        return self.reservation.address

    @property
    def inits(self) -> list[_Container]:
        return [c for c in self.containers if c.init]

    @property
    def server(self) -> _Container | None:
        return next((c for c in self.containers if not c.init), None)

    @property
    def initialized(self) -> bool:
        return self.run is not None and all(c.succeeded for c in self.inits)

    def current(self) -> _Container | None:
        """The container that runs (or is next to) now: the first unfinished init
        container, else the server."""
        for container in self.inits:
            if not container.succeeded:
                return container
        return self.server

    def running(self) -> list[_Container]:
        return [c for c in self.containers if c.popen is not None]

    @property
    def ready(self) -> bool:
        server = self.server
        return bool(server and server.ready and server.popen is not None) and not self.terminating

    @property
    def phase(self) -> str:
        server = self.server
        if self.failed is not None:
            return "Failed"
        if server is not None and server.terminated is not None:
            return "Succeeded" if server.terminated.get("exitCode") == 0 else "Failed"
        return "Running" if server is not None and server.started_at else "Pending"

    @property
    def done(self) -> bool:
        """The pod is over: its server ended under the restart policy, an init container
        failed for good, or it was deleted and nothing runs any more."""
        if self.failed is not None:
            return not self.running()
        server = self.server
        if server is not None and server.terminated is not None:
            return True
        return self.terminating and not self.running()


def _exit_code(returncode: int) -> int:
    # Popen reports a signal as -N; a container runtime reports 128 + N.
    return 128 - returncode if returncode < 0 else returncode


def _log_tail(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - TERMINATION_MESSAGE_BYTES))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def _back_off(restarts: int) -> float:
    """As the kubelet: the first restart at once, then 10 s, 20 s, … up to 5 min."""
    if restarts == 0:
        return 0.0
    return float(min(BACK_OFF_FIRST_SECONDS * 2 ** (restarts - 1), BACK_OFF_MAX_SECONDS))


# -- the runner -----------------------------------------------------------------------


class ProcessNode:
    """One process-backed node and the thread that runs its pods; `start()` / `stop()`."""

    def __init__(
        self,
        kubeconfig: Path,
        llama_server: Path,
        *,
        workdir: Path,
        hosts_file: Path,
        ollama: Path | None = None,
        name: str = "process-node",
        gpus: int = 1,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        lock_dir: Path = LOOPBACK_LOCK_DIR,
    ) -> None:
        self.name = name
        self.kubeconfig = kubeconfig
        self.llama_server = llama_server
        self.ollama = ollama
        """The `ollama` binary Ollama pods run (None: such pods are refused, saying how to
        build it)."""
        self.workdir = workdir
        self.hosts_file = hosts_file
        """`<ip> <service>.<namespace>.svc` lines for the Services with a ready pod here."""
        self.gpus = gpus
        self.labels = dict(labels or {})
        self.taints = [PROCESS_NODE_TAINT, *(dict(t) for t in taints)]
        """The process node's own taint, then the cluster's GPU-node taints."""
        self._lock_dir = lock_dir
        self._api: KubeApi | None = None
        self._pods = Store(PODS)
        self._services = Store(SERVICES)
        self._informers: list[Informer] = []
        self._processes: dict[str, _PodProcess] = {}
        self._refused: dict[str, JSON] = {}
        self._finished: set[str] = set()
        self._state_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._prober: ThreadPoolExecutor | None = None
        self._next_heartbeat = 0.0
        self._registered_at = _now()
        self._hosts_text: str | None = None

    # -- public surface -----------------------------------------------------------

    @property
    def root(self) -> Path:
        """Where the node's own directories (`NODE_PRIVATE_PREFIXES`) live on this machine."""
        return self.workdir / "root"

    @property
    def bin_dir(self) -> Path:
        """`llama-server` and `ollama` under their image names: first on an init script's
        PATH."""
        return self.workdir / "bin"

    def host_path(self, node_path: str) -> Path:
        """The machine's path for a path on this node: the node's own directories are
        under `root`, anything else is the machine's own (as a hostPath volume sees it)."""
        normal = posixpath.normpath(node_path)
        if any(normal == p or normal.startswith(p + "/") for p in NODE_PRIVATE_PREFIXES):
            return self.root / normal.lstrip("/")
        return Path(normal)

    def start(self, *, timeout: float = 30.0) -> ProcessNode:
        if self._thread is not None:
            raise ProcessNodeError(f"process node {self.name} is already running")
        binaries = {"llama-server": self.llama_server}
        if self.ollama is not None:
            binaries["ollama"] = self.ollama
        for image_name, binary in binaries.items():
            if not (binary.is_file() and os.access(binary, os.X_OK)):
                raise ProcessNodeError(f"{image_name} {binary} is not an executable file")
        (self.workdir / "pods" / "init").mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for image_name, binary in binaries.items():
            link = self.bin_dir / image_name
            link.unlink(missing_ok=True)
            link.symlink_to(binary.resolve())
        self.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        self._write_hosts_text("")
        api_client = new_api_client(str(self.kubeconfig), user_agent="flexinfer-process-node")
        self._api = KubeApi(api_client)
        self._register_node()
        for resource, store in ((PODS, self._pods), (SERVICES, self._services)):
            informer = Informer(
                self._api,
                resource,
                store,
                namespace=None,
                on_change=lambda _old, _new: self._wake.set(),
            )
            informer.start()
            self._informers.append(informer)
        if not wait_all(self._informers, timeout=timeout):
            self.stop()
            raise ProcessNodeError(f"process node {self.name}: pods and services did not list")
        self._stopping.clear()
        self._prober = ThreadPoolExecutor(PROBE_WORKERS, thread_name_prefix=f"probe-{self.name}")
        self._thread = threading.Thread(
            target=self._run, name=f"process-node-{self.name}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop every process this node started, then its thread, informers and Node."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        with self._state_lock:
            processes = list(self._processes.values())
            self._processes.clear()
        for process in processes:  # the thread is gone: nothing else touches them
            for container in process.running():
                assert container.popen is not None
                if container.popen.poll() is None:
                    terminate_group(container.popen, grace=STOP_GRACE_SECONDS)
            process.reservation.release()
            if process.relay is not None:
                process.relay.close()
        if self._prober is not None:
            self._prober.shutdown(wait=False, cancel_futures=True)
            self._prober = None
        for informer in self._informers:
            informer.stop()
        self._informers = []
        if self._api is not None:
            with contextlib.suppress(KubeError):
                self._api.request("DELETE", NODES.path(name=self.name))
            with contextlib.suppress(Exception):
                self._api.api_client.close()
            self._api = None

    def address_of(self, namespace: str, name: str) -> str | None:
        """The loopback address of the live pod `namespace/name` on this node, if any."""
        with self._state_lock:
            for process in self._processes.values():
                if (process.namespace, process.name) == (namespace, name):
                    return process.address
        return None

    def pids(self) -> dict[str, int]:
        """`namespace/name` → pid of each server running now."""
        with self._state_lock:
            pids = {}
            for process in self._processes.values():
                server = process.server
                if server and server.popen is not None and server.popen.poll() is None:
                    pids[f"{process.namespace}/{process.name}"] = server.popen.pid
            return pids

    def log_path(self, namespace: str, name: str) -> Path | None:
        """The server log of the pod `namespace/name` (the latest pod of that name)."""
        return _latest((self.workdir / "pods").glob(f"{namespace}_{name}_*.log"))

    def init_log_path(self, namespace: str, name: str, container: str) -> Path | None:
        """The log of init container `container` of the pod `namespace/name`."""
        return _latest(
            (self.workdir / "pods" / "init").glob(f"{namespace}_{name}_*.{container}.log")
        )

    # -- the node -----------------------------------------------------------------

    def _node_conditions(self) -> list[JSON]:
        now = _now()

        def condition(kind: str, status: str, reason: str, message: str) -> JSON:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": self._registered_at,
            }

        return [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "no pressure"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "no pressure"),
            condition("Ready", "True", "KubeletReady", "flexinfer process node runner is running"),
        ]

    def _register_node(self) -> None:
        api = self._require_api()
        resources = {
            "cpu": str(os.cpu_count() or 2),
            "memory": "16Gi",
            "pods": "16",
            GPU_RESOURCE: str(self.gpus),
        }
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            PROCESS_NODE_LABEL: "true",
            **self.labels,
        }
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {"taints": self.taints},
        }
        try:
            api.request("POST", NODES.path(), body=body)
        except Conflict:  # left by an earlier runner on this cluster: take it over
            api.request(
                "PATCH",
                NODES.path(name=self.name),
                body={"metadata": {"labels": labels}, "spec": body["spec"]},
                content_type="application/merge-patch+json",
            )
        api.request(
            "PATCH",
            NODES.path(name=self.name) + "/status",
            body={
                "status": {
                    "capacity": resources,
                    "allocatable": dict(resources),
                    "addresses": [
                        {"type": "InternalIP", "address": HOST_IP},
                        {"type": "Hostname", "address": self.name},
                    ],
                    "conditions": self._node_conditions(),
                }
            },
            content_type="application/merge-patch+json",
        )
        self._next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS

    def _heartbeat(self) -> None:
        if time.monotonic() < self._next_heartbeat:
            return
        self._require_api().request(
            "PATCH",
            NODES.path(name=self.name) + "/status",
            body={"status": {"conditions": self._node_conditions()}},
            content_type="application/merge-patch+json",
        )
        self._next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS

    def _require_api(self) -> KubeApi:
        if self._api is None:
            raise ProcessNodeError(f"process node {self.name} is not started")
        return self._api

    # -- the loop -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._heartbeat()
                self._reconcile()
            except Exception:  # one failed write must not stop the node; retried next turn
                log.exception("process node turn failed", extra={"fields": {"node": self.name}})
            self._wake.wait(self._pause())
            self._wake.clear()

    def _pause(self) -> float:
        with self._state_lock:
            busy = any(
                not p.ready or p.terminating or any(c.kill_at is not None for c in p.containers)
                for p in self._processes.values()
            )
        return TURN_BUSY_SECONDS if busy else TURN_IDLE_SECONDS

    def _reconcile(self) -> None:
        pods = {
            str(get_path(pod, "metadata", "uid")): pod
            for pod in self._pods.objects()
            if get_path(pod, "spec", "nodeName") == self.name
        }
        for uid in [uid for uid in self._processes if uid not in pods]:
            self._forget(uid)  # deleted without waiting for us (grace period 0)
        self._refused = {uid: s for uid, s in self._refused.items() if uid in pods}
        self._finished &= set(pods)
        for uid, pod in pods.items():
            if uid in self._processes:
                continue
            if get_path(pod, "metadata", "deletionTimestamp"):
                self._finalise(pod)  # never started (or already ended) here
            elif uid not in self._refused and uid not in self._finished:
                self._admit(uid, pod)
        now = time.monotonic()
        for uid, process in list(self._processes.items()):
            pod = pods[uid]
            if get_path(pod, "metadata", "deletionTimestamp") and not process.terminating:
                grace = get_path(pod, "metadata", "deletionGracePeriodSeconds")
                process.terminating = True
                for container in process.running():
                    container.ready = False
                    container.kill_at = now + float(
                        DEFAULT_GRACE_SECONDS if grace is None else grace
                    )
                    container.term_sent = False
            self._advance(process, pod, now)
        # Names first: a pod leaves the hosts file before its server hears SIGTERM, and
        # joins it before its Ready is written.
        self._write_hosts(pods)
        for uid, process in list(self._processes.items()):
            self._signal(process)
            self._write_status(process, pods[uid])
            if process.done:
                self._end(uid, process, pods[uid])
        for uid, status in self._refused.items():
            if get_path(pods[uid], "status", "phase") != "Failed":
                self._patch_pod_status(pods[uid], status)

    def _binaries(self) -> Binaries:
        return Binaries(
            llama_server=str(self.llama_server),
            ollama=str(self.ollama) if self.ollama is not None else None,
        )

    def _admit(self, uid: str, pod: JSON) -> None:
        namespace, name = namespace_of(pod), name_of(pod)
        try:
            # Read once without volumes at a placeholder address: it refuses what cannot
            # run here and tells the port to reserve for.
            port = pod_run(pod, binaries=self._binaries(), volumes={}, address=HOST_IP).port
        except UnsupportedPod as refusal:
            self._refuse(uid, pod, str(refusal))
            return
        reservation = reserve_address(port, lock_dir=self._lock_dir)
        stem = f"{namespace}_{name}_{uid[:8]}"
        home = self.workdir / "pods" / f"{stem}.home"
        home.mkdir(parents=True, exist_ok=True)
        grace = get_path(pod, "spec", "terminationGracePeriodSeconds")
        process = _PodProcess(
            uid=uid,
            namespace=namespace,
            name=name,
            reservation=reservation,
            restart_policy=str(get_path(pod, "spec", "restartPolicy") or "Always"),
            grace=float(DEFAULT_GRACE_SECONDS if grace is None else grace),
            home=home,
            log_path=self.workdir / "pods" / f"{stem}.log",
            port=port,
        )
        with self._state_lock:
            self._processes[uid] = process

    def _refuse(self, uid: str, pod: JSON, message: str) -> None:
        self._refused[uid] = self._refusal_status(pod, message)
        log.info(
            "pod refused",
            extra={"fields": {"pod": f"{namespace_of(pod)}/{name_of(pod)}", "reason": message}},
        )

    def _refusal_status(self, pod: JSON, message: str) -> JSON:
        containers = get_path(pod, "spec", "containers") or []
        now = _now()
        return {
            "phase": "Failed",
            "reason": "UnsupportedOnProcessNode",
            "message": message,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "startTime": now,
            "conditions": _conditions(ready=False, initialized=False, now=now),
            "containerStatuses": [
                _container_status(
                    c,
                    {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "UnsupportedOnProcessNode",
                            "message": message,
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    },
                )
                for c in containers
            ],
        }

    # -- volumes --------------------------------------------------------------------

    def _volumes_dir(self, process: _PodProcess) -> Path:
        return process.home.with_suffix(".volumes")

    def _volumes(self, process: _PodProcess, pod: JSON) -> dict[str, str]:
        """Each mounted volume's host path, set up as the kubelet would; raises `_NotYet`
        naming what is missing (a File or Directory hostPath, an unbound claim). The
        emptyDirs are recorded in `process.empty_dirs`."""
        specs = {str(v.get("name")): v for v in get_path(pod, "spec", "volumes") or []}
        resolved: dict[str, str] = {}
        missing: list[str] = []
        for name in volume_names(pod):
            volume = specs.get(name) or {}
            if "hostPath" in volume:
                path = self.host_path(str(get_path(volume, "hostPath", "path") or "/"))
                kind = str(get_path(volume, "hostPath", "type") or "")
                problem = _set_up_host_path(path, kind)
                if problem:
                    missing.append(f"hostPath {path} of volume {name!r} {problem}")
                resolved[name] = str(path)
            elif "persistentVolumeClaim" in volume:
                claim = str(get_path(volume, "persistentVolumeClaim", "claimName") or "")
                try:
                    resolved[name] = str(self._claim_path(namespace_of(pod), claim))
                except _NotYet as wait:
                    missing.append(f"volume {name!r}: {wait}")
            elif "emptyDir" in volume:
                directory = self._volumes_dir(process) / name
                directory.mkdir(parents=True, exist_ok=True)
                resolved[name] = str(directory)
                process.empty_dirs.add(name)
            # Secrets, ConfigMaps and projected tokens are not mapped: paths under them
            # stay as written.
        if missing:
            raise _NotYet("; ".join(missing))
        return resolved

    def _claim_path(self, namespace: str, claim: str) -> Path:
        """The host directory behind a bound claim: its volume's hostPath or local path."""
        api = self._require_api()
        try:
            pvc = api.get(PERSISTENT_VOLUME_CLAIMS, namespace, claim)
        except NotFound:
            raise _NotYet(f'persistentvolumeclaim "{claim}" not found') from None
        volume_name = get_path(pvc, "spec", "volumeName")
        if get_path(pvc, "status", "phase") != "Bound" or not volume_name:
            raise _NotYet(f'persistentvolumeclaim "{claim}" is not bound')
        try:
            volume = api.request("GET", PERSISTENT_VOLUMES.path(name=str(volume_name)))
        except NotFound:
            raise _NotYet(f'persistentvolume "{volume_name}" not found') from None
        path = get_path(volume, "spec", "hostPath", "path") or get_path(
            volume, "spec", "local", "path"
        )
        if not path:
            raise _NotYet(
                f'persistentvolume "{volume_name}" of claim "{claim}" has neither a hostPath '
                "nor a local path: the process node mounts only directories"
            )
        host = self.host_path(str(path))
        if not host.is_dir():
            raise _NotYet(f'persistentvolume "{volume_name}" path {host} is not a directory')
        return host

    def _set_up(self, process: _PodProcess, pod: JSON) -> None:
        volumes = self._volumes(process, pod)
        _make_sub_paths(pod, volumes)
        relay_port = free_port()
        run = pod_run(
            pod,
            binaries=self._binaries(),
            volumes=volumes,
            address=process.address,
            relay_port=relay_port,
        )
        for container in (*run.init_containers, run.server):
            _nest_mounts(container, process.empty_dirs)
        if run.relayed:
            # The reservation checked the pod's address and port free; the relay takes them.
            process.relay = Relay(process.address, run.port, relay_port)
        stem = process.log_path.stem
        process.run = run
        process.containers = [
            _Container(
                run=init,
                log_path=self.workdir / "pods" / "init" / f"{stem}.{init.name}.log",
                init=True,
            )
            for init in run.init_containers
        ]
        server = _Container(run=run.server, log_path=process.log_path, init=False)
        if run.init_containers:
            server.waiting = {"reason": "PodInitializing"}
        process.containers.append(server)
        process.waiting = None

    # -- one pod's turn -------------------------------------------------------------

    def _advance(self, process: _PodProcess, pod: JSON, now: float) -> None:
        """Move one pod along: notice exits, set up, start, restart after back-off, probe."""
        for container in process.running():
            popen = container.popen
            assert popen is not None
            if popen.poll() is not None:
                self._exited(process, container, popen, now)
        for container in process.running():
            if container.kill_at is not None and container.term_sent and now >= container.kill_at:
                assert container.popen is not None
                signal_group(container.popen.pid, signal.SIGKILL)
                container.kill_at = None
        if process.terminating:
            server = process.server
            if not process.running() and server is not None and server.terminated is None:
                # Deleted while waiting to (re)start: it ends as it last ended.
                server.terminated = server.last_terminated or {"exitCode": 0, "reason": "Completed"}
            return
        if process.failed is not None:
            return
        if process.run is None:
            try:
                self._set_up(process, pod)
            except _NotYet as wait:
                # The kubelet keeps such a pod ContainerCreating and retries the mount.
                process.waiting = {"reason": "ContainerCreating", "message": str(wait)}
                return
            except UnsupportedPod as refusal:
                process.failed = {"reason": "UnsupportedOnProcessNode", "message": str(refusal)}
                return
        current = process.current()
        if current is None or current.terminated is not None:
            return
        if current.popen is None:
            if current.back_off_until is None or now >= current.back_off_until:
                self._launch(process, current, now)
            return
        if not current.init and current.kill_at is None:
            self._probe(process, pod, current, now)

    def _launch(self, process: _PodProcess, container: _Container, now: float) -> None:
        env = {
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(process.home),
            **container.run.env,
        }
        with container.log_path.open("ab") as log_file:
            log_file.write(
                f"# flexinfer process node: start {container.restarts}: "
                f"{' '.join(container.run.argv)}\n".encode()
            )
            log_file.flush()
            try:
                container.popen = subprocess.Popen(
                    list(container.run.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=process.home,
                    env=env,
                    start_new_session=True,
                    # This thread outlives its servers (stop() ends them first), so the
                    # kernel may tie their lives to it: a killed test leaves none behind.
                    preexec_fn=die_with_thread_hook(),
                )
            except OSError as error:
                container.popen = None
                container.waiting = {"reason": "RunContainerError", "message": str(error)}
                container.back_off_until = now + BACK_OFF_FIRST_SECONDS
                return
        container.started_at = _now()
        container.waiting = None
        container.ready = False
        container.killed_for = ""
        container.kill_at = None
        container.term_sent = False
        run = container.run
        container.started = run.startup is None
        container.probes = [
            _ProbeState(kind, probe, started=now, next_at=probe.first_at(now))
            for kind, probe in (
                ("startup", run.startup),
                ("liveness", run.liveness),
                ("readiness", run.readiness),
            )
            if probe is not None and not container.init
        ]
        if container.started:
            self._on_started(container, now)
        log.info(
            "container started",
            extra={
                "fields": {
                    "pod": f"{process.namespace}/{process.name}",
                    "container": run.name,
                    "address": process.address,
                    "pid": container.popen.pid,
                }
            },
        )

    def _on_started(self, container: _Container, now: float) -> None:
        """Started (its startup probe passed, or it has none): the kubelet runs readiness
        at once (past its initial delay), and a container without one is ready."""
        readiness = next((s for s in container.probes if s.kind == "readiness"), None)
        if readiness is None:
            container.ready = True
        elif now - readiness.started >= readiness.probe.initial_delay:
            readiness.next_at = now

    def _probe(self, process: _PodProcess, pod: JSON, container: _Container, now: float) -> None:
        for state in container.probes:
            if (state.kind == "startup") == container.started:
                continue  # startup runs until it passes; the others only after
            if state.pending is not None:
                if not state.pending.done():
                    continue
                passed, why = state.pending.result()
                state.pending = None
                self._probed(process, pod, container, state, passed, why, now)
                if container.kill_at is not None:
                    return
                continue
            if now >= state.next_at and self._prober is not None:
                state.pending = self._prober.submit(check, state.probe, process.address)
                state.pending.add_done_callback(lambda _future: self._wake.set())
                state.next_at = state.next_tick(now)

    def _probed(
        self,
        process: _PodProcess,
        pod: JSON,
        container: _Container,
        state: _ProbeState,
        passed: bool,
        why: str,
        now: float,
    ) -> None:
        """A probe's result, with the kubelet's thresholds."""
        if passed:
            state.successes, state.failures = state.successes + 1, 0
        else:
            state.successes, state.failures = 0, state.failures + 1
        threshold = state.probe.failure_threshold
        if state.kind == "startup":
            if passed:
                container.started = True
                self._on_started(container, now)
            elif state.failures >= threshold:
                self._kill(process, pod, container, state, why, now)
        elif state.kind == "liveness":
            if not passed and state.failures >= threshold:
                self._kill(process, pod, container, state, why, now)
        elif passed and state.successes >= state.probe.success_threshold:
            container.ready = True
        elif not passed and state.failures >= threshold:
            container.ready = False
            if state.failures == threshold:  # once per streak (the kubelet's are aggregated)
                self._event(pod, "Warning", "Unhealthy", f"Readiness probe failed: {why}")

    def _kill(
        self,
        process: _PodProcess,
        pod: JSON,
        container: _Container,
        state: _ProbeState,
        why: str,
        now: float,
    ) -> None:
        """A liveness or startup probe failed its threshold: the kubelet kills the
        container (SIGTERM, SIGKILL after the pod's grace period) and restarts it under
        the restart policy."""
        kind = state.kind
        container.killed_for = kind
        container.ready = False
        container.kill_at = now + process.grace
        container.term_sent = False
        self._event(pod, "Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {why}")
        self._event(
            pod,
            "Normal",
            "Killing",
            f"Container {container.run.name} failed {kind} probe, will be restarted",
        )

    def _exited(
        self,
        process: _PodProcess,
        container: _Container,
        popen: subprocess.Popen[bytes],
        now: float,
    ) -> None:
        code = _exit_code(int(popen.returncode))
        signal_group(popen.pid, signal.SIGKILL)  # anything it left in its group
        record: JSON = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": container.started_at,
            "finishedAt": _now(),
            "containerID": f"process://{popen.pid}",
        }
        if code != 0 and not process.terminating:
            record["message"] = _log_tail(container.log_path)
        container.popen = None
        container.ready = False
        container.started = False
        container.probes = []
        container.kill_at = None
        container.term_sent = False
        if process.terminating or (container.init and code == 0):
            container.terminated = record
            return
        if container.init:
            restart = process.restart_policy != "Never"
        else:
            restart = process.restart_policy == "Always" or (
                process.restart_policy == "OnFailure" and code != 0
            )
        if not restart:
            container.terminated = record
            if container.init:
                process.failed = {
                    "reason": "Failed",
                    "message": f"init container {container.run.name} failed (exit code {code})",
                }
            return
        delay = _back_off(container.restarts)
        container.restarts += 1
        container.last_terminated = record
        container.back_off_until = now + delay
        container.waiting = {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {delay:.0f}s restarting failed container="
            f"{container.run.name} pod={process.name}_{process.namespace}({process.uid})",
        }

    def _signal(self, process: _PodProcess) -> None:
        for container in process.running():
            if container.kill_at is not None and not container.term_sent:
                assert container.popen is not None
                signal_group(container.popen.pid, signal.SIGTERM)
                container.term_sent = True

    # -- status -----------------------------------------------------------------------

    def _status(self, process: _PodProcess, pod: JSON) -> JSON:
        ready = process.ready
        if process.run is None:
            waiting = process.waiting or {"reason": "ContainerCreating"}
            init_statuses = [
                _waiting_status(c, {"reason": "PodInitializing"})
                for c in get_path(pod, "spec", "initContainers") or []
            ]
            statuses = [
                _waiting_status(c, waiting) for c in get_path(pod, "spec", "containers") or []
            ]
        else:
            init_statuses = [c.status(ready=c.succeeded) for c in process.inits]
            statuses = [c.status(ready=ready) for c in process.containers if not c.init]
        status: JSON = {
            "phase": process.phase,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": process.address,
            "podIPs": [{"ip": process.address}],
            "startTime": get_path(pod, "status", "startTime") or process.pod_started_at,
            "conditions": _conditions(
                ready=ready, initialized=process.initialized, now=_now(), previous=pod
            ),
            "containerStatuses": statuses,
        }
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
        if process.failed is not None:
            status.update(process.failed)
        return status

    def _write_status(self, process: _PodProcess, pod: JSON) -> None:
        status = self._status(process, pod)
        comparable = {**status, "conditions": _without_times(status["conditions"])}
        if comparable == process.written:
            return
        if self._patch_pod_status(pod, status):
            process.written = comparable

    def _patch_pod_status(self, pod: JSON, status: JSON) -> bool:
        try:
            self._require_api().patch(
                PODS, namespace_of(pod), name_of(pod), {"status": status}, subresource="status"
            )
        except NotFound:
            return False
        return True

    def _event(self, pod: JSON, kind: str, reason: str, message: str) -> None:
        """A kubelet-style Event on the pod (best effort, as the kubelet's are)."""
        now = datetime.now(UTC)
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name_of(pod)}.", "namespace": namespace_of(pod)},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name_of(pod),
                "namespace": namespace_of(pod),
                "uid": get_path(pod, "metadata", "uid"),
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet", "host": self.name},
            "firstTimestamp": format_rfc3339(now.replace(microsecond=0)),
            "lastTimestamp": format_rfc3339(now.replace(microsecond=0)),
            "count": 1,
        }
        with contextlib.suppress(KubeError):
            self._require_api().create(EVENTS, namespace_of(pod), body)

    def _end(self, uid: str, process: _PodProcess, pod: JSON) -> None:
        process.reservation.release()
        with self._state_lock:
            self._processes.pop(uid, None)
        self._finished.add(uid)
        self._clean_up(process)
        if process.terminating:
            self._finalise(pod)

    def _clean_up(self, process: _PodProcess) -> None:
        if process.relay is not None:
            process.relay.close()
            process.relay = None
        # The container's own files and emptyDirs go with the pod; logs stay.
        shutil.rmtree(process.home, ignore_errors=True)
        shutil.rmtree(self._volumes_dir(process), ignore_errors=True)

    def _finalise(self, pod: JSON) -> None:
        """The kubelet's last word: delete at once, only the pod we ran (uid)."""
        uid = str(get_path(pod, "metadata", "uid"))
        with contextlib.suppress(NotFound, Conflict):
            self._require_api().request(
                "DELETE",
                PODS.path(namespace_of(pod), name_of(pod)),
                body={
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": uid},
                },
            )

    def _forget(self, uid: str) -> None:
        with self._state_lock:
            process = self._processes.pop(uid)
        for container in process.running():
            assert container.popen is not None
            if container.popen.poll() is None:
                signal_group(container.popen.pid, signal.SIGKILL)
                container.popen.wait()
        process.reservation.release()
        self._clean_up(process)

    # -- names ----------------------------------------------------------------------

    def _write_hosts(self, pods: Mapping[str, JSON]) -> None:
        ready = [
            (process, pods[uid])
            for uid, process in self._processes.items()
            if process.ready and not process.terminating
        ]
        lines = []
        for service in self._services.objects():
            selector = get_path(service, "spec", "selector") or {}
            candidates = sorted(
                (
                    (str(_started_at(process)), process.name, process.address)
                    for process, pod in ready
                    if process.namespace == namespace_of(service)
                    and _matches(selector, get_path(pod, "metadata", "labels") or {})
                ),
            )
            if candidates:
                address = candidates[0][2]
                lines.append(f"{address} {name_of(service)}.{namespace_of(service)}.svc")
        self._write_hosts_text("".join(f"{line}\n" for line in sorted(lines)))

    def _write_hosts_text(self, text: str) -> None:
        if text == self._hosts_text:
            return
        descriptor, staging = tempfile.mkstemp(
            prefix=f".{self.hosts_file.name}.", dir=self.hosts_file.parent
        )
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.chmod(staging, 0o644)
        os.replace(staging, self.hosts_file)  # readers see the old file or the new one
        self._hosts_text = text


def _started_at(process: _PodProcess) -> str:
    server = process.server
    return str(server.started_at if server is not None else "")


def _waiting_status(container: Mapping[str, Any], waiting: Mapping[str, str]) -> JSON:
    return _container_status(container, {"waiting": dict(waiting)})


def _container_status(container: Mapping[str, Any], state: JSON) -> JSON:
    """The status of a container that never started, in `state`."""
    return {
        "name": str(container.get("name")),
        "image": str(container.get("image")),
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": 0,
        "state": state,
    }


def _set_up_host_path(path: Path, kind: str) -> str:
    """Check or create a hostPath as the kubelet does for its `type`; what is wrong
    ("" when it is fine)."""
    if kind == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    elif kind == "File" and not path.is_file():
        return "is not a file"
    elif kind == "Directory" and not path.is_dir():
        return "is not a directory"
    return ""


def _make_sub_paths(pod: JSON, volumes: Mapping[str, str]) -> None:
    """A mount's `subPath` that does not exist yet is made a directory (mode 0755), as
    the kubelet does: a node cache's `<root>/<namespace>/<cache>` on its `local` volume.
    Never above the volume: a `..` or absolute subPath is refused, as the kubelet
    refuses it."""
    containers = [
        *(get_path(pod, "spec", "initContainers") or []),
        *(get_path(pod, "spec", "containers") or []),
    ]
    for container in containers:
        for mount in container.get("volumeMounts") or []:
            sub_path = str(mount.get("subPath") or "")
            host = volumes.get(str(mount.get("name")))
            if not sub_path or not host:
                continue
            if sub_path.startswith("/") or ".." in sub_path.split("/"):
                raise _NotYet(f"subPath {sub_path!r} of volume {mount.get('name')!r} is refused")
            target = Path(host) / sub_path
            if not target.exists():
                target.mkdir(mode=0o755, parents=True, exist_ok=True)


def _nest_mounts(container: ContainerRun, empty_dirs: set[str]) -> None:
    """A mount inside another mount of the container is a path inside that one's host
    directory, as the runtime makes a mount point: `/models/<dir>` inside the `/models`
    emptyDir becomes a symlink `<emptyDir>/<dir>` → the inner mount's host path, so a
    script that `cd /models` sees `<dir>` there. Only in the pod's own emptyDirs: the
    node never writes into a hostPath or a claim it mounts."""
    mounts = sorted(container.mounts, key=lambda m: len(m.mount_path))
    for inner in mounts:
        outer = next(
            (
                m
                for m in reversed(mounts)
                if m is not inner and inner.mount_path.startswith(m.mount_path.rstrip("/") + "/")
            ),
            None,
        )
        if outer is None or outer.volume not in empty_dirs:
            continue
        point = Path(outer.host_path) / inner.mount_path[len(outer.mount_path) :].lstrip("/")
        if point.exists() or point.is_symlink():
            continue
        point.parent.mkdir(parents=True, exist_ok=True)
        point.symlink_to(inner.host_path)


def _latest(paths: Any) -> Path | None:
    found = sorted(paths, key=lambda path: path.stat().st_mtime)
    return found[-1] if found else None


def _conditions(
    *, ready: bool, initialized: bool = True, now: str, previous: JSON | None = None
) -> list[JSON]:
    """The pod conditions a kubelet writes, keeping transition times that did not change."""
    before = {str(c.get("type")): c for c in (get_path(previous, "status", "conditions") or [])}
    wanted = {
        "PodReadyToStartContainers": True,
        "Initialized": initialized,
        "Ready": ready,
        "ContainersReady": ready,
        "PodScheduled": True,
    }
    conditions = []
    for kind, value in wanted.items():
        status = "True" if value else "False"
        old = before.get(kind)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else now
        conditions.append({"type": kind, "status": status, "lastTransitionTime": since})
    return conditions


def _without_times(conditions: list[JSON]) -> list[JSON]:
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conditions]
