"""Running the proxy in-process on a loopback port, and the backends as processes.

`BackendProcess` starts `tests.proxy.fake_backend` and reads the port it printed;
`proxy_process` runs `python -m flexinfer_proxy` against a cluster.
`running_proxy` serves a `Proxy` over an `InMemoryDirectory` and a `RecordingSink`
on 127.0.0.1 inside the test's event loop, so a test can flip readiness and look
at the recorded demand between real HTTP calls. Waits are bounded loops on events
or state, never assertions about how long something took.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import attrs
from prometheus_client import CollectorRegistry

from flexinfer_kube.clock import Clock, ManualClock
from flexinfer_proxy.api_keys import ApiKeys
from flexinfer_proxy.app import Proxy, ProxyConfig, ProxyServer, serve
from flexinfer_proxy.demand import WRITTEN, MarkOutcome, QueueReport
from flexinfer_proxy.directory import InMemoryDirectory, ModelEntry, ModelKind

ROOT = Path(__file__).resolve().parents[2]
TEST_DEADLINE = 60.0


def async_test(coro_fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test body in its own event loop, bounded by a deadline."""

    @functools.wraps(coro_fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def bounded() -> None:
            await asyncio.wait_for(coro_fn(*args, **kwargs), TEST_DEADLINE)

        asyncio.run(bounded())

    return wrapper


async def eventually(
    probe: Callable[[], Any], *, what: str, attempts: int = 2000, interval: float = 0.005
) -> Any:
    """Until `probe()` (or the awaitable it returns) is truthy, a bounded number of tries."""
    last: Any = None
    for _ in range(attempts):
        last = probe()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"gave up waiting for {what}; last: {last!r}")


class BackendProcess:
    def __init__(self, name: str, *, host: str = "127.0.0.1") -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.proxy.fake_backend", "--name", name, "--host", host],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise AssertionError(f"backend {name} did not start: {line!r}")
        self.port = int(line.split()[1])
        self.base = f"http://{host}:{self.port}"
        self.endpoint = f"{self.base}/v1"

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def arrivals(self, session: aiohttp.ClientSession) -> list[str]:
        async with session.get(f"{self.base}/control/arrivals") as response:
            body = await response.json()
            return list(body["arrivals"])

    async def release(self, session: aiohttp.ClientSession, tag: str) -> None:
        async with session.post(f"{self.base}/control/release", json={"tag": tag}) as response:
            assert response.status == 200


@attrs.define
class RecordingSink:
    """A DemandSink that remembers every write, in order."""

    marks: list[tuple[str, datetime]] = attrs.field(factory=list)
    reports: list[tuple[str, QueueReport | None]] = attrs.field(factory=list)
    # (name, the value it still had to say, the value put back) of each withdrawal.
    withdrawals: list[tuple[str, datetime, datetime | None]] = attrs.field(factory=list)
    # What the next mark's write replaced (else None: the field was absent).
    replaced: datetime | None = None
    # What the next timestamp writes answer (then WRITTEN), as the cluster might.
    outcomes: list[MarkOutcome] = attrs.field(factory=list)
    in_flight: list[tuple[str, int]] = attrs.field(factory=list)
    # Set: the in-flight writes wait for it (a slow API server), after recording.
    in_flight_gate: asyncio.Event | None = None

    async def report_in_flight(self, entry: ModelEntry, count: int, *, now: datetime) -> None:
        self.in_flight.append((entry.name, count))
        if self.in_flight_gate is not None:
            await self.in_flight_gate.wait()

    def in_flight_for(self, name: str) -> list[int]:
        return [count for model, count in self.in_flight if model == name]

    async def mark_active(self, entry: ModelEntry, *, now: datetime) -> MarkOutcome:
        self.marks.append((entry.name, now))
        return (
            self.outcomes.pop(0) if self.outcomes else MarkOutcome(WRITTEN, replaced=self.replaced)
        )

    async def report_queue(
        self, entry: ModelEntry, report: QueueReport | None, *, now: datetime
    ) -> None:
        self.reports.append((entry.name, report))

    async def withdraw(
        self, entry: ModelEntry, *, written: datetime, restore: datetime | None
    ) -> str:
        self.withdrawals.append((entry.name, written, restore))
        return WRITTEN

    def marks_for(self, name: str) -> list[datetime]:
        return [when for model, when in self.marks if model == name]

    def reports_for(self, name: str) -> list[QueueReport | None]:
        return [report for model, report in self.reports if model == name]


def entry(
    name: str,
    endpoint: str,
    *,
    ready: bool = True,
    kind: ModelKind = ModelKind.MODEL,
    gpu_group: str | None = None,
    cold_start: timedelta = timedelta(0),
    namespace: str = "test",
    **fields: Any,
) -> ModelEntry:
    """A routable entry; `fields` are further ModelEntry fields (served_name, ...)."""
    return ModelEntry(
        name=name,
        namespace=namespace,
        kind=kind,
        ready=ready,
        endpoint=endpoint,
        phase="Ready" if ready else "Idle",
        cold_start_timeout=cold_start,
        gpu_group=gpu_group,
        **fields,
    )


@attrs.define
class RunningProxy:
    proxy: Proxy
    directory: InMemoryDirectory
    sink: RecordingSink
    clock: ManualClock
    registry: CollectorRegistry
    url: str
    session: aiohttp.ClientSession
    runner: ProxyServer
    stopped: bool = False

    async def stop(self) -> None:
        """Shut the proxy down as SIGTERM would (idempotent)."""
        if not self.stopped:
            self.stopped = True
            await self.runner.cleanup()

    def post(self, path: str, payload: Any, **kwargs: Any) -> Any:
        return self.session.post(f"{self.url}{path}", json=payload, **kwargs)

    async def chat(self, model: str, **body: Any) -> tuple[int, dict[str, Any]]:
        async with self.post("/v1/chat/completions", {"model": model, **body}) as response:
            return response.status, await response.json()

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def depth(self, model: str) -> int:
        """Requests queued for `model` (a bare name means namespace `test`)."""
        key = model if "/" in model else f"test/{model}"
        return self.proxy.queues.depth(key)

    async def queued(self, model: str, depth: int) -> None:
        await eventually(lambda: self.depth(model) == depth, what=f"{depth} queued for {model}")


@asynccontextmanager
async def running_proxy(
    entries: Iterable[ModelEntry],
    *,
    config: ProxyConfig | None = None,
    clock: Clock | None = None,
    sink: RecordingSink | None = None,
    api_keys: ApiKeys | None = None,
    metrics_port: int | None = None,
) -> AsyncIterator[RunningProxy]:
    directory = InMemoryDirectory(entries)
    sink = sink or RecordingSink()
    manual = clock if isinstance(clock, ManualClock) else ManualClock()
    registry = CollectorRegistry()
    proxy = Proxy(
        directory, sink, clock=manual, registry=registry, config=config, api_keys=api_keys
    )
    runner, port = await serve(proxy, host="127.0.0.1", port=0, metrics_port=metrics_port)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        running = RunningProxy(proxy, directory, sink, manual, registry, url, session, runner)
        try:
            yield running
        finally:
            await running.stop()


class StaticProxy:
    """`tests.proxy.static_proxy` in its own process: the real flags, server and loop.

    Its stderr (the proxy's log) goes to `log_path`; `pid` lets a test read the
    process's descriptors and memory from /proc.
    """

    def __init__(self, models: list[dict[str, Any]], *flags: str, log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "tests.proxy.static_proxy",
                "--models", json.dumps(models),
                "--host", "127.0.0.1", "--port", "0", *flags,
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise AssertionError(f"static proxy did not start: {line!r}; {self.log()}")
        words = line.split()
        self.port, self.control_port = int(words[1]), int(words[3])
        self.url = f"http://127.0.0.1:{self.port}"
        self.control = f"http://127.0.0.1:{self.control_port}/control"
        self.pid = self.process.pid

    def log(self) -> str:
        return self.log_path.read_text()

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def peak_rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc status")

    async def tasks(self, session: aiohttp.ClientSession) -> int:
        async with session.get(f"{self.control}/tasks") as response:
            return int((await response.json())["tasks"])

    async def put(self, session: aiohttp.ClientSession, model: dict[str, Any]) -> None:
        async with session.post(f"{self.control}/put", json=model) as response:
            assert response.status == 200

    async def depth(self, session: aiohttp.ClientSession, model: str) -> int:
        async with session.get(f"{self.control}/depth", params={"model": model}) as response:
            return int((await response.json())["depth"])

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


@contextmanager
def proxy_process(
    kubeconfig: Path,
    namespace: str,
    *,
    endpoints: Mapping[str, str],
    min_queue_wait: str = "5m",
) -> Iterator[str]:
    """`python -m flexinfer_proxy` on a loopback port, watching `namespace`; yields its URL.

    `endpoints` sends each named model to a backend process instead of its Service
    (the cluster's pods are kwok's and serve nothing). Stopped with SIGTERM, which must
    end it cleanly.
    """
    overrides = [arg for name, url in endpoints.items() for arg in ("--endpoint", f"{name}={url}")]
    process = subprocess.Popen(
        [
            sys.executable, "-m", "flexinfer_proxy",
            "--host", "127.0.0.1", "--port", "0",
            "--kubeconfig", str(kubeconfig),
            "--namespace", namespace,
            *overrides,
            "--min-queue-wait", min_queue_wait,
            "--log-level", "DEBUG",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    try:
        assert line.startswith("listening on 127.0.0.1:"), f"proxy did not start: {line!r}"
        yield f"http://127.0.0.1:{line.strip().rsplit(':', 1)[1]}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
