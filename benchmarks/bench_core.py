"""Benchmark: decide every shared group of a large cluster with flexinfer_core.

10,000 Models in 1,000 groups of 10 with demand, cooldowns and some leases, in two
mixes: "usual" (one holder per group, the others Idle, Preempted or Failed) and
"mixed" (every phase among the members, many Preempted, Failed and Loading ones,
several stamped with `preemptedAt`, some statuses never written). Prints JSON with
the median and spread of repeated whole-cluster passes, in wall-clock time and in
this process's CPU time (steadier on a shared machine).
Run: .venv/bin/python benchmarks/bench_core.py [--repeat N]

`--passes N --workload first|steady|mixed` runs N untimed passes of one workload and prints
nothing: under `valgrind --tool=cachegrind --cache-sim=no`, the instructions of N
passes minus those of 0 passes is a count that does not depend on the machine's load
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from flexinfer_core import (
    GpuLease,
    ModelState,
    Phase,
    Serverless,
    SharedState,
    apply_decision,
    decide_group,
    group_models,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


# The "mixed" workload's phases, weighted: many Preempted, Failed and Loading.
MIXED_PHASES = (
    [Phase.PREEMPTED] * 3
    + [Phase.FAILED] * 2
    + [Phase.LOADING] * 2
    + [Phase.PENDING, Phase.READY, Phase.IDLE]
)


def build_cluster(
    groups: int, per_group: int, seed: int, *, mixed: bool = False
) -> tuple[list[ModelState], list[GpuLease], dict[str, frozenset[str]]]:
    if mixed:
        return build_mixed_cluster(groups, per_group, seed)
    rng = random.Random(seed)
    models: list[ModelState] = []
    leases: list[GpuLease] = []
    running: dict[str, frozenset[str]] = {}
    for g in range(groups):
        group = f"group-{g:04d}"
        leader = rng.randrange(per_group)
        for i in range(per_group):
            is_leader = i == leader
            phase = (
                rng.choice([Phase.READY, Phase.LOADING, Phase.PENDING])
                if is_leader
                else rng.choice([Phase.IDLE, Phase.PREEMPTED, Phase.IDLE, Phase.FAILED])
            )
            models.append(
                ModelState(
                    name=f"model-{i}",
                    namespace=f"ns-{g % 50}",
                    group=group,
                    priority=rng.choice([50, 100, 100, 200, 500]),
                    phase=phase,
                    last_active=NOW - timedelta(seconds=rng.randrange(0, 900))
                    if rng.random() < 0.6
                    else None,
                    shared_state=SharedState.ACTIVE if is_leader else SharedState.QUEUED,
                    preempted_at=NOW - timedelta(seconds=rng.randrange(0, 600))
                    if rng.random() < 0.1
                    else None,
                    swap_cooldown=timedelta(minutes=rng.choice([1, 5])),
                    serverless=Serverless(min_replicas=rng.choice([0, 0, 1])),
                    service_labels=(f"svc-{i}",),
                    replicas=1 if is_leader else 0,
                )
            )
        running[group] = frozenset({f"model-{leader}"})
        if rng.random() < 0.05:
            leases.append(
                GpuLease(
                    name=f"lease-{g}",
                    group=group,
                    namespace=f"ns-{g % 50}",
                    owner="finetune",
                    expires_at=NOW + timedelta(minutes=rng.choice([-5, 30])),
                )
            )
    return models, leases, running


def build_mixed_cluster(
    groups: int, per_group: int, seed: int
) -> tuple[list[ModelState], list[GpuLease], dict[str, frozenset[str]]]:
    """Every phase among the members; half stamped with `preemptedAt`; some statuses
    never written (no `sharedGroup.state`); pods wherever a phase says so."""
    rng = random.Random(seed)
    models: list[ModelState] = []
    running: dict[str, frozenset[str]] = {}
    for g in range(groups):
        group = f"group-{g:04d}"
        leader = rng.randrange(per_group)
        with_pods = set()
        for i in range(per_group):
            phase = rng.choice(MIXED_PHASES)
            if phase in (Phase.READY, Phase.LOADING, Phase.PENDING):
                with_pods.add(f"model-{i}")
            models.append(
                ModelState(
                    name=f"model-{i}",
                    namespace=f"ns-{g % 50}",
                    group=group,
                    priority=rng.choice([50, 100, 100, 200, 500]),
                    phase=phase,
                    last_active=NOW - timedelta(seconds=rng.randrange(0, 900))
                    if rng.random() < 0.7
                    else None,
                    shared_state=SharedState.ACTIVE
                    if i == leader
                    else rng.choice([SharedState.QUEUED, None]),
                    preempted_at=NOW - timedelta(seconds=rng.randrange(0, 900))
                    if rng.random() < 0.5
                    else None,
                    swap_cooldown=timedelta(minutes=rng.choice([1, 5])),
                    serverless=Serverless(
                        min_replicas=rng.choice([0, 0, 1]),
                        cold_start_timeout=timedelta(seconds=rng.choice([60, 600])),
                    ),
                    service_labels=(f"svc-{i}",),
                    replicas=1 if f"model-{i}" in with_pods else 0,
                )
            )
        running[group] = frozenset(with_pods)
    return models, [], running


def decide_cluster(
    models: list[ModelState],
    leases: list[GpuLease],
    running: dict[str, frozenset[str]],
    *,
    with_changes: bool = False,
) -> int:
    leases_by_key: dict[tuple[str, str], list[GpuLease]] = {}
    for lease in leases:
        leases_by_key.setdefault((lease.namespace, lease.group), []).append(lease)
    writes = 0
    for key, members in group_models(models).items():
        decision = decide_group(
            members, now=NOW, leases=leases_by_key.get(key, ()), running=running[key[1]]
        )
        if with_changes:
            writes += len(decision.changes(members))
    return writes


def settle(
    models: list[ModelState], leases: list[GpuLease], running: dict[str, frozenset[str]]
) -> list[ModelState]:
    """The cluster after every group's first decision was written (the steady state)."""
    leases_by_key: dict[tuple[str, str], list[GpuLease]] = {}
    for lease in leases:
        leases_by_key.setdefault((lease.namespace, lease.group), []).append(lease)
    out: list[ModelState] = []
    for key, members in group_models(models).items():
        decision = decide_group(
            members, now=NOW, leases=leases_by_key.get(key, ()), running=running[key[1]]
        )
        out += apply_decision(members, decision)
    return out


def median_ms(
    run: Callable[[], object], repeat: int, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, float, float]:
    run()  # warm-up
    timings = []
    for _ in range(repeat):
        start = clock()
        run()
        timings.append((clock() - start) * 1000)
    return statistics.median(timings), min(timings), max(timings)


def measure(name: str, run: Callable[[], object], repeat: int) -> dict[str, float]:
    """Median and min of `repeat` passes, wall clock and CPU time of this process."""
    wall = median_ms(run, repeat)
    cpu = median_ms(run, repeat, time.process_time)
    return {
        f"{name}_median_ms": round(wall[0], 1),
        f"{name}_min_ms": round(wall[1], 1),
        f"{name}_cpu_median_ms": round(cpu[0], 1),
        f"{name}_cpu_min_ms": round(cpu[1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--per-group", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--passes",
        type=int,
        default=None,
        help="run this many untimed passes of --workload and print nothing (for valgrind)",
    )
    parser.add_argument("--workload", choices=["first", "steady", "mixed"], default="first")
    args = parser.parse_args()
    if args.passes is not None:
        models, leases, running = build_cluster(
            args.groups, args.per_group, args.seed, mixed=args.workload == "mixed"
        )
        if args.workload == "steady":
            models = settle(models, leases, running)
        decide_cluster(models, leases, running)  # warm-up, counted in every run alike
        for _ in range(args.passes):
            decide_cluster(models, leases, running)
        return
    load_before = os.getloadavg()[0]
    models, leases, running = build_cluster(args.groups, args.per_group, args.seed)
    steady = settle(models, leases, running)
    mixed, mixed_leases, mixed_running = build_cluster(
        args.groups, args.per_group, args.seed, mixed=True
    )
    mixed_steady = settle(mixed, mixed_leases, mixed_running)
    figures: dict[str, object] = {
        "benchmark": "decide_group over the whole cluster",
        "models": len(models),
        "groups": args.groups,
        "leases": len(leases),
        "repeat": args.repeat,
    }
    # First pass: nothing written yet, most groups change (preemptions, promotions).
    figures |= measure("first_pass", lambda: decide_cluster(models, leases, running), args.repeat)
    # Steady state: every decision already applied (a resync of a quiet cluster).
    figures |= measure("steady_state", lambda: decide_cluster(steady, leases, running), args.repeat)
    # The diff against the observed state is the adapter's next step; timed apart.
    figures |= measure(
        "first_pass_with_changes",
        lambda: decide_cluster(models, leases, running, with_changes=True),
        args.repeat,
    )
    # Every phase among the members: many Preempted, Failed and Loading ones.
    figures |= measure(
        "mixed_first_pass", lambda: decide_cluster(mixed, mixed_leases, mixed_running), args.repeat
    )
    figures |= measure(
        "mixed_steady_state",
        lambda: decide_cluster(mixed_steady, mixed_leases, mixed_running),
        args.repeat,
    )
    figures |= {
        "steady_state_members_with_writes": decide_cluster(
            steady, leases, running, with_changes=True
        ),
        "target_ms": 100,
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
