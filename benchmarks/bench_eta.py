"""How honest the proxy's wait estimate is, over real swaps (JSON out, never asserted).

Two tiny random-weight GGUF models (`flexinfer_devcluster.tinymodel`) share one GPU
group on the local cluster's process node, which runs each pod as a real
`llama-server`; the controller runs in this process, the proxy as `python -m
flexinfer_proxy`. Equal priorities, a short demand window (`--demand-window`) and
no swap cooldown: a request for the model that does not hold the card, sent once
the holder is idle, preempts it. Each swap is one streamed request for the other
model; its `x-flexinfer-wait-seconds` header is the estimate the proxy gave when it
queued it, and the actual wait is the time from sending it to the answer's head
(a streamed answer's head comes with its first event; `--wait-comment-interval` is
set long so no early head hides the wait).

Reported: per swap (model, how many of its swaps the proxy had measured before,
estimate, actual), and over the swaps made after a model had `--warmup` measured
swaps: the median and p90 of |estimate - actual| and the fraction within ±20 % of
the actual wait; plus the controller's `flexinfer_swap_seconds` and
`flexinfer_cold_start_seconds` and the proxy's `flexinfer_proxy_queue_wait_seconds`
and `flexinfer_proxy_time_to_first_byte_seconds` as scraped at the end.

Where a wait goes (`stages`): watches of the namespace's Pods and Models, in this
process, note when each step of a swap is seen (the holder's pod gone, the new pod
created, its server started, the pod Ready, the Model Ready); per swap the time of
each step from the request, and over the scored swaps each stage's median and
spread (p10, p90). `replayed`: what the median and the 90th percentile of each
model's last 20 waits would have told, scored the same way on the same swaps.

    python benchmarks/bench_eta.py [--swaps 100] [--warmup 5] [--demand-window 2s] [--busy N]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from flexinfer_cli import demo
from flexinfer_core import Policy
from flexinfer_core.durations import parse_duration
from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_devcluster.policy import dev_policy
from flexinfer_devcluster.processnode import PROCESS_NODE_SELECTOR, PROCESS_NODE_TOLERATION
from flexinfer_devcluster.tinymodel import write_tiny_model
from flexinfer_k8s.controller import Controller
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_k8s.pods import pod_is_ready
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_kube.informers import Informer, Store
from flexinfer_kube.kubeapi import JSON, KubeApi, new_api_client
from flexinfer_kube.objects import get_path
from flexinfer_kube.resources import MODELS, PODS
from flexinfer_proxy.swap_times import nearest_rank

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "bench-eta"
GROUP = "bench-gpu"
MODEL_NAMES = ("alpha", "beta")
HISTOGRAMS = (
    "flexinfer_swap_seconds",
    "flexinfer_cold_start_seconds",
    "flexinfer_proxy_queue_wait_seconds",
    "flexinfer_proxy_time_to_first_byte_seconds",
)


def model_manifest(name: str, model_file: Path) -> JSON:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name},
        "spec": {
            "backend": "llama-cpp",
            "source": f"file://{model_file}",
            "gpu": {"shared": GROUP, "priority": 100, "swapCooldown": "0s"},
            "serverless": {"idleTimeout": "10m", "coldStartTimeout": "120s"},
            "llamacpp": {"ctxSize": 256},
            "nodeSelector": dict(PROCESS_NODE_SELECTOR),
            "tolerations": [dict(PROCESS_NODE_TOLERATION)],
        },
    }


# The steps of a swap, in order, as the watches see them.
STEPS = ("holder gone", "pod created", "server started", "pod ready", "model ready")
MODEL_LABEL = "ai.flexinfer/model"


class Steps:
    """When (monotonic) each step of each model's swaps was seen by a watch."""

    def __init__(self, api: KubeApi) -> None:
        self._lock = threading.Lock()
        self._seen: list[tuple[float, str, str]] = []  # (when, model, step)
        self._informers = [
            Informer(api, resource, Store(resource), namespace=NAMESPACE, on_change=handler)
            for resource, handler in ((PODS, self._pod), (MODELS, self._model))
        ]

    def __enter__(self) -> Steps:
        for informer in self._informers:
            informer.start()
        for informer in self._informers:
            informer.synced.wait(30)
        return self

    def __exit__(self, *_: object) -> None:
        for informer in self._informers:
            informer.stop()

    def _note(self, model: object, step: str) -> None:
        if isinstance(model, str):
            with self._lock:
                self._seen.append((time.monotonic(), model, step))

    def _pod(self, old: JSON | None, new: JSON | None) -> None:
        if new is None:
            self._note(get_path(old, "metadata", "labels", MODEL_LABEL), "holder gone")
            return
        model = get_path(new, "metadata", "labels", MODEL_LABEL)
        if old is None:
            self._note(model, "pod created")
        if _running(new) and not (old is not None and _running(old)):
            self._note(model, "server started")
        if pod_is_ready(new) and not (old is not None and pod_is_ready(old)):
            self._note(model, "pod ready")

    def _model(self, old: JSON | None, new: JSON | None) -> None:
        if get_path(new, "status", "phase") == "Ready" != get_path(old, "status", "phase"):
            self._note(get_path(new, "metadata", "name"), "model ready")

    def of_swap(self, model: str, holder: str, began: float, ended: float) -> dict[str, float]:
        """Seconds from `began` to the first sighting of each step of the swap to `model`
        from `holder` before `ended` (the holder's pod gone, then the new one's steps)."""
        with self._lock:
            seen = list(self._seen)
        out: dict[str, float] = {}
        for when, name, step in seen:
            ours = name == (holder if step == "holder gone" else model)
            if ours and began <= when <= ended and step not in out:
                out[step] = round(when - began, 3)
        return out


def _running(pod: JSON) -> bool:
    return any(
        get_path(status, "state", "running")
        for status in get_path(pod, "status", "containerStatuses") or []
    )


def stage_spread(per_swap: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each stage (step to step, from the request to the answer's head) over `per_swap`:
    median, p10 and p90 seconds, over the swaps that saw both of its ends."""
    marks = ("request", *STEPS, "answer")
    out: dict[str, dict[str, float]] = {}
    for start, end in itertools.pairwise(marks):
        spans = []
        for swap in per_swap:
            at = {"request": 0.0, **swap["steps"], "answer": swap["actual"]}
            if start in at and end in at:
                spans.append(at[end] - at[start])
        if spans:
            out[f"{start} -> {end}"] = {
                "median": round(statistics.median(spans), 3),
                "p10": round(nearest_rank(spans, 0.1), 3),
                "p90": round(nearest_rank(spans, 0.9), 3),
            }
    return out


def replayed(swaps: list[dict[str, Any]], *, warmup: int, samples: int = 20) -> dict[str, Any]:
    """How each statistic the proxy could tell (the median, the 90th percentile) would
    have done on these very swaps: each scored swap's estimate from the client-side
    waits of its model's last `samples` swaps before it (the proxy's own measurements
    end when it lets the request go, a few milliseconds earlier)."""
    out: dict[str, Any] = {}
    for label, fraction in (("p50", 0.5), ("p90", 0.9)):
        within, errors = [], []
        for index, swap in enumerate(swaps):
            if swap["measured_before"] < warmup:
                continue
            before = [s["actual"] for s in swaps[:index] if s["model"] == swap["model"]]
            estimate = nearest_rank(before[-samples:], fraction)
            errors.append(abs(estimate - swap["actual"]))
            within.append(errors[-1] <= 0.2 * swap["actual"])
        if errors:
            out[label] = {
                "abs_error_median_s": round(statistics.median(errors), 3),
                "abs_error_p90_s": round(nearest_rank(errors, 0.9), 3),
                "within_20_percent": round(sum(within) / len(within), 3),
            }
    return out


def proxy_process(cluster: LocalCluster) -> contextlib.AbstractContextManager[str]:
    """The demo's proxy process, for this namespace, holding requests up to 3m and
    sending its waiting-stream comments only after a minute (none in these swaps)."""
    return demo.proxy_process(
        cluster, NAMESPACE, flags=("--min-queue-wait", "3m", "--wait-comment-interval", "60s")
    )


def ask(proxy: str, model: str) -> tuple[float, float, int, float]:
    """One streamed completion: (estimate, actual wait to the answer's head, position,
    when it was sent); the estimate is NaN when the request did not wait."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "stream": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"{proxy}/v1/chat/completions", data=body,
        headers={"Content-Type": "application/json"}, method="POST",
    )  # fmt: skip
    began = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as response:
        actual = time.monotonic() - began
        estimate = float(response.headers.get("x-flexinfer-wait-seconds") or "nan")
        position = int(response.headers.get("x-flexinfer-queue-position") or 0)
        response.read()
    return estimate, actual, position, began


def wait_for_models(proxy: str, *, timeout: float = 120.0) -> None:
    """Until the proxy lists both models (its first lists are in)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(f"{proxy}/v1/models", timeout=10) as response:
                listed = {m["id"] for m in json.load(response)["data"]}
            if listed >= set(MODEL_NAMES):
                return
        time.sleep(0.5)
    raise SystemExit("the proxy did not list the models")


def scrape(text: str) -> dict[str, dict[str, float]]:
    """The histogram lines of HISTOGRAMS, as {series: value} per histogram."""
    out: dict[str, dict[str, float]] = {name: {} for name in HISTOGRAMS}
    for line in text.splitlines():
        for name in HISTOGRAMS:
            if line.startswith(name + "_") and not line.startswith("#"):
                series, _, value = line.rpartition(" ")
                out[name][series] = float(value)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swaps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--demand-window", default="2s")
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        choices=range(0, 9),
        metavar="0..8",
        help="processes that spin a core each for the whole run (a busy machine)",
    )
    args = parser.parse_args()
    window = parse_duration(args.demand_window, field="--demand-window")
    policy = Policy(
        demand_window=window,
        recent_window=window,
        default_swap_cooldown=timedelta(0),
    )

    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)
    ]
    cluster = LocalCluster(nodes=(), name="flexinfer-bench-eta", process_node=True)
    cluster.start()
    controller: Controller | None = None
    models = Path(tempfile.mkdtemp(prefix="flexinfer-bench-eta-"))
    swaps: list[dict[str, Any]] = []
    try:
        cluster.install_crds(ROOT / "crds")
        cluster.kubectl("create", "namespace", NAMESPACE)
        api = KubeApi(new_api_client(str(cluster.kubeconfig)))
        metrics = ControllerMetrics()
        controller = Controller(
            KubeApi(new_api_client(str(cluster.kubeconfig)), on_request=metrics.count_request),
            metrics=metrics,
            namespaces=[NAMESPACE],
            policy=policy,
            identity="flexinfer-bench-eta",
            render_settings=RenderSettings(policy=dev_policy()),
        ).start(sync_timeout=30)
        for seed, name in enumerate(MODEL_NAMES):
            path = write_tiny_model(models / f"{name}.gguf", seed=seed, name=name)
            api.create(MODELS, NAMESPACE, model_manifest(name, path))
        with proxy_process(cluster) as proxy, Steps(api) as steps:
            wait_for_models(proxy)
            measured = dict.fromkeys(MODEL_NAMES, 0)
            for index in range(args.swaps + 1):  # the first is a cold start from nothing
                name = MODEL_NAMES[index % 2]
                estimate, actual, position, began = ask(proxy, name)
                if position:
                    holder = MODEL_NAMES[(index + 1) % 2]
                    swaps.append(
                        {
                            "model": name,
                            "measured_before": measured[name],
                            "estimate": estimate,
                            "actual": round(actual, 3),
                            "steps": steps.of_swap(name, holder, began, began + actual),
                        }
                    )
                    measured[name] += 1
                print(
                    f"swap {index}: {name} estimate {estimate:.1f}s actual {actual:.2f}s",
                    file=sys.stderr,
                )
                # Idle past the demand window, so the next request preempts it.
                time.sleep(window.total_seconds() + 0.5)
            with urllib.request.urlopen(f"{proxy}/metrics", timeout=30) as response:
                proxy_metrics = response.read().decode()
        controller_metrics = generate_latest(metrics.registry).decode()
    finally:
        if controller is not None:
            controller.stop()
        cluster.stop()
        for file in models.glob("*"):
            file.unlink()
        models.rmdir()
        for spinner in spinners:
            spinner.kill()
            spinner.wait()

    scored = [s for s in swaps if s["measured_before"] >= args.warmup]
    errors = [abs(s["estimate"] - s["actual"]) for s in scored]
    within = [abs(s["estimate"] - s["actual"]) <= 0.2 * s["actual"] for s in scored]
    histograms = scrape(controller_metrics) | {k: v for k, v in scrape(proxy_metrics).items() if v}
    print(
        json.dumps(
            {
                "swaps": len(swaps),
                "warmup": args.warmup,
                "demand_window": args.demand_window,
                "busy": args.busy,
                "scored": len(scored),
                "abs_error_median_s": round(statistics.median(errors), 3) if errors else None,
                "abs_error_p90_s": round(nearest_rank(errors, 0.9), 3) if errors else None,
                "within_20_percent": round(sum(within) / len(within), 3) if within else None,
                "actual_median_s": (
                    round(statistics.median(s["actual"] for s in scored), 3) if scored else None
                ),
                "replayed": replayed(swaps, warmup=args.warmup),
                "stages": stage_spread(scored),
                "histograms": histograms,
                "per_swap": swaps,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
