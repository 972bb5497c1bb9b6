"""Figures for the local control plane, printed as JSON (never asserted anywhere).

- cold build: seconds to compile the six binaries from an empty cache. By default it is
  read from the build record `flexinfer_devcluster.assets` wrote when it built the cache in use;
  `--cold` measures it now, building into a temporary cache with an empty Go build
  cache (Go module downloads stay cached, so network time is not included).
- warm start: seconds from `LocalCluster.start()` to a usable cluster (API server
  ready, kwok nodes Ready, default ServiceAccount present), over `--starts` runs.
- memory: resident set of the running control plane, summed over its processes from
  /proc, after `--settle` seconds.

    python benchmarks/bench_localcluster.py [--starts 3] [--settle 10] [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flexinfer_devcluster import asset_versions as pins
from flexinfer_devcluster.assets import ensure_assets, manifest
from flexinfer_devcluster.localcluster import LocalCluster


def cold_build() -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="flexinfer-cold-build-"))
    saved = {name: os.environ.get(name) for name in ("FLEXINFER_CACHE_DIR", "GOCACHE")}
    os.environ["FLEXINFER_CACHE_DIR"] = str(scratch / "cache")
    os.environ["GOCACHE"] = str(scratch / "gocache")
    for name in ("FLEXINFER_ASSETS", "KUBEBUILDER_ASSETS"):
        os.environ.pop(name, None)
    try:
        began = time.monotonic()
        directory = ensure_assets()
        seconds = time.monotonic() - began
        record = manifest(directory)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "seconds": round(seconds, 1),
        "source": "measured now",
        "steps": record.get("step_seconds"),
    }


def recorded_build(directory: Path) -> dict[str, Any]:
    record = manifest(directory)
    return {
        "seconds": record.get("build_seconds"),
        "source": (
            f"{directory}/versions.json: the build that made this cache; it may have "
            "reused Go's build cache, so use --cold for an empty-cache figure"
        ),
        "steps": record.get("step_seconds"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--cold", action="store_true", help="measure a cold build now")
    args = parser.parse_args()

    build = cold_build() if args.cold else None
    assets = ensure_assets()
    if build is None:
        build = recorded_build(assets)

    starts: list[float] = []
    memory: dict[str, Any] = {}
    for attempt in range(args.starts):
        cluster = LocalCluster(assets_dir=assets, name="flexinfer-bench")
        try:
            cluster.start()
            starts.append(round(cluster.started_seconds or 0.0, 2))
            if attempt == args.starts - 1:
                time.sleep(args.settle)
                per_process = cluster.rss_by_process()
                memory = {
                    "total_mib": round(sum(per_process.values()) / 2**20, 1),
                    "per_process_mib": {k: round(v / 2**20, 1) for k, v in per_process.items()},
                    "after_settle_seconds": args.settle,
                    "nodes": 2,
                }
        finally:
            cluster.stop()

    print(
        json.dumps(
            {
                "benchmark": "localcluster",
                "versions": {
                    "kubernetes": pins.KUBERNETES_VERSION,
                    "etcd": pins.ETCD_VERSION,
                    "kwok": pins.KWOK_VERSION,
                },
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": sys.platform,
                },
                "cold_build": build,
                "warm_start_to_healthy_seconds": {
                    "runs": starts,
                    "median": statistics.median(starts) if starts else None,
                    "target": 15,
                },
                "control_plane_rss": memory,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
