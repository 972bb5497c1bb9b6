"""The process node runs what the scheduler binds to it as a real llama-server.

A hand-written Deployment and Service shaped like the llama.cpp renderer's (args only,
port 8000 named http, /health readiness, the model from a hostPath File volume) is
scheduled by the real scheduler onto the process node; the pod turns Ready from the
real server's /health, the hosts file names its Service, and a chat completion sent to
that address returns tokens; two servers sharing one ResourceClaim both run on the
node's one GPU and both answer. Scaling to zero stops the server within its grace period;
a flag the server rejects leaves the pod crash-looping, never Ready; an image that is
not llama.cpp's server fails the pod. The probes run as the kubelet runs them: the
startup probe holds liveness back and kills a server it never passes, a failing
liveness probe restarts a started server, readiness alone never kills. A stub server
that ignores SIGTERM (on a cluster of its own) shows the SIGKILL at the end of the
grace period, and `LocalCluster.stop()` ending every server it started.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_devcluster.gpudriver import DEVICE_CLASS, RESOURCE_SLICES, slice_name
from flexinfer_devcluster.localcluster import (
    GPU_NODE_TAINT,
    GPU_NODE_TOLERATION,
    KWOK_NODE_ANNOTATION,
    LocalCluster,
    processes_mentioning,
)
from flexinfer_devcluster.processnode import (
    PROCESS_NODE_LABEL,
    PROCESS_NODE_SELECTOR,
    PROCESS_NODE_TOLERATION,
    ProcessNode,
)
from flexinfer_kube.informers import Informer, Store
from flexinfer_kube.kubeapi import JSON, KubeApi
from flexinfer_kube.objects import get_path
from flexinfer_kube.resources import (
    DEPLOYMENTS,
    EVENTS,
    PODS,
    RESOURCE_CLAIMS,
    SERVICES,
    Resource,
)
from tests.devcluster.chat import chat
from tests.k8s.kubectl import create_namespace, delete_namespace, kubectl_for
from tests.polling import wait_until

pytestmark = pytest.mark.k8s

NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
RENDERED_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-rocm"
MODEL_MOUNT = "/models/model.gguf"


HEALTH = {"httpGet": {"path": "/health", "port": "http"}}


def rendered_args(name: str, *extra: str) -> list[str]:
    return [
        "-m", MODEL_MOUNT, "--host", "0.0.0.0", "--port", "8000", "--alias", name,
        "--n-gpu-layers", "999", "--ctx-size", "256", *extra,
    ]  # fmt: skip


def labels(name: str) -> dict[str, str]:
    return {"ai.flexinfer/model": name, "app.kubernetes.io/managed-by": "flexinfer"}


def pod_spec(
    name: str, model: Path, *, extra: tuple[str, ...] = (), image: str = RENDERED_IMAGE
) -> JSON:
    """The llama.cpp pod as the renderer writes it, sent to the process node."""
    return {
        "nodeSelector": PROCESS_NODE_SELECTOR,
        # The node's own taint, and the GPU nodes' that flexinfer renders a toleration for.
        "tolerations": [PROCESS_NODE_TOLERATION, dict(GPU_NODE_TOLERATION)],
        "terminationGracePeriodSeconds": 30,
        "volumes": [{"name": "model-source", "hostPath": {"path": str(model), "type": "File"}}],
        "containers": [
            {
                "name": "server",
                "image": image,
                "args": rendered_args(name, *extra),
                "ports": [{"name": "http", "containerPort": 8000}],
                # The renderer's probes with one-second periods: the kubelet's timings
                # are honoured, and these tests are not about them.
                "startupProbe": {**HEALTH, "periodSeconds": 1, "failureThreshold": 120},
                "readinessProbe": {**HEALTH, "periodSeconds": 1},
                "volumeMounts": [
                    {"name": "model-source", "mountPath": MODEL_MOUNT, "readOnly": True}
                ],
                "resources": {"limits": {"amd.com/gpu": "1"}, "requests": {"amd.com/gpu": "1"}},
            }
        ],
    }


def deployment(name: str, model: Path, *, extra: tuple[str, ...] = ()) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels(name)},
            "template": {
                "metadata": {"labels": labels(name)},
                "spec": pod_spec(name, model, extra=extra),
            },
        },
    }


def service(name: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": labels(name),
            "ports": [{"name": "http", "port": 8000, "targetPort": "http"}],
        },
    }


def bare_pod(name: str, spec: JSON) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": spec,
    }


def hosts(path: Path) -> dict[str, str]:
    """name → address, from the `<ip> <name>` lines of the hosts file."""
    return {line.split()[1]: line.split()[0] for line in path.read_text().splitlines() if line}


def is_ready(pod: JSON | None) -> bool:
    conditions = get_path(pod, "status", "conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def container_status(pod: JSON | None) -> JSON:
    statuses = get_path(pod, "status", "containerStatuses") or [{}]
    return dict(statuses[0])


class PodHistory:
    """Every version of the namespace's pods the API server sent, including the last."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.versions: list[tuple[JSON | None, JSON | None]] = []
        self._lock = threading.Lock()
        self._informer = Informer(
            api, PODS, Store(PODS), namespace=namespace, on_change=self._record
        )
        self._informer.start()
        assert self._informer.synced.wait(30)

    def _record(self, old: JSON | None, new: JSON | None) -> None:
        with self._lock:
            self.versions.append((old, new))

    def of(self, name: str) -> list[JSON]:
        """Versions of pod `name`, oldest first; the object as it was last seen at the end."""
        with self._lock:
            seen = [new if new is not None else old for old, new in self.versions]
            return [pod for pod in seen if pod and get_path(pod, "metadata", "name") == name]

    def deleted(self, name: str) -> bool:
        with self._lock:
            return any(
                new is None and get_path(old, "metadata", "name") == name
                for old, new in self.versions
            )

    def stop(self) -> None:
        self._informer.stop()


@pytest.fixture(scope="module")
def process_node(local_cluster: LocalCluster, llama_server: Path) -> Iterator[ProcessNode]:
    node = local_cluster.add_process_node()
    yield node
    local_cluster.remove_process_node()


@pytest.fixture
def namespace(local_cluster: LocalCluster) -> Iterator[str]:
    kubectl = kubectl_for(local_cluster)
    name = create_namespace(kubectl, "pn", pod_security="privileged")  # host paths
    yield name
    delete_namespace(kubectl, name)


@pytest.fixture
def history(api: KubeApi, namespace: str) -> Iterator[PodHistory]:
    recorder = PodHistory(api, namespace)
    yield recorder
    recorder.stop()


def only_pod(api: KubeApi, namespace: str) -> JSON | None:
    items = api.list(PODS, namespace).get("items") or []
    return items[0] if len(items) == 1 else None


def test_the_node_is_ours_not_kwoks_and_takes_only_pods_that_tolerate_it(
    api: KubeApi, namespace: str, process_node: ProcessNode, tiny_model: Path
) -> None:
    node = api.get(NODES, "", process_node.name)
    assert get_path(node, "metadata", "labels", PROCESS_NODE_LABEL) == "true"
    assert KWOK_NODE_ANNOTATION not in (get_path(node, "metadata", "annotations") or {})
    assert get_path(node, "status", "allocatable", "amd.com/gpu") == "1"
    (ready,) = [c for c in get_path(node, "status", "conditions") if c["type"] == "Ready"]
    assert (ready["status"], ready["message"]) == (
        "True",
        "flexinfer process node runner is running",
    )

    taints = [(t["key"], t.get("value"), t["effect"]) for t in get_path(node, "spec", "taints")]
    assert taints == [
        (PROCESS_NODE_LABEL, "true", "NoSchedule"),
        (GPU_NODE_TAINT["key"], GPU_NODE_TAINT["value"], GPU_NODE_TAINT["effect"]),
    ]

    # Tolerating the process node's own taint is not enough: it is a GPU node too.
    spec = pod_spec("intolerant", tiny_model)
    spec["tolerations"] = [PROCESS_NODE_TOLERATION]
    api.create(PODS, namespace, bare_pod("intolerant", spec))

    def unschedulable() -> str | None:
        pod = api.get(PODS, namespace, "intolerant")
        for condition in get_path(pod, "status", "conditions") or []:
            if condition.get("reason") == "Unschedulable":
                return str(condition.get("message"))
        return None

    # The process node matches the selector and its own taint is tolerated: only the GPU
    # taint keeps the pod off it (the kwok nodes: that taint or the selector).
    message = wait_until(unschedulable, what="the scheduler to refuse pod intolerant")
    assert "had untolerated taint" in message, message
    assert not get_path(api.get(PODS, namespace, "intolerant"), "spec", "nodeName")


def test_a_rendered_llama_cpp_deployment_serves_real_tokens_and_stops_at_zero(
    api: KubeApi,
    namespace: str,
    history: PodHistory,
    process_node: ProcessNode,
    local_cluster: LocalCluster,
    llama_server: Path,
    tiny_model: Path,
) -> None:
    api.create(DEPLOYMENTS, namespace, deployment("tiny", tiny_model))
    api.create(SERVICES, namespace, service("tiny"))
    def ready_pod() -> JSON | None:
        pod = only_pod(api, namespace)
        return pod if is_ready(pod) else None

    pod = wait_until(ready_pod, what="the tiny pod to be Ready")
    name = get_path(pod, "metadata", "name")
    assert get_path(pod, "spec", "nodeName") == process_node.name
    address = get_path(pod, "status", "podIP")
    assert address.startswith("127.0.0.") and address != "127.0.0.1"
    assert get_path(pod, "status", "phase") == "Running"
    assert container_status(pod)["ready"] is True
    assert hosts(local_cluster.hosts_file)[f"tiny.{namespace}.svc"] == address
    assert process_node.address_of(namespace, name) == address

    # The rendered command line, run as it is: only --host and the mounted path differ.
    pid = process_node.pids()[f"{namespace}/{name}"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    expected = rendered_args("tiny")
    expected[expected.index("--host") + 1] = address
    expected[expected.index(MODEL_MOUNT)] = str(tiny_model)
    assert argv == [str(llama_server), *expected]

    base = f"http://{hosts(local_cluster.hosts_file)[f'tiny.{namespace}.svc']}:8000"
    plain = chat(base, "tiny", stream=False, max_tokens=8)
    streamed = chat(base, "tiny", stream=True, max_tokens=8)
    assert plain["content"].strip() and plain["model"] == "tiny"
    assert streamed["content"].strip() and streamed["chunks"] >= 8

    api.patch(DEPLOYMENTS, namespace, "tiny", {"spec": {"replicas": 0}}, subresource="scale")
    wait_until(lambda: history.deleted(name), what=f"pod {name} to be gone", timeout=60)
    assert processes_mentioning(str(tiny_model)) == []
    assert process_node.pids() == {}
    assert f"tiny.{namespace}.svc" not in hosts(local_cluster.hosts_file)
    # The last word before the pod went: the server's own exit after SIGTERM, recorded
    # while the pod still existed, before the deadline the API server set (not SIGKILL).
    last = history.of(name)[-1]
    terminated = container_status(last)["state"]["terminated"]
    assert terminated["exitCode"] in (0, 143), terminated
    finished = parse_rfc3339(terminated["finishedAt"])
    deadline = parse_rfc3339(get_path(last, "metadata", "deletionTimestamp"))
    assert finished is not None and deadline is not None and finished <= deadline


def test_two_servers_share_the_nodes_one_gpu_through_one_claim(
    api: KubeApi,
    namespace: str,
    process_node: ProcessNode,
    local_cluster: LocalCluster,
    tiny_model: Path,
) -> None:
    """`amd.com/gpu: 1` lets one pod of the one-GPU process node hold its card; a shared
    ResourceClaim for the node's one fake device (docs/local-cluster.md) lets two."""
    devices = api.get(RESOURCE_SLICES, "", slice_name(process_node.name))["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0-128"]
    api.create(RESOURCE_CLAIMS, namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "card"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1}}]}},
    })  # fmt: skip
    for name in ("left", "right"):
        spec = pod_spec(name, tiny_model)
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "card"}]
        api.create(PODS, namespace, bare_pod(name, spec))
        api.create(SERVICES, namespace, service(name))

    def both_ready() -> list[JSON] | None:
        pods = [api.get(PODS, namespace, n) for n in ("left", "right")]
        return pods if all(is_ready(p) for p in pods) else None

    pods = wait_until(both_ready, what="both servers Ready", timeout=120)
    assert {get_path(p, "spec", "nodeName") for p in pods} == {process_node.name}
    status = api.get(RESOURCE_CLAIMS, namespace, "card")["status"]
    [result] = status["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (process_node.name, "gpu-0-128")
    addresses = hosts(local_cluster.hosts_file)
    for name in ("left", "right"):
        answer = chat(f"http://{addresses[f'{name}.{namespace}.svc']}:8000", name,
                      stream=False, max_tokens=4)
        assert answer["content"].strip() and answer["model"] == name


def test_a_flag_the_server_rejects_fails_the_pod_visibly_and_never_ready(
    api: KubeApi,
    namespace: str,
    history: PodHistory,
    process_node: ProcessNode,
    local_cluster: LocalCluster,
    tiny_model: Path,
) -> None:
    api.create(DEPLOYMENTS, namespace, deployment("bad", tiny_model, extra=("--no-such-flag",)))
    api.create(SERVICES, namespace, service("bad"))

    def crash_looping() -> JSON | None:
        pod = only_pod(api, namespace)
        waiting = get_path(container_status(pod), "state", "waiting", "reason")
        return pod if waiting == "CrashLoopBackOff" else None

    # Restarted at once after the first exit, as the kubelet does; backing off after that.
    pod = wait_until(crash_looping, what="the pod to be in CrashLoopBackOff")
    status = container_status(pod)
    assert status["lastState"]["terminated"]["exitCode"] != 0
    assert "invalid argument: --no-such-flag" in status["lastState"]["terminated"]["message"]
    assert status["restartCount"] >= 2
    assert not any(is_ready(version) for version in history.of(get_path(pod, "metadata", "name")))
    assert f"bad.{namespace}.svc" not in hosts(local_cluster.hosts_file)


def test_an_image_that_is_not_llama_cpps_server_fails_the_pod_saying_so(
    api: KubeApi, namespace: str, process_node: ProcessNode, tiny_model: Path
) -> None:
    spec = pod_spec("other", tiny_model, image="vllm/vllm-openai:v0.9.0")
    api.create(PODS, namespace, bare_pod("other", spec))
    def failed() -> JSON | None:
        pod = api.get(PODS, namespace, "other")
        return pod if get_path(pod, "status", "phase") == "Failed" else None

    pod = wait_until(failed, what="pod other to fail")
    message = get_path(pod, "status", "message")
    assert "'vllm/vllm-openai:v0.9.0', which is neither a llama.cpp server image" in message
    assert not [key for key in process_node.pids() if key.startswith(f"{namespace}/")]


# -- probes, as the kubelet runs them ---------------------------------------------------

NO_SUCH_PATH = {"httpGet": {"path": "/no-such-path", "port": "http"}}  # llama-server: 404


def probed_pod(name: str, model: Path, **probes: JSON) -> JSON:
    spec = pod_spec(name, model)
    container = spec["containers"][0]
    for field in ("startupProbe", "livenessProbe", "readinessProbe"):
        container.pop(field, None)
    container.update(probes)
    return bare_pod(name, spec)


def pod_events(api: KubeApi, namespace: str, name: str) -> list[JSON]:
    items = api.list(EVENTS, namespace).get("items") or []
    return sorted(
        (e for e in items if get_path(e, "involvedObject", "name") == name),
        key=lambda e: (str(e.get("firstTimestamp")), str(get_path(e, "metadata", "name"))),
    )


def killings(api: KubeApi, namespace: str, name: str) -> list[str]:
    return [str(e["message"]) for e in pod_events(api, namespace, name) if e["reason"] == "Killing"]


def killed_and_restarted(api: KubeApi, namespace: str, pod: JSON) -> tuple[str, JSON]:
    """Create `pod`; the message of the kubelet's first Killing event, and the pod once
    its server has restarted."""
    name = pod["metadata"]["name"]
    api.create(PODS, namespace, pod)
    [first] = wait_until(lambda: killings(api, namespace, name)[:1],
                         what="the kubelet's Killing event")
    restarted = wait_until(
        lambda: (p := api.get(PODS, namespace, name))
        and container_status(p).get("restartCount", 0) >= 1
        and p,
        what="the server to be restarted",
    )
    return first, restarted


def test_the_startup_probe_holds_liveness_back_and_kills_when_it_never_passes(
    api: KubeApi, namespace: str, history: PodHistory, process_node: ProcessNode, tiny_model: Path
) -> None:
    # A liveness probe that fails at once would kill the server within two seconds,
    # were it run before the startup probe passed; the startup probe fails its six
    # tries first, and it is the one that kills.
    pod = probed_pod(
        "never-started",
        tiny_model,
        startupProbe={**NO_SUCH_PATH, "periodSeconds": 1, "failureThreshold": 6},
        livenessProbe={**NO_SUCH_PATH, "periodSeconds": 1, "failureThreshold": 1},
        readinessProbe={**HEALTH, "periodSeconds": 1},
    )
    first, restarted = killed_and_restarted(api, namespace, pod)
    assert first == "Container server failed startup probe, will be restarted"
    unhealthy = [
        e["message"] for e in pod_events(api, namespace, "never-started")
        if e["reason"] == "Unhealthy"
    ]
    assert unhealthy[0] == "Startup probe failed: HTTP probe failed with statuscode: 404"
    assert "terminated" in container_status(restarted)["lastState"]
    versions = history.of("never-started")
    assert not any(is_ready(v) for v in versions)  # readiness waits for startup too
    assert not any(container_status(v).get("started") for v in versions)


def test_a_failing_liveness_probe_restarts_a_started_server(
    api: KubeApi, namespace: str, history: PodHistory, process_node: ProcessNode, tiny_model: Path
) -> None:
    pod = probed_pod(
        "unlively",
        tiny_model,
        startupProbe={**HEALTH, "periodSeconds": 1, "failureThreshold": 120},
        livenessProbe={**NO_SUCH_PATH, "periodSeconds": 1, "failureThreshold": 3},
        readinessProbe={**HEALTH, "periodSeconds": 1},
    )
    first, restarted = killed_and_restarted(api, namespace, pod)
    assert first == "Container server failed liveness probe, will be restarted"
    terminated = container_status(restarted)["lastState"]["terminated"]
    assert terminated["exitCode"] in (0, 143), terminated  # it stopped on SIGTERM
    # It had started (the startup probe passed) before liveness could fail it.
    assert any(container_status(v).get("started") for v in history.of("unlively"))


def test_readiness_follows_its_probe_and_a_started_server_may_stay_unready(
    api: KubeApi, namespace: str, history: PodHistory, process_node: ProcessNode, tiny_model: Path
) -> None:
    pod = probed_pod(
        "unready",
        tiny_model,
        startupProbe={**HEALTH, "periodSeconds": 1, "failureThreshold": 120},
        readinessProbe={**NO_SUCH_PATH, "periodSeconds": 1},
    )
    api.create(PODS, namespace, pod)
    wait_until(
        lambda: container_status(api.get(PODS, namespace, "unready")).get("started"),
        what="the server to start",
    )
    unhealthy = wait_until(
        lambda: [e for e in pod_events(api, namespace, "unready") if e["reason"] == "Unhealthy"],
        what="the readiness probe to fail its threshold",
    )
    assert unhealthy[0]["message"] == (
        "Readiness probe failed: HTTP probe failed with statuscode: 404"
    )
    current = api.get(PODS, namespace, "unready")
    assert not is_ready(current)
    assert container_status(current)["restartCount"] == 0  # readiness never kills
    assert not any(is_ready(v) for v in history.of("unready"))


# -- the grace period's end and stop(), with a stub server on a cluster of its own -----

STUB_SERVER = '''
import http.server, os, signal, sys
args = sys.argv[1:]
host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
def noted(signum, frame):
    # Whether the hosts file still sends clients here when the server is told to stop.
    with open(os.environ["STUB_HOSTS"]) as hosts:
        listed = any(line.split()[0] == host for line in hosts if line.strip())
    with open(os.environ["STUB_SIGNALS"], "a") as out:
        out.write(f"{signum}:{'listed' if listed else 'unlisted'}\\n")
signal.signal(signal.SIGTERM, noted)  # a server that will not stop when asked
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *_):
        pass
http.server.HTTPServer((host, port), Health).serve_forever()
'''


@pytest.fixture(scope="module")
def stub_cluster(
    tmp_path_factory: pytest.TempPathFactory, local_cluster: LocalCluster
) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("stub")
    stub = directory / "llama-server"
    stub.write_text(f"#!{sys.executable}\n{STUB_SERVER}")
    stub.chmod(0o755)
    cluster = LocalCluster(
        name="flexinfer-stub", process_node=True, llama_server=stub, nodes=()
    ).start()
    yield cluster
    cluster.stop()


def stub_pod(cluster: LocalCluster, name: str, model: Path, signals: Path, *, grace: int) -> JSON:
    spec = pod_spec(name, model)
    spec["terminationGracePeriodSeconds"] = grace
    spec["containers"][0]["env"] = [
        {"name": "STUB_SIGNALS", "value": str(signals)},
        {"name": "STUB_HOSTS", "value": str(cluster.hosts_file)},
    ]
    del spec["containers"][0]["resources"]  # the node has one GPU; two stubs run at once
    return bare_pod(name, spec)


def test_a_server_that_ignores_sigterm_is_killed_when_the_grace_period_ends(
    stub_cluster: LocalCluster, tmp_path: Path
) -> None:
    api = KubeApi(stub_cluster.new_api_client())
    history = PodHistory(api, "default")
    model, signals = tmp_path / "model.gguf", tmp_path / "signals"
    model.write_bytes(b"not read by the stub")
    try:
        api.create(PODS, "default", stub_pod(stub_cluster, "stubborn", model, signals, grace=2))
        api.create(SERVICES, "default", service("stubborn"))
        wait_until(lambda: is_ready(api.get(PODS, "default", "stubborn")), what="stub Ready")
        assert "stubborn.default.svc" in hosts(stub_cluster.hosts_file)
        pid = stub_cluster.process_node.pids()["default/stubborn"]
        api.request("DELETE", PODS.path("default", "stubborn"))
        wait_until(lambda: history.deleted("stubborn"), what="pod stubborn to be gone")
        # One SIGTERM, sent only once the hosts file no longer names the server.
        assert signals.read_text().split() == ["15:unlisted"]
        assert not Path(f"/proc/{pid}").exists()
        last = history.of("stubborn")[-1]
        terminated = container_status(last)["state"]["terminated"]
        assert terminated["exitCode"] == 137, terminated  # SIGKILL
        # Killed no earlier than the deadline the API server set (now + grace), to the
        # second that both timestamps carry. The deadline of the user's DELETE, the
        # first version that carries one: the node's final delete (grace 0) moves it
        # to the moment of that delete, which may be a second after the kill.
        finished = parse_rfc3339(terminated["finishedAt"])
        deadline = next(
            parse_rfc3339(stamp)
            for version in history.of("stubborn")
            if (stamp := get_path(version, "metadata", "deletionTimestamp"))
        )
        assert finished is not None and deadline is not None and finished >= deadline
    finally:
        history.stop()


def test_stop_ends_every_server_the_cluster_started(
    stub_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Runs last of the stub tests: it stops their cluster."""
    api = KubeApi(stub_cluster.new_api_client())
    marker = tmp_path / f"model-{uuid.uuid4().hex[:8]}.gguf"
    marker.write_bytes(b"stub")
    for name in ("one", "two"):
        pod = stub_pod(stub_cluster, name, marker, tmp_path / "signals", grace=30)
        api.create(PODS, "default", pod)
    wait_until(
        lambda: all(is_ready(api.get(PODS, "default", n)) for n in ("one", "two")),
        what="both stub pods Ready",
    )
    hosts_file = stub_cluster.hosts_file
    assert len(processes_mentioning(str(marker))) == 2
    stub_cluster.stop()
    assert processes_mentioning(str(marker)) == []
    assert not hosts_file.exists()
