"""A node whose pods run as local processes: the dev control plane's kubelet for llama-server.

`ProcessNode` registers a Node labelled and tainted `flexinfer.dev/process-node=true`
(NoSchedule, so only pods that tolerate it land here; other backends stay on the kwok
nodes) that advertises `amd.com/gpu`. It carries no kwok annotation, so kwok leaves it
alone; the runner keeps its Ready condition fresh. Each pod the scheduler binds to it is
run as a local `llama-server` (the container is mapped by `podcommand`) on a loopback
address of its own, 127.0.0.N, reserved machine-wide with a lock file so concurrent
clusters never share one. Its status is written as a kubelet would: Running with
`podIP` = that address, Ready from the container's readiness probe against the real
server, `containerStatuses`; a server that exits is restarted with the kubelet's back-off
(`CrashLoopBackOff`, the log tail as the termination message) or ends the pod under its
`restartPolicy`; a pod it cannot run is `Failed` with the reason. A deleted pod's server
gets SIGTERM, then SIGKILL once the pod's grace period is over, and the pod is finally
deleted as a kubelet does.

Service names do not resolve on this machine (no cluster DNS, no kube-proxy), so the
runner also keeps a hosts file, one `<ip> <service>.<namespace>.svc` line per Service
that selects a ready pod here (`--resolve-file` of the proxy reads it). The hosts file
drops a pod before its server is told to stop, and gains it before its Ready is written.

Probe timings in the pod spec are not honoured: the runner probes every 0.2 s until a
server is ready, then every second, so swaps stay fast. Dev control plane only: this is
never part of the controller image.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import attrs

from flexinfer_core.timestamps import format_rfc3339
from flexinfer_devcluster.podcommand import (
    ReadinessCheck,
    ServerCommand,
    UnsupportedPod,
    server_command,
)
from flexinfer_devcluster.processes import die_with_thread_hook, signal_group, terminate_group
from flexinfer_kube.informers import Informer, Store, wait_all
from flexinfer_kube.kubeapi import JSON, Conflict, KubeApi, KubeError, NotFound, new_api_client
from flexinfer_kube.objects import get_path, name_of, namespace_of
from flexinfer_kube.resources import PODS, SERVICES, Resource

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
GPU_RESOURCE = "amd.com/gpu"
HOST_IP = "127.0.0.1"
LOOPBACK_HOSTS = range(2, 255)
"""127.0.0.2 … 127.0.0.254; 127.0.0.1 is the control plane's."""
LOOPBACK_LOCK_DIR = Path(tempfile.gettempdir()) / "flexinfer-loopback"
DEFAULT_SERVER_PORT = 8080
"""llama-server's own default when the args name no `--port`."""
DEFAULT_GRACE_SECONDS = 30.0
STOP_GRACE_SECONDS = 5.0
PROBE_STARTING_SECONDS = 0.2
PROBE_READY_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 1.0
HEARTBEAT_SECONDS = 20.0
BACK_OFF_FIRST_SECONDS = 10.0
BACK_OFF_MAX_SECONDS = 300.0
TERMINATION_MESSAGE_BYTES = 2048
"""What the kubelet keeps of a log for `FallbackToLogsOnError`."""


class ProcessNodeError(RuntimeError):
    """The runner could not register its node or start; the message says why."""


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


def _server_port(command: ServerCommand) -> int:
    argv = list(command.argv)
    for index, arg in enumerate(argv):
        with contextlib.suppress(ValueError, IndexError):
            if arg == "--port":
                return int(argv[index + 1])
            if arg.startswith("--port="):
                return int(arg.partition("=")[2])
    return DEFAULT_SERVER_PORT


# -- one pod --------------------------------------------------------------------------


def _passes(check: ReadinessCheck, address: str) -> bool:
    """Run one readiness check against the pod's address, as the kubelet probes the pod IP."""
    if check.kind == "none":
        return True
    if check.kind == "tcp":
        with contextlib.suppress(OSError), socket.create_connection(
            (address, check.port), timeout=PROBE_TIMEOUT_SECONDS
        ):
            return True
        return False
    url = f"http://{address}:{check.port}{check.path}"
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_SECONDS) as response:
            return bool(200 <= response.status < 400)
    except (urllib.error.URLError, OSError, ValueError):
        return False


@attrs.define
class _PodProcess:
    """What the runner knows of one admitted pod; mutated by the runner thread only."""

    uid: str
    namespace: str
    name: str
    command: ServerCommand
    reservation: AddressReservation
    log_path: Path
    restart_policy: str
    popen: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    pod_started_at: str = attrs.field(factory=_now)
    restarts: int = 0
    ready: bool = False
    waiting: dict[str, str] | None = None
    last_terminated: JSON | None = None
    terminated: JSON | None = None
    back_off_until: float | None = None
    next_probe: float = 0.0
    terminating: bool = False
    term_sent: bool = False
    kill_at: float | None = None
    written: JSON | None = None

    @property
    def address(self) -> str:
        return self.reservation.address

    @property
    def phase(self) -> str:
        if self.terminated is not None:
            return "Succeeded" if self.terminated.get("exitCode") == 0 else "Failed"
        return "Running" if self.started_at else "Pending"

    @property
    def done(self) -> bool:
        """The server is gone for good: it ended under the restart policy, or was deleted."""
        return self.terminated is not None


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
        name: str = "process-node",
        gpus: int = 1,
        labels: Mapping[str, str] | None = None,
        lock_dir: Path = LOOPBACK_LOCK_DIR,
    ) -> None:
        self.name = name
        self.kubeconfig = kubeconfig
        self.llama_server = llama_server
        self.workdir = workdir
        self.hosts_file = hosts_file
        """`<ip> <service>.<namespace>.svc` lines for the Services with a ready pod here."""
        self.gpus = gpus
        self.labels = dict(labels or {})
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
        self._next_heartbeat = 0.0
        self._registered_at = _now()
        self._hosts_text: str | None = None

    # -- public surface -----------------------------------------------------------

    def start(self, *, timeout: float = 30.0) -> ProcessNode:
        if self._thread is not None:
            raise ProcessNodeError(f"process node {self.name} is already running")
        if not (self.llama_server.is_file() and os.access(self.llama_server, os.X_OK)):
            raise ProcessNodeError(f"llama-server {self.llama_server} is not an executable file")
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
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
        self._thread = threading.Thread(
            target=self._run, name=f"process-node-{self.name}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop every server this node started, then its thread, informers and Node."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        with self._state_lock:
            processes = list(self._processes.values())
            self._processes.clear()
        for process in processes:  # the thread is gone: nothing else touches them
            if process.popen is not None and process.popen.poll() is None:
                terminate_group(process.popen, grace=STOP_GRACE_SECONDS)
            process.reservation.release()
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
            return {
                f"{p.namespace}/{p.name}": p.popen.pid
                for p in self._processes.values()
                if p.popen is not None and p.popen.poll() is None
            }

    def log_path(self, namespace: str, name: str) -> Path | None:
        """The server log of the pod `namespace/name` (the latest pod of that name)."""
        logs = sorted(
            (self.workdir / "pods").glob(f"{namespace}_{name}_*.log"),
            key=lambda path: path.stat().st_mtime,
        )
        return logs[-1] if logs else None

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
            condition(
                "Ready", "True", "KubeletReady", "flexinfer process node runner is running"
            ),
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
            "spec": {"taints": [PROCESS_NODE_TAINT]},
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
            busy = any(not p.ready or p.terminating for p in self._processes.values())
        return PROBE_STARTING_SECONDS if busy else PROBE_READY_SECONDS

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
                process.ready = False
                process.kill_at = now + float(DEFAULT_GRACE_SECONDS if grace is None else grace)
            self._advance(process, now)
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

    def _admit(self, uid: str, pod: JSON) -> None:
        namespace, name = namespace_of(pod), name_of(pod)
        try:
            # Parsed once with a placeholder address: it tells the port to reserve for.
            probe_command = server_command(pod, binary=self.llama_server, address=HOST_IP)
        except UnsupportedPod as refusal:
            self._refused[uid] = self._refusal_status(pod, str(refusal))
            log.info(
                "pod refused",
                extra={"fields": {"pod": f"{namespace}/{name}", "reason": str(refusal)}},
            )
            return
        reservation = reserve_address(_server_port(probe_command), lock_dir=self._lock_dir)
        command = server_command(pod, binary=self.llama_server, address=reservation.address)
        process = _PodProcess(
            uid=uid,
            namespace=namespace,
            name=name,
            command=command,
            reservation=reservation,
            log_path=self.workdir / "pods" / f"{namespace}_{name}_{uid[:8]}.log",
            restart_policy=str(get_path(pod, "spec", "restartPolicy") or "Always"),
        )
        with self._state_lock:
            self._processes[uid] = process

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
            "conditions": _conditions(ready=False, now=now),
            "containerStatuses": [
                {
                    "name": str(c.get("name")),
                    "image": str(c.get("image")),
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "UnsupportedOnProcessNode",
                            "message": message,
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    },
                }
                for c in containers
            ],
        }

    def _missing_host_paths(self, process: _PodProcess) -> list[str]:
        missing = []
        for mount in process.command.mounts:
            path = Path(mount.host_path)
            if (mount.host_path_type == "File" and not path.is_file()) or (
                mount.host_path_type == "Directory" and not path.is_dir()
            ):
                missing.append(
                    f"hostPath {mount.host_path} of volume {mount.volume!r} is not a "
                    f"{mount.host_path_type.lower()}"
                )
        return missing

    def _advance(self, process: _PodProcess, now: float) -> None:
        """Move one pod along: start, notice an exit, restart after back-off, probe."""
        popen = process.popen
        if popen is not None and popen.poll() is not None:
            self._exited(process, popen, now)
            popen = None
        if process.terminating:
            if popen is None:
                if process.terminated is None:  # deleted while waiting to (re)start
                    process.terminated = process.last_terminated or {
                        "exitCode": 0,
                        "reason": "Completed",
                    }
                return
            if process.kill_at is not None and now >= process.kill_at:
                signal_group(popen.pid, signal.SIGKILL)
                process.kill_at = None
            return
        if popen is None and process.terminated is None:
            if process.back_off_until is not None and now < process.back_off_until:
                return
            self._launch(process)
            return
        if popen is not None and now >= process.next_probe:
            process.ready = _passes(process.command.readiness, process.address)
            process.next_probe = now + (
                PROBE_READY_SECONDS if process.ready else PROBE_STARTING_SECONDS
            )

    def _launch(self, process: _PodProcess) -> None:
        missing = self._missing_host_paths(process)
        if missing:
            # The kubelet keeps such a pod ContainerCreating and retries the mount.
            process.waiting = {"reason": "ContainerCreating", "message": "; ".join(missing)}
            return
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir / "pods"),
            **process.command.env,
        }
        with process.log_path.open("ab") as log_file:
            log_file.write(
                f"# flexinfer process node: start {process.restarts}: "
                f"{' '.join(process.command.argv)}\n".encode()
            )
            log_file.flush()
            try:
                process.popen = subprocess.Popen(
                    list(process.command.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir / "pods",
                    env=env,
                    start_new_session=True,
                    # This thread outlives its servers (stop() ends them first), so the
                    # kernel may tie their lives to it: a killed test leaves none behind.
                    preexec_fn=die_with_thread_hook(),
                )
            except OSError as error:
                process.popen = None
                process.waiting = {"reason": "RunContainerError", "message": str(error)}
                process.back_off_until = time.monotonic() + BACK_OFF_FIRST_SECONDS
                return
        process.started_at = _now()
        process.waiting = None
        process.ready = False
        process.next_probe = 0.0
        log.info(
            "server started",
            extra={
                "fields": {
                    "pod": f"{process.namespace}/{process.name}",
                    "address": process.address,
                    "pid": process.popen.pid,
                }
            },
        )

    def _exited(self, process: _PodProcess, popen: subprocess.Popen[bytes], now: float) -> None:
        code = _exit_code(int(popen.returncode))
        signal_group(popen.pid, signal.SIGKILL)  # anything the server left in its group
        record: JSON = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": process.started_at,
            "finishedAt": _now(),
            "containerID": f"process://{popen.pid}",
        }
        if code != 0 and not process.terminating:
            record["message"] = _log_tail(process.log_path)
        process.popen = None
        process.ready = False
        restart = not process.terminating and (
            process.restart_policy == "Always"
            or (process.restart_policy == "OnFailure" and code != 0)
        )
        if not restart:
            process.terminated = record
            return
        # As the kubelet: the first restart at once, then 10 s, 20 s, … up to 5 min.
        delay = (
            0.0
            if process.restarts == 0
            else min(BACK_OFF_FIRST_SECONDS * 2 ** (process.restarts - 1), BACK_OFF_MAX_SECONDS)
        )
        process.restarts += 1
        process.last_terminated = record
        process.back_off_until = now + delay
        process.waiting = {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {delay:.0f}s restarting failed container="
            f"{process.command.container} pod={process.name}_{process.namespace}"
            f"({process.uid})",
        }

    def _signal(self, process: _PodProcess) -> None:
        if process.terminating and not process.term_sent and process.popen is not None:
            signal_group(process.popen.pid, signal.SIGTERM)
            process.term_sent = True

    def _status(self, process: _PodProcess, pod: JSON) -> JSON:
        ready = process.ready and not process.terminating
        if process.terminated is not None:
            state: JSON = {"terminated": process.terminated}
        elif process.popen is not None and process.started_at:
            state = {"running": {"startedAt": process.started_at}}
        else:
            state = {"waiting": process.waiting or {"reason": "ContainerCreating"}}
        container: JSON = {
            "name": process.command.container,
            "image": process.command.image,
            "imageID": "",
            "ready": ready,
            "started": "running" in state,
            "restartCount": process.restarts,
            "state": state,
        }
        if process.popen is not None:
            container["containerID"] = f"process://{process.popen.pid}"
        if process.last_terminated is not None:
            container["lastState"] = {"terminated": process.last_terminated}
        return {
            "phase": process.phase,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": process.address,
            "podIPs": [{"ip": process.address}],
            "startTime": get_path(pod, "status", "startTime") or process.pod_started_at,
            "conditions": _conditions(ready=ready, now=_now(), previous=pod),
            "containerStatuses": [container],
        }

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

    def _end(self, uid: str, process: _PodProcess, pod: JSON) -> None:
        process.reservation.release()
        with self._state_lock:
            self._processes.pop(uid, None)
        self._finished.add(uid)
        if process.terminating:
            self._finalise(pod)

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
        if process.popen is not None and process.popen.poll() is None:
            signal_group(process.popen.pid, signal.SIGKILL)
            process.popen.wait()
        process.reservation.release()

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
                    (str(process.started_at), process.name, process.address)
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


def _conditions(*, ready: bool, now: str, previous: JSON | None = None) -> list[JSON]:
    """The pod conditions a kubelet writes, keeping transition times that did not change."""
    before = {
        str(c.get("type")): c for c in (get_path(previous, "status", "conditions") or [])
    }
    wanted = {
        "PodReadyToStartContainers": True,
        "Initialized": True,
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
