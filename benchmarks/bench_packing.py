"""Benchmark: a day of traffic for 6 models on one 24 GiB card, packed and one at a time.

docs/election.md 1.7. A generated day (seeded, so every run is the same day) of
requests for six members of one shared group whose footprints range from 1.5 to 20
GiB, run through the simulator (flexinfer_core.simulate: the controller's own
decision, the proxy's queue and demand, pods that take `--load` to load) twice: with
`vramBudget: 24Gi` on every member (packing) and without a budget (one member at a
time, as before packing). Prints JSON: for each run the swaps (changes of the leader,
what `flexinfer simulate` counts), the loads (a member's server started: the cold
starts a user waits for), the served requests' waits for a serving pod (median,
p95, max), the requests never served (their clients gave up after their retries),
the p95 wait of every request (one never served counted until its client gave up:
a lower bound), and the most memory the card held at once.

Run: .venv/bin/python benchmarks/bench_packing.py [--seed N] [--hours H] [--load S]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer_core import ModelState, Serverless
from flexinfer_core.simulate import Request, Timeline, simulate

GIB = 2**30
BUDGET = 24 * GIB
START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)

# name, priority, footprint (GiB), requests per hour at the day's peak, and the hours
# (UTC) it is asked for at all: a chat model all day, an embedding model feeding it, a
# coder in working hours, a vision model, a summariser at night, and a large model
# asked for rarely.
MODELS: tuple[tuple[str, int, float, float, tuple[int, int]], ...] = (
    ("chat", 200, 5.5, 30, (7, 23)),
    ("embed", 150, 1.5, 40, (0, 24)),
    ("coder", 180, 12, 20, (9, 18)),
    ("vision", 120, 10, 6, (8, 20)),
    ("summarise", 100, 8, 8, (0, 6)),
    ("large", 250, 20, 1.5, (10, 17)),
)


def members(*, budget: int | None) -> list[ModelState]:
    return [
        ModelState(
            name=name,
            group="card",
            priority=priority,
            vram_budget=budget,
            vram_estimate=int(gib * GIB),
            swap_cooldown=timedelta(minutes=2),
            serverless=Serverless(idle_timeout=timedelta(minutes=5)),
        )
        for name, priority, gib, _, _ in MODELS
    ]


def day_of_requests(seed: int, hours: float) -> list[Request]:
    """Poisson arrivals per model within its hours, in bursts of 1-4 requests, the rate
    rising and falling over each model's hours (a half sine)."""
    rng = random.Random(seed)
    out: list[Request] = []
    end = hours * 3600
    for name, _, _, peak, (first, last) in MODELS:
        t = first * 3600.0
        span = (last - first) * 3600.0
        while True:
            t += rng.expovariate(peak / 3600)
            if t >= min(end, last * 3600):
                break
            # Thinning: keep an arrival with the probability of the rate at t.
            if rng.random() > math.sin(math.pi * (t - first * 3600) / span):
                continue
            for i in range(rng.randint(1, 4)):
                out.append(Request(START + timedelta(seconds=t + 2 * i), name))
    return sorted(out, key=lambda r: (r.at, r.model))


def _percentile(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)]


def summarise(timeline: Timeline, *, until: datetime, seconds: float) -> dict[str, Any]:
    sizes = {name: int(gib * GIB) for name, _, gib, _, _ in MODELS}
    loads = 0
    held = 0
    had: set[str] = set()
    for step in timeline.steps:
        on = {name for name, pods, _ in step.pods if pods}
        loads += len(on - had)
        had = on
        held = max(held, sum(sizes[n] for n in on))
    waits = [
        (o.served_at - o.request.at).total_seconds()
        for o in timeline.requests
        if o.served_at is not None
    ]
    # A request never served waited at least until its client gave up (its last 503),
    # or until the end of the run.
    every = [
        ((o.served_at or (o.refusals[-1] if o.gave_up else until)) - o.request.at).total_seconds()
        for o in timeline.requests
    ]
    return {
        "swaps": timeline.swaps,
        "loads": loads,
        "requests": len(timeline.requests),
        "served": len(waits),
        "neverServed": len(timeline.requests) - len(waits),
        "medianWaitSeconds": statistics.median(waits) if waits else None,
        "p95WaitSeconds": _percentile(waits, 95),
        "maxWaitSeconds": max(waits, default=None),
        "p95WaitAllSeconds": _percentile(every, 95),
        "mostMembersWithPods": timeline.max_members_with_pods,
        "mostHeldGiB": held / GIB,
        "simulationSeconds": round(seconds, 3),
    }


def run(*, seed: int, hours: float, load: float) -> dict[str, Any]:
    requests = day_of_requests(seed, hours)
    until = START + timedelta(hours=hours, minutes=15)
    out: dict[str, Any] = {
        "benchmark": "packing",
        "seed": seed,
        "hours": hours,
        "loadSeconds": load,
        "budgetGiB": BUDGET / GIB,
        "models": [
            {"name": n, "priority": p, "footprintGiB": g, "peakPerHour": r, "hours": list(h)}
            for n, p, g, r, h in MODELS
        ],
        "python": platform.python_version(),
    }
    for mode, budget in (("packed", BUDGET), ("oneAtATime", None)):
        began = time.perf_counter()
        timeline = simulate(
            members(budget=budget),
            start=START,
            until=until,
            requests=requests,
            load_time=timedelta(seconds=load),
            max_steps=1_000_000,
        )
        out[mode] = summarise(timeline, until=until, seconds=time.perf_counter() - began)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=19, help="the generated day (default 19)")
    parser.add_argument(
        "--hours", type=float, default=24, help="hours of traffic, 0.1 to 24 (default 24)"
    )
    parser.add_argument(
        "--load", type=float, default=30, help="seconds a server takes to load (default 30)"
    )
    args = parser.parse_args(argv)
    if not 0.1 <= args.hours <= 24:
        parser.error(f"--hours: {args.hours} must be between 0.1 and 24")
    if not 0 <= args.load <= 3600:
        parser.error(f"--load: {args.load} must be between 0 and 3600 seconds")
    json.dump(run(seed=args.seed, hours=args.hours, load=args.load), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
