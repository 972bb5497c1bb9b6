"""Benchmark: many groups swapping at once, on a real control plane.

`--groups` shared groups of `--per-group` Models each (1,000 Models in 200 groups by
default), rendered by the controller (a `python -m flexinfer_k8s` process with
`--workers`, the default 2m demand window); every group's first member is asked for
and becomes Ready; then the second member, more important, of `--swapping` groups (100
by default) is asked for at the same moment, as a proxy would, and preempts it.

`--driver ideal` measures the floor instead: the same cluster, Models, Deployments and
first members (rendered and started by the controller), then the controller is
stopped and a minimal driver in this process does only what a swap cannot do without,
for every swapping group at once: the same demand write, the old holder's Deployment
scaled to 0, its pod's DELETED event awaited on a watch, the new holder's Deployment
scaled to 1, its pod's Ready awaited on a watch (no decision, no status, no Event, no
check of the pods by a list). What the cluster itself gives on this machine.

From watches on Models, Deployments and Pods, per swapping group (the `stages_ms`):

- demand -> decision (flexinfer): the demand PATCH to the old holder's status naming
  the challenger in `preemptedBy` (the handover's record, written first);
- decision -> scale-down: to the old holder's Deployment at `replicas: 0` (the ideal
  driver: demand -> scale-down);
- scale-down -> terminating -> pods gone: the Deployment and ReplicaSet controllers
  marking its pod deleted, then kwok removing it (`pod_terminate_delay` after);
- pods gone -> scale-up: to the challenger's Deployment at `replicas: 1`;
- scale-up -> pod created -> scheduled -> running -> Ready: the ReplicaSet controller,
  the scheduler, kwok starting it, kwok making it Ready (`--load-time` after);
- pod Ready -> Model Ready (flexinfer): the controller noticing and writing it;
- demand -> pod Ready: the swap as the cluster runs it, comparable between drivers;
  demand -> new Model Ready (flexinfer): the whole swap, as the proxy sees it.

With flexinfer, the controller's own log (at debug: one line per reconcile with its
time in the queue and its length) splits its two steps further (`controller_ms`):
when the key was first queued after the demand (the watch event seen) and picked by
a worker, and the same for the reconcile that scales the new holder up after the old
pod went.

The local cluster's controller manager and scheduler run with their client QPS raised
(`--cluster-qps`) so the cluster is not what is measured. `--settle` seconds pass
between the last first member turning Ready and the burst. Prints one JSON object;
timings are never asserted anywhere.

    .venv/bin/python benchmarks/bench_scale.py --groups 200 --per-group 5 --swapping 100
    .venv/bin/python benchmarks/bench_scale.py --swapping 100 --driver ideal
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_controller import Recorder, percentile  # noqa: E402
from flexinfer_devcluster.localcluster import KwokNode, LocalCluster  # noqa: E402
from flexinfer_kube.kubeapi import KubeApi, new_api_client  # noqa: E402
from flexinfer_kube.resources import DEPLOYMENTS, MODELS, PODS, Resource  # noqa: E402
from tests.k8s import harness  # noqa: E402
from tests.k8s.harness import Cluster, ControllerProcess, model_body, now_text  # noqa: E402

NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NAMESPACE = "scale"
MODEL_LABEL = "ai.flexinfer/model"
IDEAL_AGENT = "flexinfer-bench-ideal"
Event = tuple[float, str, dict[str, Any]]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50)),
        "p99": round(percentile(values, 99)),
        "max": round(max(values)),
        "mean": round(statistics.fmean(values)),
    }


PARTIES = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok",
           "flexinfer_k8s")


def cpu_seconds(marker: str) -> dict[str, float]:
    """User + system CPU seconds so far of each party's processes (from /proc), so the
    burst's CPU can be split between the cluster and the controller; only processes
    whose command line names `marker` (this cluster's directory: another cluster on the
    machine is not ours), this benchmark's own process (`bench`: its watches, and the
    ideal driver), and the whole machine's busy time (`machine`)."""
    tick = os.sysconf("SC_CLK_TCK")
    totals = dict.fromkeys(PARTIES, 0.0)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if marker.encode() not in b" ".join(argv):
            continue
        words = [Path(a.decode(errors="replace")).name for a in argv[:3]]
        for party in PARTIES:
            if party in words:
                totals[party] += (int(fields[11]) + int(fields[12])) / tick
                break
    own = resource.getrusage(resource.RUSAGE_SELF)
    totals["bench"] = own.ru_utime + own.ru_stime
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    jiffies = [int(x) for x in Path("/proc/stat").read_text().split()[1:9]]
    totals["machine"] = (sum(jiffies) - jiffies[3] - jiffies[4]) / tick
    return totals


def member(group: int, index: int) -> str:
    return f"g{group:03d}-m{index}"


def first_event(events: list[Event], after: float, test: Any) -> float:
    for stamp, kind, obj in events:
        if kind != "BOOKMARK" and stamp >= after and test(kind, obj):
            return stamp
    raise LookupError("no such event")


def model_of(obj: dict[str, Any]) -> str:
    return str((obj["metadata"].get("labels") or {}).get(MODEL_LABEL) or "")


def pod_ready(obj: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


class Latches:
    """One `threading.Event` per name, set by a watch listener when `test` holds for
    an event of that name: what the ideal driver waits on."""

    def __init__(self, names: list[str], name_of: Callable[[dict[str, Any]], str],
                 test: Callable[[str, dict[str, Any]], bool]) -> None:
        self.latches = {name: threading.Event() for name in names}
        self._name_of = name_of
        self._test = test

    def __call__(self, stamp: float, kind: str, obj: dict[str, Any]) -> None:
        if kind == "BOOKMARK":
            return
        latch = self.latches.get(self._name_of(obj))
        if latch is not None and not latch.is_set() and self._test(kind, obj):
            latch.set()

    def wait(self, name: str, timeout: float) -> None:
        if not self.latches[name].wait(timeout):
            raise TimeoutError(f"{name}: nothing seen within {timeout} s")


def ideal_burst(local: LocalCluster, swapping: list[int], pods: Recorder,
                timeout: float) -> dict[int, float]:
    """The floor's driver: every swap at once, each only its unavoidable steps; returns
    when each swap started (before its demand write)."""
    # A connection per swap, opened before the burst: the driver is not to wait for one.
    # The demand goes out as in the other run, from a client that is not the driver's.
    api = KubeApi(new_api_client(str(local.kubeconfig), pool_size=len(swapping) + 4,
                                 user_agent=IDEAL_AGENT))
    proxy = KubeApi(new_api_client(str(local.kubeconfig), pool_size=len(swapping) + 4))
    old = [member(g, 0) for g in swapping]
    new = [member(g, 1) for g in swapping]
    gone = Latches(old, model_of, lambda kind, obj: kind == "DELETED")
    ready = Latches(new, model_of, lambda kind, obj: kind != "DELETED" and pod_ready(obj))
    pods.listeners += [gone, ready]
    start = threading.Barrier(len(swapping))

    def swap(g: int) -> float:
        api.get(DEPLOYMENTS, NAMESPACE, member(g, 0))
        proxy.get(MODELS, NAMESPACE, member(g, 1))
        start.wait()
        began = time.monotonic()
        proxy.patch(MODELS, NAMESPACE, member(g, 1), {"status": {"lastActiveTime": now_text()}},
                  subresource="status")  # the proxy's demand, as in the other run
        api.patch(DEPLOYMENTS, NAMESPACE, member(g, 0), {"spec": {"replicas": 0}},
                  subresource="scale")
        gone.wait(member(g, 0), timeout)
        api.patch(DEPLOYMENTS, NAMESPACE, member(g, 1), {"spec": {"replicas": 1}},
                  subresource="scale")
        ready.wait(member(g, 1), timeout)
        return began

    with ThreadPoolExecutor(len(swapping)) as pool:
        return dict(zip(swapping, pool.map(swap, swapping), strict=True))


Reconcile = tuple[float, float, float, bool]


def controller_reconciles(log_path: Path, offset: float) -> dict[str, list[Reconcile]]:
    """The controller's reconciles of shared groups from its debug log, by group:
    (queued, picked, ended, wrote) in this process's monotonic time (`offset`: wall
    clock minus monotonic clock)."""
    found: dict[str, list[Reconcile]] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("msg") != "reconciled":
            continue
        kind, _, group = entry["key"]
        if kind != "shared":
            continue
        ended = datetime.fromisoformat(entry["ts"]).timestamp() - offset
        picked = ended - entry["took_ms"] / 1000
        queued = picked - entry["waited_ms"] / 1000
        found.setdefault(group, []).append((queued, picked, ended, bool(entry["wrote"])))
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    ideal = args.driver == "ideal"
    gpus_per_node = 64
    nodes = tuple(
        KwokNode(name=f"kwok-gpu-{i}", gpus=gpus_per_node, pods=max(110, gpus_per_node * 3))
        for i in range(-(-args.groups // gpus_per_node))
    )
    syncs = (
        {"kube-controller-manager": [f"--concurrent-deployment-syncs={args.cluster_syncs}",
                                     f"--concurrent-replicaset-syncs={args.cluster_syncs}"]}
        if args.cluster_syncs else {})
    local = LocalCluster(nodes=nodes, name="flexinfer-bench-scale", client_qps=args.cluster_qps,
                         audit=args.audit, extra_args=syncs)
    local.start()
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    controller: ControllerProcess | None = None
    try:
        local.install_crds(ROOT / "crds")
        admin = KubeApi(local.new_api_client())
        admin.create(NAMESPACES, "", {"metadata": {"name": NAMESPACE}})
        c = Cluster(local, NAMESPACE)
        names = [(g, i) for g in range(args.groups) for i in range(args.per_group)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda gi: c.api.create(MODELS, NAMESPACE, model_body(
                member(*gi), group=f"g{gi[0]:03d}", swap_cooldown="0s", idle_timeout="10m",
                priority=100 + 100 * gi[1], ready_delay=args.load_time,
                terminate_delay="200ms")), names))
        created = time.monotonic()
        controller_log = work / "controller.log"
        if args.controller_from:  # another checkout's controller (e.g. main's, to compare)
            harness.ROOT = Path(args.controller_from).resolve()
        controller = ControllerProcess(
            local, NAMESPACE, log=controller_log,
            extra=("--workers", str(args.workers), "--demand-window", "2m",
                   "--recent-window", "5m", "--default-swap-cooldown", "0s",
                   # its line per reconcile; another checkout's may not have it
                   "--log-level", "info" if args.controller_from else "debug"),
        )
        models = Recorder(c.api, MODELS, NAMESPACE)
        deployments = Recorder(c.api, DEPLOYMENTS, NAMESPACE)
        pods = Recorder(c.api, PODS, NAMESPACE)

        def demand(name: str) -> float:
            stamp = time.monotonic()
            c.demand(name, now_text())
            return stamp

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda g: demand(member(g, 0)), range(args.groups)))
        def not_ready(index: int) -> list[str]:
            listing = c.api.list(MODELS, NAMESPACE).get("items") or []
            ready = {m["metadata"]["name"] for m in listing
                     if (m.get("status") or {}).get("phase") == "Ready"}
            return [member(g, index) for g in range(args.groups) if member(g, index) not in ready]

        deadline = time.monotonic() + args.timeout
        asked_at = time.monotonic()
        while waiting := not_ready(0):  # every group serves its first member before the burst
            if time.monotonic() > deadline:
                raise TimeoutError("the first members did not all become Ready")
            if time.monotonic() - asked_at > 60:
                # As the proxy does for a request still waiting: ask again, so a slow
                # start (1,000 Models to render on a busy machine) never outlasts the
                # demand window.
                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(demand, waiting))
                asked_at = time.monotonic()
            time.sleep(1)
        warm = time.monotonic() - created
        if ideal:  # the floor: nothing of flexinfer's runs during the burst
            controller.kill()
            controller = None
        time.sleep(args.settle)

        swapping = list(range(args.swapping))
        load_before = os.getloadavg()
        burst_wall = datetime.now(UTC)
        offset = time.time() - time.monotonic()
        marker = str(local.workdir)
        profiler = None
        if args.py_spy and controller is not None:  # the controller's stacks in the burst
            profiler = subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "--pid",
                 str(controller.popen.pid), "--nonblocking", "--idle", "--threads", "--rate", "100",
                 "--format", "raw",
                 "--output", args.py_spy], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)  # attached
        cpu_before, burst_start = cpu_seconds(marker), time.monotonic()
        if ideal:
            asked = ideal_burst(local, swapping, pods, args.timeout)
        else:
            with ThreadPoolExecutor(32) as pool:
                asked = dict(zip(swapping, pool.map(lambda g: demand(member(g, 1)), swapping),
                                 strict=True))
            deadline = time.monotonic() + args.timeout
            while True:  # from the watch, so the benchmark does not LIST 1,000 Models per poll
                with models.cond:
                    ready = {o["metadata"]["name"] for _, _, o in models.events
                             if (o.get("status") or {}).get("phase") == "Ready"}
                done = sum(1 for g in swapping if member(g, 1) in ready)
                if done == len(swapping):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {done} of {len(swapping)} swaps finished")
                time.sleep(0.5)
        burst_seconds = time.monotonic() - burst_start
        cpu_after = cpu_seconds(marker)
        load_after = os.getloadavg()
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(60)
        time.sleep(1)  # let the watches deliver the last events
        for recorder in (models, deployments, pods):
            recorder.stop()
        reconciles = {} if ideal else controller_reconciles(controller_log, offset)

        stages: dict[str, list[float]] = {}
        ours: dict[str, list[float]] = {}
        counts: list[int] = []  # reconciles of a swapping group, demand to new Ready

        def note(into: dict[str, list[float]], name: str, seconds: float) -> None:
            into.setdefault(name, []).append(seconds * 1000)

        for g in swapping:
            old, new, start = member(g, 0), member(g, 1), asked[g]
            t_down = first_event(deployments.events, start, lambda k, o, n=old: (
                o["metadata"]["name"] == n and o["spec"].get("replicas") == 0))
            t_terminating = first_event(pods.events, t_down, lambda k, o, n=old: (
                model_of(o) == n and bool(o["metadata"].get("deletionTimestamp"))))
            t_gone = first_event(pods.events, t_terminating, lambda k, o, n=old: (
                k == "DELETED" and model_of(o) == n))
            t_up = first_event(deployments.events, t_gone, lambda k, o, n=new: (
                o["metadata"]["name"] == n and o["spec"].get("replicas") == 1))
            t_created = first_event(pods.events, t_up, lambda k, o, n=new: (
                k == "ADDED" and model_of(o) == n))
            t_scheduled = first_event(pods.events, t_created, lambda k, o, n=new: (
                model_of(o) == n and bool(o["spec"].get("nodeName"))))
            t_running = first_event(pods.events, t_scheduled, lambda k, o, n=new: (
                model_of(o) == n and (o.get("status") or {}).get("phase") == "Running"))
            t_pod_ready = first_event(pods.events, t_running, lambda k, o, n=new: (
                model_of(o) == n and pod_ready(o)))
            # The demand as a watch of Models delivers it (here, to this process).
            t_demand = first_event(models.events, start, lambda k, o, n=new: (
                o["metadata"]["name"] == n))
            note(stages, "demand_to_watched", t_demand - start)
            if ideal:
                note(stages, "demand_to_scale_down", t_down - start)
            else:
                t_decided = first_event(models.events, start, lambda k, o, n=old, by=new: (
                    o["metadata"]["name"] == n
                    and (o.get("status") or {}).get("sharedGroup", {}).get("preemptedBy") == by))
                note(stages, "demand_to_decision", t_decided - start)
                note(stages, "decision_to_scale_down", t_down - t_decided)
            note(stages, "scale_down_to_terminating", t_terminating - t_down)
            note(stages, "terminating_to_pods_gone", t_gone - t_terminating)
            note(stages, "pods_gone_to_scale_up", t_up - t_gone)
            note(stages, "scale_up_to_pod_created", t_created - t_up)
            note(stages, "pod_created_to_scheduled", t_scheduled - t_created)
            note(stages, "scheduled_to_running", t_running - t_scheduled)
            note(stages, "running_to_pod_ready", t_pod_ready - t_running)
            note(stages, "demand_to_pod_ready", t_pod_ready - start)
            if ideal:
                continue
            t_ready = first_event(models.events, t_up, lambda k, o, n=new: (
                o["metadata"]["name"] == n and (o.get("status") or {}).get("phase") == "Ready"))
            note(stages, "pod_ready_to_model_ready", t_ready - t_pod_ready)
            note(stages, "demand_to_new_model_ready", t_ready - start)
            # The controller's reconciles of the group: the first that ended after the
            # demand and wrote (the decision), the first that ended after the old pod
            # was gone and wrote (the scale-up).
            runs = reconciles.get(f"g{g:03d}", [])
            decision = next((r for r in runs if r[2] >= start and r[3]), None)
            scale_up = next((r for r in runs if r[2] >= t_gone and r[3]), None)
            if decision is not None:
                queued, picked, ended, _ = decision
                note(ours, "demand_to_queued", max(queued, start) - start)
                note(ours, "queued_to_picked", picked - max(queued, start))
                note(ours, "decision_reconcile", ended - picked)
            if scale_up is not None:
                queued, picked, ended, _ = scale_up
                note(ours, "pods_gone_to_picked", picked - t_gone)
                note(ours, "pods_gone_to_queued", max(queued, t_gone) - t_gone)
                note(ours, "scale_up_reconcile", ended - picked)
            counts.append(sum(1 for r in runs if start <= r[2] <= t_ready))
        writes: dict[str, float] = {}
        if args.audit:  # the driver's writes during the burst, per swap
            agent = IDEAL_AGENT if ideal else "flexinfer-controller"
            counted: Counter[str] = Counter()
            roles = {member(g, 0): "old holder" for g in swapping}
            roles |= {member(g, 1): "new holder" for g in swapping}
            for event in local.audit_events():
                if not str(event.get("userAgent", "")).startswith(agent):
                    continue
                stamp = datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00"))
                if stamp < burst_wall:
                    continue
                ref = event.get("objectRef") or {}
                what = "/".join(x for x in (ref.get("resource"), ref.get("subresource")) if x)
                if what == "models/status":  # whose: a swap's two holders, or a bystander
                    what += f" ({roles.get(str(ref.get('name')), 'other member')})"
                code = int((event.get("responseStatus") or {}).get("code") or 0)
                failed = f", failed {code}" if code >= 300 else ""  # a 409 retried, ...
                counted[f"{event['verb']} {what}{failed}"] += 1
            writes = {k: round(v / len(swapping), 2) for k, v in counted.most_common()}
            writes["total"] = round(sum(counted.values()) / len(swapping), 2)
        result: dict[str, Any] = {
            "benchmark": "controller_burst_swaps",
            "driver": args.driver,
            "models": len(names),
            "groups": args.groups,
            "swapping_at_once": args.swapping,
            "workers": None if ideal else args.workers,
            "load_time": args.load_time,
            "first_members_ready_after_s": round(warm, 1),
            "load_average_1m": [round(load_before[0], 2), round(load_after[0], 2)],
            "stages_ms": {name: summary(values) for name, values in stages.items()},
        }
        if reconciles:  # the controller's own log said (not the ideal driver, not main's)
            result["controller_ms"] = {name: summary(values) for name, values in ours.items()}
            result["reconciles_per_swap"] = {
                "p50": percentile(counts, 50), "max": max(counts),
                "mean": round(statistics.fmean(counts), 1)}
        if args.audit:
            result["driver_writes_per_swap"] = writes
        result |= {
            "burst_s": round(burst_seconds, 1),
            "burst_cpu_s": {p: round(cpu_after[p] - cpu_before[p], 1) for p in cpu_after},
            "setup": {
                "cluster_client_qps": args.cluster_qps,
                "controller_manager_syncs": args.cluster_syncs or "default (5)",
                "pod_terminate_delay": "200ms",
                "settle_s": args.settle,
                "driver": "the ideal driver in this process (the controller stopped)" if ideal
                else f"python -m flexinfer_k8s, {args.workers} workers",
                "controller_from": args.controller_from or "this checkout",
            },
        }
        return result
    finally:
        if controller is not None:
            controller.kill()
        local.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--per-group", type=int, default=5)
    parser.add_argument("--swapping", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--load-time", default="1s")
    parser.add_argument("--cluster-qps", type=int, default=500)
    parser.add_argument("--cluster-syncs", type=int, default=0,
                        help="the controller manager's Deployment and ReplicaSet workers "
                        "(--concurrent-*-syncs; 0: its default, 5 each)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds between the first members all Ready and the burst")
    parser.add_argument("--driver", choices=("flexinfer", "ideal"), default="flexinfer",
                        help="who swaps: the controller, or the floor's minimal driver "
                        "(the controller stopped once the first members serve)")
    parser.add_argument("--controller-from", metavar="DIR", default="",
                        help="run the controller from another checkout (e.g. an export of "
                        "main), at log level info")
    parser.add_argument("--py-spy", metavar="FILE", default="",
                        help="sample the controller's stacks during the burst with py-spy "
                        "(pip install py-spy), collapsed into FILE")
    parser.add_argument("--audit", action="store_true",
                        help="count the driver's writes per swap from an audit log")
    args = parser.parse_args()
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
