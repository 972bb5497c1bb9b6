"""Benchmark: how fast the controller turns demand into a swap, on a real control plane.

Two Models share a group (equal priority, no cooldown, a 1 s demand window so the
leader goes idle quickly); each round writes `lastActiveTime` on the parked one, as
the proxy would, and times from watches:

- demand -> scale-down: from just before the `lastActiveTime` PATCH to the old
  holder's Deployment showing `spec.replicas: 0`;
- pods gone -> scale-up: from the old holder's last pod DELETED event to the new
  holder's Deployment showing `spec.replicas: 1`;
- API writes per swap: the controller's own non-GET requests per round, and the same
  writes by kind from the API server's audit log (`verb resource/subresource`, a
  Model's status told apart by whose: the old holder's, the new holder's).

The controller runs in-process against a `LocalCluster`; pods load and terminate in
0.2 s (kwok). Prints one JSON object. Timings are never asserted anywhere.

    .venv/bin/python benchmarks/bench_controller.py --swaps 50

`--gpugroup Graceful|Immediate` counts a GPUGroup's writes instead: two ModelDeployments
in one group, each round queueing a request for the parked one (its demand annotation)
and none for the other; the writes by kind, a ModelDeployment's status by whose it is.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flexinfer_core import Policy  # noqa: E402
from flexinfer_core.timestamps import format_rfc3339  # noqa: E402
from flexinfer_devcluster.localcluster import LocalCluster  # noqa: E402
from flexinfer_kube.kubeapi import KubeApi, Transient  # noqa: E402
from flexinfer_kube.resources import (  # noqa: E402
    DEPLOYMENTS,
    GPU_GROUPS,
    MODEL_DEPLOYMENTS,
    PODS,
    Resource,
)
from tests.k8s.harness import Cluster, controller, controller_writes, on_kwok  # noqa: E402
from tests.polling import wait_until  # noqa: E402

NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
POLICY = Policy(
    demand_window=timedelta(seconds=1),
    recent_window=timedelta(seconds=1.5),
    default_swap_cooldown=timedelta(0),
)


class Recorder:
    """Watch one resource in a namespace; keep (monotonic time, type, object)."""

    def __init__(self, api: KubeApi, resource: Resource, namespace: str) -> None:
        self.api = api
        self.resource = resource
        self.namespace = namespace
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.listeners: list[Any] = []
        """Called with (time, type, object) in the watch thread for every event, after it
        is recorded: what a driver waits on without scanning `events`."""
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._response: Any = None
        listing = api.list(resource, namespace)
        self._version = str(listing["metadata"]["resourceVersion"])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self.api.watch(
                    self.resource, self.namespace, resource_version=self._version,
                    timeout_seconds=60, on_open=self._opened,
                ):
                    stamp = time.monotonic()
                    obj = event["object"]
                    self._version = obj["metadata"].get("resourceVersion", self._version)
                    with self.cond:
                        self.events.append((stamp, event["type"], obj))
                        self.cond.notify_all()
                    for listener in self.listeners:
                        listener(stamp, event["type"], obj)
            except Transient:
                if self._stop.wait(0.2):
                    return

    def _opened(self, response: Any) -> None:
        self._response = response

    def wait_for(self, predicate: Any, *, after: float, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for stamp, kind, obj in self.events:
                    if stamp >= after and predicate(kind, obj):
                        return stamp
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no matching {self.resource.plural} event")
                self.cond.wait(remaining)

    def stop(self) -> None:
        self._stop.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.shutdown()


def replicas_are(name: str, value: int) -> Any:
    def check(kind: str, obj: dict[str, Any]) -> bool:
        return bool(
            kind == "MODIFIED"
            and obj["metadata"]["name"] == name
            and obj["spec"].get("replicas") == value
        )

    return check


def pod_gone(app: str) -> Any:
    def check(kind: str, obj: dict[str, Any]) -> bool:
        labels = obj["metadata"].get("labels") or {}
        return kind == "DELETED" and labels.get("ai.flexinfer/model") == app

    return check


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(max(values), 1),
        "mean": round(statistics.fmean(values), 1),
    }


def writes_by_kind(
    local: LocalCluster,
    namespace: str,
    rounds: list[tuple[str, str, str]],
    *,
    end: str,
    members: str = "models",
) -> Counter[str]:
    """The controller's successful writes of every round, by `verb resource/subresource`;
    a member's status (`members`: the members' resource, Models or a GPUGroup's
    ModelDeployments) by whose it is in its round (old or new holder)."""
    counted: Counter[str] = Counter()
    for when, _, what, code in controller_writes(
        local, namespace, since=datetime.fromisoformat(rounds[0][0])
    ):
        stamp = datetime.fromisoformat(when.replace("Z", "+00:00"))
        if code >= 300 or stamp > datetime.fromisoformat(end):
            continue
        _, old, new = [r for r in rounds if datetime.fromisoformat(r[0]) <= stamp][-1]
        verb, path = what.split(" ", 1)
        resource, _, rest = path.partition("/")
        name, _, subresource = rest.partition("/")
        kind = f"{verb} {resource}/{subresource}" if subresource else f"{verb} {resource}"
        if kind.endswith(f" {members}/status"):
            kind += {old: " (old holder)", new: " (new holder)"}.get(name, f" ({name})")
        counted[kind] += 1
    return counted


@contextlib.contextmanager
def bench_cluster() -> Iterator[tuple[LocalCluster, str, Cluster]]:
    """A started local cluster with an audit log, the CRDs and the namespace `bench`;
    stopped on the way out."""
    local = LocalCluster(name="flexinfer-bench-controller", audit=True)
    local.start()
    try:
        local.kubectl("apply", "--server-side", "-k", str(ROOT / "crds"))
        local.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        namespace = "bench"
        admin = KubeApi(local.new_api_client())
        admin.create(NAMESPACES, "", {"metadata": {"name": namespace}})
        yield local, namespace, Cluster(local, namespace)
    finally:
        local.stop()


def run(swaps: int) -> dict[str, Any]:
    with bench_cluster() as (local, namespace, c):
        for name in ("x", "y"):
            c.add_model(name, swap_cooldown="0s", idle_timeout="10m",
                        ready_delay="200ms", terminate_delay="200ms")
        deployments = Recorder(c.api, DEPLOYMENTS, namespace)
        pods = Recorder(c.api, PODS, namespace)
        down: list[float] = []
        up: list[float] = []
        writes: list[float] = []
        rounds: list[tuple[str, str, str]] = []  # (started, old holder, new holder)
        c.demand("x")
        with controller(local, namespace, policy=POLICY) as ctl:
            c.wait_serving("x")
            leader, other = "x", "y"
            for _ in range(swaps):
                time.sleep(POLICY.demand_window.total_seconds() + 0.1)  # leader idle
                before = ctl.writes()
                rounds.append((datetime.now(UTC).isoformat(), leader, other))
                start = time.monotonic()
                c.demand(other)
                scaled_down = deployments.wait_for(replicas_are(leader, 0), after=start)
                gone = pods.wait_for(pod_gone(leader), after=scaled_down)
                scaled_up = deployments.wait_for(replicas_are(other, 1), after=gone)
                c.wait_serving(other)
                ctl.controller.wait_idle()
                writes.append(ctl.writes() - before)
                down.append((scaled_down - start) * 1000)
                up.append((scaled_up - gone) * 1000)
                leader, other = other, leader
            end = datetime.now(UTC).isoformat()
        deployments.stop()
        pods.stop()
        kinds = writes_by_kind(local, namespace, rounds, end=end)
        return {
            "benchmark": "controller_swap_latency",
            "swaps": swaps,
            "demand_to_scale_down_ms": summary(down),
            "pods_gone_to_scale_up_ms": summary(up),
            "api_writes_per_swap": {
                "mean": round(statistics.fmean(writes), 2),
                "min": min(writes),
                "max": max(writes),
                "by_kind": {k: round(v / swaps, 2) for k, v in kinds.most_common()},
            },
            "setup": {
                "pod_ready_delay": "200ms",
                "pod_terminate_delay": "200ms",
                "demand_window": "1s",
                "controller": "in-process, 2 workers",
            },
        }


def gpu_group_writes(
    local: LocalCluster, namespace: str, rounds: list[tuple[str, str, str]], *, end: str
) -> Counter[str]:
    """`writes_by_kind` for a GPUGroup's swaps: a ModelDeployment's status by whose it
    is in its round (old or new holder)."""
    return writes_by_kind(local, namespace, rounds, end=end, members="modeldeployments")


def run_gpu_group(swaps: int, *, policy: str) -> dict[str, Any]:
    """Two ModelDeployments in one GPUGroup (threshold 1, no hysteresis, minimum run or
    cooldown); each round queues one request for the parked member and none for the
    other, as the proxy's demand annotations would, and waits until it serves."""
    with bench_cluster() as (local, namespace, c):
        for name in ("m1", "m2"):
            c.api.create(MODEL_DEPLOYMENTS, namespace, {
                "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
                "metadata": {"name": name},
                "spec": {"backend": "vllm", "model": f"test/{name}", "idleTimeoutSeconds": 300,
                         "gpuGroupRef": "gg",
                         **on_kwok(ready_delay="200ms", terminate_delay="200ms")},
            })
        c.api.create(GPU_GROUPS, namespace, {
            "apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
            "metadata": {"name": "gg"},
            "spec": {
                "models": [{"name": "m1", "priority": 100}, {"name": "m2", "priority": 100}],
                "scalingPolicy": {"preemptionPolicy": policy, "drainTimeoutSeconds": 60},
                "antiThrashing": {"enabled": True, "requestQueueThreshold": 1,
                                  "hysteresisWindowSeconds": 0, "minimumRunDurationSeconds": 0,
                                  "cooldownAfterPreemptionSeconds": 0},
            },
        })

        def ask(member: str, other: str) -> None:
            stamp = format_rfc3339(datetime.now(UTC).replace(microsecond=0))
            demand = {"queued": 1, "oldestWaiting": stamp, "reportedAt": stamp}
            c.api.patch(GPU_GROUPS, namespace, "gg", {"metadata": {"annotations": {
                f"demand.ai.flexinfer/{member}": json.dumps(demand),
                f"demand.ai.flexinfer/{other}": None,
            }}})

        def serving(member: str) -> bool:
            status = c.api.get(GPU_GROUPS, namespace, "gg").get("status") or {}
            md = c.api.get(MODEL_DEPLOYMENTS, namespace, member).get("status") or {}
            return (status.get("activeModel") == member and status.get("phase") == "Active"
                    and md.get("phase") == "Running")

        def gone(member: str) -> bool:
            return not c.pods(member)

        rounds: list[tuple[str, str, str]] = []
        with controller(local, namespace, policy=POLICY) as ctl:
            ask("m1", "m2")
            wait_until(lambda: serving("m1"), what="m1 serving")
            ctl.controller.wait_idle()
            leader, other = "m1", "m2"
            for _ in range(swaps):
                rounds.append((datetime.now(UTC).isoformat(), leader, other))
                ask(other, leader)
                wait_until(functools.partial(serving, other), what=f"{other} serving")
                wait_until(functools.partial(gone, leader), what=f"{leader}'s pods gone")
                ctl.controller.wait_idle()
                leader, other = other, leader
            end = datetime.now(UTC).isoformat()
        kinds = gpu_group_writes(local, namespace, rounds, end=end)
        return {
            "benchmark": "controller_gpugroup_swap_writes",
            "swaps": swaps,
            "preemption_policy": policy,
            "api_writes_per_swap": {
                "total": round(sum(kinds.values()) / swaps, 2),
                "by_kind": {k: round(v / swaps, 2) for k, v in kinds.most_common()},
            },
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swaps", type=int, default=50)
    parser.add_argument("--gpugroup", choices=("Graceful", "Immediate"), default=None,
                        help="count a GPUGroup's writes a swap instead (its preemption "
                        "policy); no timings")
    args = parser.parse_args()
    if args.gpugroup:
        print(json.dumps(run_gpu_group(args.swaps, policy=args.gpugroup), indent=2))
        return
    print(json.dumps(run(args.swaps), indent=2))


if __name__ == "__main__":
    main()
