"""`flexinfer demo`: a local control plane, the controller, the proxy, and two models
that answer for real while they take turns on one GPU.

The story, told with real components on loopback (etcd, kube-apiserver, controller
manager, scheduler; the dev cluster's process node, which runs every llama.cpp pod
it is given as a real `llama-server` process; the controller in this process; the
proxy as `python -m flexinfer_proxy`):

1. `chat` is asked for through the proxy: it is swapped in (a cold start), answers,
   and answers again warm. The answers are nonsense words: the models are tiny and
   their weights random (written here, never downloaded).
2. `coder`, more important, is asked for: `chat` is preempted, its pod is gone
   before `coder`'s pod is created (break-before-make, watched from before the
   request), and `coder` answers after its own cold start.
3. A fine-tuning job takes a GPU lease: every model is parked.
4. The lease is released: `coder`, asked for recently and more important, comes back
   by itself and answers.

The windows are shortened (demand 20s, cooldown 5s) so the story takes a minute or two.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

from flexinfer_core import Policy
from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_devcluster.policy import dev_policy
from flexinfer_devcluster.processes import die_with_thread_hook
from flexinfer_devcluster.processnode import PROCESS_NODE_SELECTOR, PROCESS_NODE_TOLERATION
from flexinfer_devcluster.tinymodel import write_tiny_model
from flexinfer_k8s.controller import Controller
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_k8s.pods import pod_is_finished
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_kube.kubeapi import JSON, KubeApi, new_api_client
from flexinfer_kube.objects import get_path, name_of
from flexinfer_kube.recorded_status import card_holders
from flexinfer_kube.resources import EVENTS, GPU_LEASES, MODELS, PODS

NAMESPACE = "demo"
GROUP = "homelab-gpu"
CRD_DIR = Path(__file__).resolve().parents[1] / "crds"
DEMO_POLICY = Policy(
    demand_window=timedelta(seconds=20),
    recent_window=timedelta(seconds=30),
    default_swap_cooldown=timedelta(seconds=5),
)


class DemoError(RuntimeError):
    pass


def run_demo(*, keep: bool = False, out: TextIO = sys.stdout) -> int:
    say = _printer(out)
    if not CRD_DIR.is_dir():
        raise DemoError(f"the CRDs are not at {CRD_DIR}; run the demo from a source checkout")
    say(
        "Starting a local control plane (etcd, kube-apiserver, controller-manager, "
        "scheduler) and a process node that runs llama.cpp pods as real llama-server ..."
    )
    cluster = LocalCluster(nodes=(), name="flexinfer-demo", process_node=True)
    cluster.start()
    controller: Controller | None = None
    models = Path(tempfile.mkdtemp(prefix="flexinfer-demo-models-"))
    try:
        say(f"  API server {cluster.server}, kubeconfig {cluster.kubeconfig}")
        cluster.install_crds(CRD_DIR)
        cluster.kubectl("create", "namespace", NAMESPACE)
        api = KubeApi(new_api_client(str(cluster.kubeconfig)))
        metrics = ControllerMetrics()
        controller = Controller(
            KubeApi(new_api_client(str(cluster.kubeconfig)), on_request=metrics.count_request),
            metrics=metrics,
            namespaces=[NAMESPACE],
            policy=DEMO_POLICY,
            identity="flexinfer-demo",
            # The local cluster's administrator allows the tiny model's temporary path
            # and the process node's taint (docs/security.md).
            render_settings=RenderSettings(policy=dev_policy()),
        ).start(sync_timeout=30)
        say("The flexinfer controller is running (demand window 20s, swap cooldown 5s).")
        with proxy_process(cluster) as proxy:
            say(f"The flexinfer proxy listens on {proxy} (OpenAI API).")
            say(f"Watch the card change hands: open {proxy}/ui in a browser.\n")
            _story(cluster, api, proxy, models, say)
            if keep:
                say(f"\nThe cluster keeps running: export KUBECONFIG={cluster.kubeconfig}")
                say(
                    f"  curl {proxy}/v1/chat/completions -H 'Content-Type: application/json' "
                    '-d \'{"model": "chat", "messages": '
                    '[{"role": "user", "content": "hi"}]}\''
                )
                # Started in the background, a process ignores SIGINT; either signal
                # stops the proxy and the cluster through the `finally` below (set
                # before saying so: a caller may signal as soon as it reads the line).
                for number in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(number, _interrupt)
                say("Press Ctrl-C (or send SIGTERM) to stop it.")
                while True:
                    time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if controller is not None:
            controller.stop()
        cluster.stop()
        for file in models.glob("*"):
            file.unlink()
        models.rmdir()
    say("\nDone: the control plane is stopped and its files removed.")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def proxy_process(
    cluster: LocalCluster,
    namespace: str = NAMESPACE,
    *,
    flags: tuple[str, ...] = ("--min-queue-wait", "2m"),
) -> Iterator[str]:
    """`python -m flexinfer_proxy` for `namespace` on a free loopback port (not 8000: that
    is the models' port on their own loopback addresses), resolving Services through the
    hosts file the process node keeps (this machine has no cluster DNS); yields its URL
    and stops it (SIGTERM, then SIGKILL) on the way out. The ETA benchmark uses it too."""
    process = subprocess.Popen(
        [
            sys.executable, "-m", "flexinfer_proxy",
            "--host", "127.0.0.1", "--port", "0",
            "--kubeconfig", str(cluster.kubeconfig),
            "--namespace", namespace,
            "--resolve-file", str(cluster.hosts_file),
            *flags,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=die_with_thread_hook(),  # killed outright, the demo takes it along
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    try:
        if not line.startswith("listening on 127.0.0.1:"):
            raise DemoError(f"the proxy did not start: {line!r}")
        yield f"http://127.0.0.1:{line.strip().rsplit(':', 1)[1]}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _story(
    cluster: LocalCluster, api: KubeApi, proxy: str, models: Path, say: Callable[[str], None]
) -> None:
    for seed, (name, priority) in enumerate((("chat", 100), ("coder", 200))):
        model_file = write_tiny_model(models / f"{name}.gguf", seed=seed, name=name)
        api.create(MODELS, NAMESPACE, _model(name, priority, model_file))
    _wait(lambda: _rendered(api), "the controller to render both Models")
    shown: set[tuple[str, int]] = set()  # events already told, by uid and count
    say(f"Two Models share the GPU group {GROUP!r}: chat (priority 100), coder (priority 200).")
    say("Each is a tiny random-weight GGUF; the controller rendered each into a llama.cpp")
    say("Deployment and Service (0 replicas until the election says otherwise):")
    table = cluster.kubectl("get", "deployments,services", "-n", NAMESPACE).stdout.rstrip()
    say("   " + table.replace("\n", "\n   "))
    say("")

    say("1. A request for chat arrives at the proxy (chat is not running: a cold start).")
    cold = _ask(proxy, "chat")
    say(f"   chat answered after {cold.first_token:.2f}s (cold: swapped in, loaded, first token):")
    say(f"     {cold.text!r}   (nonsense words: random weights)")
    warm = _ask(proxy, "chat")
    say(f"   asked again, the first token came after {warm.first_token:.3f}s (warm)")
    _show(cluster, api, say, shown)

    say("2. A request for coder (more important) arrives while chat is busy.")
    watch = PodWatch(api, NAMESPACE)  # from before the request: it sees every pod event
    try:
        coder = _ask(proxy, "coder")
        _wait(lambda: watch.created("coder"), "coder's pod")
    finally:
        watch.stop()
    say(f"   break-before-make: {watch.summary()}")
    say(f"   coder answered after {coder.first_token:.2f}s (cold): {coder.text!r}")
    _show(cluster, api, say, shown)

    say("3. A fine-tuning job takes a GPU lease on the group.")
    api.create(
        GPU_LEASES,
        NAMESPACE,
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "GPULease",
            "metadata": {"name": "finetune-gpu-lease"},
            "spec": {"group": GROUP, "owner": "qwen-finetune", "node": "process-node"},
        },
    )
    _wait(lambda: not _pods(api), "every model to be parked")
    _show(cluster, api, say, shown)

    say("4. The training job ends (lease deleted): coder, the last to serve, comes back")
    say("   by itself (it was asked for recently and outranks chat), and answers.")
    api.delete(GPU_LEASES, NAMESPACE, "finetune-gpu-lease")
    back = _ask(proxy, "coder")
    say(f"   coder answered after {back.first_token:.2f}s: {back.text!r}")
    _show(cluster, api, say, shown)


class Answer:
    def __init__(self, text: str, first_token: float) -> None:
        self.text = text
        self.first_token = first_token


def _ask(proxy: str, model: str, *, timeout: float = 180.0) -> Answer:
    """One streamed chat completion through the proxy: its text and the seconds from
    sending the request to the first token."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "tell me about GPUs"}],
            "max_tokens": 12,
            "stream": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"{proxy}/v1/chat/completions", data=body,
        headers={"Content-Type": "application/json"}, method="POST",
    )  # fmt: skip
    began = time.monotonic()
    first: float | None = None
    parts: list[str] = []
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                delta = json.loads(line.removeprefix("data:"))["choices"][0].get("delta") or {}
                if delta.get("content"):
                    first = first if first is not None else time.monotonic() - began
                    parts.append(str(delta["content"]))
    except urllib.error.HTTPError as error:
        raise DemoError(f"the proxy answered {error.code} for {model}: {error.read()!r}") from None
    if first is None:
        raise DemoError(f"{model} sent no tokens")
    return Answer("".join(parts).strip(), first)


def _model(name: str, priority: int, model_file: Path) -> JSON:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name},
        "spec": {
            "backend": "llama-cpp",
            "source": f"file://{model_file}",
            "gpu": {"shared": GROUP, "priority": priority, "swapCooldown": "5s"},
            "serverless": {"idleTimeout": "5m", "coldStartTimeout": "60s"},
            "serviceLabels": [name],
            "llamacpp": {"ctxSize": 256},
            # The process node runs it as a real llama-server on its own loopback address.
            "nodeSelector": dict(PROCESS_NODE_SELECTOR),
            "tolerations": [dict(PROCESS_NODE_TOLERATION)],
        },
    }


def _rendered(api: KubeApi) -> bool:
    statuses = [_status(api, name) for name in ("chat", "coder")]
    return all(s.get("endpoint") for s in statuses)


def _status(api: KubeApi, name: str) -> JSON:
    return dict(api.get(MODELS, NAMESPACE, name).get("status") or {})


def _serving(api: KubeApi, name: str) -> bool:
    status = _status(api, name)
    return status.get("phase") == "Ready" and (
        (status.get("sharedGroup") or {}).get("state") == "Active"
    )


def _pods(api: KubeApi) -> list[JSON]:
    return list(api.list(PODS, NAMESPACE).get("items") or [])


MODEL_LABEL = "ai.flexinfer/model"


class PodWatch:
    """Watches the namespace's model pods from the moment it is made, in the API server's
    order, and records any moment one model's pod was created while another's was alive.

    A watch that dies (an ERROR event, a dropped stream) is reported by `summary`, never
    read as "no overlap".
    """

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.live: dict[str, str] = {}  # pod -> model
        self.order: list[tuple[str, str]] = []  # (ADDED|DELETED, model)
        self.overlaps: list[str] = []
        self.error = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        listing = api.list(PODS, namespace)
        for pod in listing.get("items") or []:
            self._added(pod)
        self._version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name="demo-pod-watch", daemon=True)
        self._thread.start()

    def _model(self, pod: JSON) -> str:
        return str(((pod.get("metadata") or {}).get("labels") or {}).get(MODEL_LABEL) or "")

    def _added(self, pod: JSON) -> None:
        model, name = self._model(pod), str(pod["metadata"]["name"])
        if not model or name in self.live or pod_is_finished(pod):
            return
        others = sorted({m for m in self.live.values() if m != model})
        if others:
            self.overlaps.append(f"pod {name} of {model} created while {others} had pods")
        self.live[name] = model
        self.order.append(("ADDED", model))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for event in self.api.watch(
                    PODS,
                    self.namespace,
                    resource_version=self._version,
                    timeout_seconds=30,
                    on_open=self._opened,
                ):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise RuntimeError(f"pod watch error: {obj.get('message')}")
                    self._version = str(obj["metadata"].get("resourceVersion") or self._version)
                    with self._lock:
                        if event["type"] == "ADDED":
                            self._added(obj)
                        elif event["type"] == "DELETED" or pod_is_finished(obj):
                            # Succeeded or Failed: nothing runs, the device is free (the
                            # controller counts it so); its object may linger a moment.
                            model = self.live.pop(str(obj["metadata"]["name"]), None)
                            if model:
                                self.order.append(("DELETED", model))
        except Exception as error:  # the summary says the watch failed; nothing passes silently
            if not self._stop.is_set():
                self.error = f"{type(error).__name__}: {error}"

    def _opened(self, response: Any) -> None:
        self._response = response

    def created(self, model: str) -> bool:
        with self._lock:
            return ("ADDED", model) in self.order

    def stop(self) -> None:
        self._stop.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.shutdown()
        self._thread.join(5)

    @property
    def held(self) -> bool:
        """The watch ran to the end, saw the swap, and saw no overlap."""
        return not self.error and not self.overlaps and bool(self.order)

    def summary(self) -> str:
        if self.error:
            return f"the pod watch failed ({self.error}): nothing can be said"
        if self.overlaps:
            return "OVERLAP: " + "; ".join(self.overlaps)
        return (
            "chat's pod was gone before coder's pod was created (watched from before the request)"
        )


def _show(
    cluster: LocalCluster,
    api: KubeApi,
    say: Callable[[str], None],
    shown: set[tuple[str, int]],
) -> None:
    table = cluster.kubectl("get", "models", "-n", NAMESPACE).stdout.rstrip()
    say("   " + table.replace("\n", "\n   "))
    for name in ("chat", "coder"):
        conditions = {c.get("type"): c for c in _status(api, name).get("conditions") or []}
        active = conditions.get("Active") or {}
        say(f"   {name}: {active.get('reason', '-')}: {active.get('message', '')}")
    # The controller's events since the last act, oldest first (a second's resolution
    # cannot order them, so the last few by time could hide the one that matters).
    new = [
        e
        for e in api.list(EVENTS, NAMESPACE).get("items") or []
        if (e.get("source") or {}).get("component") == "flexinfer-controller"
        and (e["metadata"]["uid"], int(e.get("count") or 1)) not in shown
    ]
    new.sort(
        key=lambda e: (
            str(e.get("lastTimestamp") or e.get("eventTime") or ""),
            int(e["metadata"].get("resourceVersion") or 0),
        )
    )
    for event in new:
        shown.add((event["metadata"]["uid"], int(event.get("count") or 1)))
    for event in new[-8:]:
        say(
            f"   event {event.get('reason')} on {event['involvedObject']['name']}: "
            f"{event.get('message')}"
        )
    # The proxy sends a service label to the member whose status holds the card.
    models = [api.get(MODELS, NAMESPACE, name) for name in ("chat", "coder")]
    states = {
        name_of(m): (get_path(m, "status", "sharedGroup") or {}).get("state") for m in models
    }
    holders = sorted(card_holders(models))
    say(f"   sharedGroup.state: {states}; service labels go to: {holders}\n")


def _wait(probe: Callable[[], Any], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def _printer(out: TextIO) -> Callable[[str], None]:
    def say(text: str) -> None:
        print(text, file=out, flush=True)

    return say
