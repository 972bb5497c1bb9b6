"""Figures for the proxy, printed as JSON (never asserted anywhere).

- overhead: latency (p50, p99) and throughput of small non-streaming requests sent
  straight to a fake OpenAI backend and through the proxy (model Ready), at
  `--concurrency` clients for `--requests` requests each way.
- drain: `--queued` requests wait for a model that is not Ready; the figure is the
  time from "Ready" until every one of them has its answer.

The backend is `tests/proxy/fake_backend.py` in its own process; the proxy runs in
this process with an in-memory directory and a demand sink that records nothing.

    python benchmarks/bench_proxy.py [--requests 2000] [--concurrency 32] [--queued 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from flexinfer_proxy.app import Proxy, ProxyConfig, serve
from flexinfer_proxy.demand import WRITTEN, MarkOutcome, QueueReport
from flexinfer_proxy.directory import InMemoryDirectory, ModelEntry, ModelKind

ROOT = Path(__file__).resolve().parents[1]


class NullSink:
    async def mark_active(self, entry: ModelEntry, *, now: datetime) -> MarkOutcome:
        return MarkOutcome(WRITTEN)

    async def report_queue(
        self, entry: ModelEntry, report: QueueReport | None, *, now: datetime
    ) -> None:
        return None


def start_backend() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.proxy.fake_backend", "--name", "bench"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    port = int(process.stdout.readline().split()[1])
    return process, f"http://127.0.0.1:{port}"


async def load(url: str, *, requests: int, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    remaining = iter(range(requests))

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in remaining:
            started = time.perf_counter()
            async with session.post(url, json={"model": "m", "messages": []}) as response:
                await response.read()
                assert response.status == 200, response.status
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": requests,
        "concurrency": concurrency,
        "requests_per_second": round(requests / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
    }


async def drain(proxy_url: str, directory: InMemoryDirectory, proxy: Proxy, queued: int) -> float:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def ask() -> None:
            payload = {"model": "m", "messages": []}
            async with session.post(f"{proxy_url}/v1/chat/completions", json=payload) as answer:
                await answer.read()
                assert answer.status == 200, answer.status

        tasks = [asyncio.create_task(ask()) for _ in range(queued)]
        while proxy.queues.depth("m") < queued:
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        directory.set_ready("m")
        await asyncio.gather(*tasks)
        return time.perf_counter() - started


async def main(args: argparse.Namespace) -> dict[str, Any]:
    backend, base = start_backend()
    try:
        entry = ModelEntry("m", "bench", ModelKind.MODEL, ready=True, endpoint=f"{base}/v1")
        directory = InMemoryDirectory([entry])
        proxy = Proxy(directory, NullSink(), registry=CollectorRegistry(), config=ProxyConfig())
        runner, port = await serve(proxy, host="127.0.0.1", port=0)
        proxy_url = f"http://127.0.0.1:{port}"
        try:
            direct = await load(
                f"{base}/v1/chat/completions",
                requests=args.requests,
                concurrency=args.concurrency,
            )
            proxied = await load(
                f"{proxy_url}/v1/chat/completions",
                requests=args.requests,
                concurrency=args.concurrency,
            )
            directory.set_ready("m", False)
            drain_seconds = await drain(proxy_url, directory, proxy, args.queued)
        finally:
            await runner.cleanup()
    finally:
        assert backend.stdin is not None
        backend.stdin.close()
        backend.wait(timeout=10)
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "direct": direct,
        "through_proxy": proxied,
        "drain": {"queued": args.queued, "seconds_until_all_answered": round(drain_seconds, 3)},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--queued", type=int, default=200)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
