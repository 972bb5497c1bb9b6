"""Benchmark: many groups swapping at once, on a real control plane.

`--groups` shared groups of `--per-group` Models each (1,000 Models in 200 groups by
default), rendered by the controller (a `python -m flexinfer_k8s` process with
`--workers`, the default 2m demand window); every group's first member is asked for
and becomes Ready; then the second member, more important, of `--swapping` groups (100
by default) is asked for at the same moment, as a proxy would, and preempts it. From
watches on Models, Deployments and Pods, per swapping group:

- demand -> decision: the demand PATCH to the old holder's status naming the
  challenger in `preemptedBy` (the handover's record, written first; the challenger's
  own status may follow with its Ready, docs/controller.md);
- decision -> scale-down: to the old holder's Deployment at `replicas: 0`;
- pods gone -> scale-up: from the old holder's last pod deleted to the challenger's
  Deployment at `replicas: 1`;
- scale-down -> pods gone, scale-up -> pod Ready: the cluster's part (controller
  manager, scheduler, kwok, the pod's terminate delay and `--load-time`);
- pod Ready -> Model Ready: the controller noticing;
- demand -> new Ready: the whole swap, including the simulated load (`--load-time`).

The local cluster's controller manager and scheduler run with their client QPS raised
(`--cluster-qps`) so the cluster is not what is measured. Prints one JSON object;
timings are never asserted anywhere.

    .venv/bin/python benchmarks/bench_scale.py --groups 200 --per-group 5 --swapping 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_controller import Recorder, percentile  # noqa: E402
from flexinfer_devcluster.localcluster import KwokNode, LocalCluster  # noqa: E402
from flexinfer_kube.kubeapi import KubeApi  # noqa: E402
from flexinfer_kube.resources import DEPLOYMENTS, MODELS, PODS, Resource  # noqa: E402
from tests.k8s.harness import Cluster, ControllerProcess, model_body, now_text  # noqa: E402

NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NAMESPACE = "scale"


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
    machine is not ours), and the whole machine's busy time (`machine`)."""
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
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    jiffies = [int(x) for x in Path("/proc/stat").read_text().split()[1:9]]
    totals["machine"] = (sum(jiffies) - jiffies[3] - jiffies[4]) / tick
    return totals


def member(group: int, index: int) -> str:
    return f"g{group:03d}-m{index}"


def first_event(events: list[tuple[float, str, dict[str, Any]]], after: float, test: Any) -> float:
    for stamp, kind, obj in events:
        if kind != "BOOKMARK" and stamp >= after and test(kind, obj):
            return stamp
    raise LookupError("no such event")


def run(args: argparse.Namespace) -> dict[str, Any]:
    gpus_per_node = 64
    nodes = tuple(
        KwokNode(name=f"kwok-gpu-{i}", gpus=gpus_per_node, pods=max(110, gpus_per_node * 3))
        for i in range(-(-args.groups // gpus_per_node))
    )
    local = LocalCluster(nodes=nodes, name="flexinfer-bench-scale", client_qps=args.cluster_qps,
                         audit=args.audit)
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
        controller = ControllerProcess(
            local, NAMESPACE, log=work / "controller.log",
            extra=("--workers", str(args.workers), "--demand-window", "2m",
                   "--recent-window", "5m", "--default-swap-cooldown", "0s"),
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

        swapping = list(range(args.swapping))
        burst_wall = datetime.now(UTC)
        marker = str(local.workdir)
        cpu_before, burst_start = cpu_seconds(marker), time.monotonic()
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
        time.sleep(1)  # let the watches deliver the last events
        for recorder in (models, deployments, pods):
            recorder.stop()

        decided, down, up, total = [], [], [], []
        draining, starting, noticed = [], [], []  # the cluster's parts, and ours
        for g in swapping:
            old, new, start = member(g, 0), member(g, 1), asked[g]
            t_decided = first_event(models.events, start, lambda k, o, n=old, by=new: (
                o["metadata"]["name"] == n
                and (o.get("status") or {}).get("sharedGroup", {}).get("preemptedBy") == by))
            t_down = first_event(deployments.events, start, lambda k, o, n=old: (
                o["metadata"]["name"] == n and o["spec"].get("replicas") == 0))
            t_gone = first_event(pods.events, t_down, lambda k, o, n=old: (
                k == "DELETED" and (o["metadata"].get("labels") or {}).get(
                    "ai.flexinfer/model") == n))
            t_up = first_event(deployments.events, t_gone, lambda k, o, n=new: (
                o["metadata"]["name"] == n and o["spec"].get("replicas") == 1))
            t_pod_ready = first_event(pods.events, t_up, lambda k, o, n=new: (
                (o["metadata"].get("labels") or {}).get("ai.flexinfer/model") == n
                and any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (o.get("status") or {}).get("conditions") or [])))
            t_ready = first_event(models.events, t_up, lambda k, o, n=new: (
                o["metadata"]["name"] == n and (o.get("status") or {}).get("phase") == "Ready"))
            decided.append((t_decided - start) * 1000)
            down.append((t_down - t_decided) * 1000)
            draining.append((t_gone - t_down) * 1000)
            up.append((t_up - t_gone) * 1000)
            starting.append((t_pod_ready - t_up) * 1000)
            noticed.append((t_ready - t_pod_ready) * 1000)
            total.append((t_ready - start) * 1000)
        writes: dict[str, float] = {}
        if args.audit:  # the controller's writes during the burst, per swap
            counted: Counter[str] = Counter()
            roles = {member(g, 0): "old holder" for g in swapping}
            roles |= {member(g, 1): "new holder" for g in swapping}
            for event in local.audit_events():
                if not str(event.get("userAgent", "")).startswith("flexinfer-controller"):
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
        return {
            "benchmark": "controller_burst_swaps",
            "models": len(names),
            "groups": args.groups,
            "swapping_at_once": args.swapping,
            "workers": args.workers,
            "load_time": args.load_time,
            "first_members_ready_after_s": round(warm, 1),
            "demand_to_decision_ms": summary(decided),
            "decision_to_scale_down_ms": summary(down),
            "scale_down_to_pods_gone_ms": summary(draining),
            "pods_gone_to_scale_up_ms": summary(up),
            "scale_up_to_pod_ready_ms": summary(starting),
            "pod_ready_to_model_ready_ms": summary(noticed),
            "demand_to_new_model_ready_ms": summary(total),
            **({"controller_writes_per_swap": writes} if args.audit else {}),
            "burst_s": round(burst_seconds, 1),
            "burst_cpu_s": {p: round(cpu_after[p] - cpu_before[p], 1) for p in cpu_after},
            "setup": {
                "cluster_client_qps": args.cluster_qps,
                "pod_terminate_delay": "200ms",
                "controller": f"python -m flexinfer_k8s, {args.workers} workers",
            },
        }
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
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--audit", action="store_true",
                        help="count the controller's writes per swap from an audit log")
    args = parser.parse_args()
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
