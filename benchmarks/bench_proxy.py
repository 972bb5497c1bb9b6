"""The proxy against nginx and against no proxy at all, printed as JSON (never asserted).

Every party is its own process (2 cores here: they share them):

- the backend: a minimal OpenAI-shaped server on raw asyncio protocols (uvloop), a
  ~300-byte JSON completion per request, or server-sent events carrying the time
  they were sent (CLOCK_MONOTONIC is one clock for every process on the machine);
- the proxy: `tests/proxy/static_proxy.py`, i.e. `python -m flexinfer_proxy`'s flags,
  config and server with a static model list (uvloop, access log off: its defaults;
  the per-client limits off, since one load process stands for many clients);
- nginx, when installed (Debian package `nginx`): one worker, upstream keep-alive,
  buffering off, access log off; without it (or with `--without-nginx`) the figures
  are direct and proxy only;
- the load: this script again (`load` / `sse` sub-commands), one process, raw
  asyncio, a fixed request on each of N keep-alive connections.

Figures: requests per second, latency p50/p99 and (for the proxy and nginx) CPU per
request, all of it and the kernel's part, at 1, 32 and 100 connections;
server-sent-event delay (receive time - send time) p50/p99 at 200 streams; the
ratios proxy ÷ nginx and proxy ÷ direct side by side; the added p50 at 1
connection; and the drain time of `--queued` requests once their model is Ready.

    python benchmarks/bench_proxy.py [--seconds 4] [--streams 200] [--queued 200]
    python benchmarks/bench_proxy.py instructions [--connections 32] [--requests 1920]

`instructions` (needs valgrind) counts the user-space instructions the proxy process
spends a request, loaded as above: a figure that does not move with the machine's
load, for comparing two versions of the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONNECTIONS = (1, 32, 100)
PATH = "/v1/chat/completions"
COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello! How can I help you today?"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
    }
).encode()
REQUEST_BODY = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
).encode()
STREAM_BODY = json.dumps({"model": "m", "messages": [], "stream": True}).encode()


def _loop_runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


# -- the backend -------------------------------------------------------------------


class BackendProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive; a JSON answer, or `events` SSE events `interval` apart."""

    def __init__(self, *, events: int, interval: float) -> None:
        self._buffer = b""
        self._events = events
        self._interval = interval
        self._transport: asyncio.Transport | None = None
        self._streams: set[asyncio.Future[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self._buffer[:head_end].lower()
            match = re.search(rb"content-length:\s*(\d+)", head)
            length = int(match.group(1)) if match else 0
            end = head_end + 4 + length
            if len(self._buffer) < end:
                return
            body = self._buffer[head_end + 4 : end]
            self._buffer = self._buffer[end:]
            if b'"stream": true' in body or b'"stream":true' in body:
                self._streams.add(stream := asyncio.ensure_future(self._stream()))
                stream.add_done_callback(self._streams.discard)
            else:
                assert self._transport is not None
                self._transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION)
                )

    async def _stream(self) -> None:
        transport = self._transport
        assert transport is not None
        transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for index in range(self._events):
            await asyncio.sleep(self._interval)
            event = b'data: {"i": %d, "t": %.6f}\n\n' % (index, time.monotonic())
            transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        done = b"data: [DONE]\n\n"
        transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


async def serve_backend(events: int, interval: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: BackendProtocol(events=events, interval=interval), "127.0.0.1", 0, backlog=1024
    )
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    reader = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), reader.set)  # stdin closed: stop
    await reader.wait()


# -- the load ------------------------------------------------------------------------


def request_bytes(port: int, body: bytes) -> bytes:
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Answers:
    """Splits a byte stream into HTTP/1.1 answers (Content-Length or chunked)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.payload = bytearray()  # the body decoded so far (chunked)
        self._state = "head"
        self._remaining = 0
        self._chunked = False
        self.failed = 0  # answers whose status was not 200

    def feed(self, data: bytes) -> int:
        """Add data; return how many answers completed."""
        self.buffer += data
        done = 0
        while True:
            if self._state == "head":
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return done
                head = bytes(self.buffer[:end]).lower()
                del self.buffer[: end + 4]
                if not head.startswith(b"http/1.1 200"):
                    self.failed += 1
                match = re.search(rb"content-length:\s*(\d+)", head)
                self._chunked = match is None
                self._remaining = int(match.group(1)) if match else 0
                self._state = "body"
            elif not self._chunked:
                if len(self.buffer) < self._remaining:
                    return done
                del self.buffer[: self._remaining]
                self._state = "head"
                done += 1
            else:
                line_end = self.buffer.find(b"\r\n")
                if line_end < 0:
                    return done
                size = int(bytes(self.buffer[:line_end]).split(b";")[0], 16)
                if len(self.buffer) < line_end + 2 + size + 2:
                    return done
                self.payload += self.buffer[line_end + 2 : line_end + 2 + size]
                del self.buffer[: line_end + 2 + size + 2]
                if size == 0:
                    self._state = "head"
                    done += 1


class LoadConnection(asyncio.Protocol):
    def __init__(self, request: bytes, latencies: list[float], stop_at: float) -> None:
        self._request = request
        self._latencies = latencies
        self._stop_at = stop_at
        self._answers = Answers()
        self._sent = 0.0
        self.done = asyncio.get_running_loop().create_future()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._send()

    def _send(self) -> None:
        assert self._transport is not None
        self._sent = time.perf_counter()
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if self._answers.feed(data):
            now = time.perf_counter()
            self._latencies.append(now - self._sent)
            if now < self._stop_at:
                self._send()
            elif not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("closed"))


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


async def drive_load(port: int, connections: int, seconds: float, warmup: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    request = request_bytes(port, REQUEST_BODY)
    warm: list[float] = []
    latencies: list[float] = []
    started = time.perf_counter()
    protocols = []
    for _ in range(connections):
        _, protocol = await loop.create_connection(
            lambda: LoadConnection(request, warm, started + warmup), "127.0.0.1", port
        )
        protocols.append(protocol)
    await asyncio.gather(*(p.done for p in protocols))
    # Measure on the same, warm connections.
    started = time.perf_counter()
    for protocol in protocols:
        protocol._latencies = latencies
        protocol._stop_at = started + seconds
        protocol.done = loop.create_future()
        protocol._send()
    await asyncio.gather(*(p.done for p in protocols))
    elapsed = time.perf_counter() - started
    for protocol in protocols:
        assert protocol._transport is not None
        protocol._transport.close()
    return {
        "connections": connections,
        "requests": len(latencies),
        "failed": sum(p._answers.failed for p in protocols),
        "warmup_requests": len(warm),
        "requests_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round(_percentile(latencies, 0.5) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
    }


class EventStream(asyncio.Protocol):
    def __init__(self, delays: list[tuple[float, float]]) -> None:
        self._answers = Answers()
        self._delays = delays  # (sent, delay) of every event
        self._seen = 0
        self.first: float | None = None  # when the first event arrived
        self.done = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        finished = self._answers.feed(data)
        events = bytes(self._answers.payload).split(b"\n\n")
        for event in events[self._seen : len(events) - 1]:
            if event.startswith(b"data: {"):
                sent = json.loads(event[6:])["t"]
                self._delays.append((sent, now - sent))
                if self.first is None:
                    self.first = now
        self._seen = len(events) - 1
        if finished and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("closed"))


async def drive_streams(port: int, streams: int) -> dict[str, Any]:
    """Event delays once every stream is open (steady state), and over all events."""
    loop = asyncio.get_running_loop()
    delays: list[tuple[float, float]] = []
    request = request_bytes(port, STREAM_BODY)
    protocols = []
    for _ in range(streams):
        transport, protocol = await loop.create_connection(
            lambda: EventStream(delays), "127.0.0.1", port
        )
        transport.write(request)
        protocols.append(protocol)
    await asyncio.gather(*(p.done for p in protocols))
    # Opening 200 streams at once is a burst of 200 requests; what a stream's events
    # wait for once it runs is measured from the moment every stream has begun.
    all_open = max(p.first or 0.0 for p in protocols)
    steady = [delay for sent, delay in delays if sent > all_open]
    every = [delay for _, delay in delays]
    return {
        "streams": streams,
        "events": len(steady),
        "failed": sum(p._answers.failed for p in protocols),
        "delay_p50_ms": round(_percentile(steady, 0.5) * 1000, 3),
        "delay_p99_ms": round(_percentile(steady, 0.99) * 1000, 3),
        "with_opening_burst_p99_ms": round(_percentile(every, 0.99) * 1000, 3),
    }


# -- the parties ---------------------------------------------------------------------


def _child(*argv: str, quiet: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *argv],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else None,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},
    )


def _stop(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@contextlib.contextmanager
def backend(events: int, interval: float) -> Iterator[int]:
    process = _child(__file__, "backend", "--events", str(events), "--interval", str(interval))
    assert process.stdout is not None
    try:
        yield int(process.stdout.readline().split()[1])
    finally:
        _stop(process)


# The load is one process standing for many clients, and nginx has no per-client
# limit here either: the proxy's are turned off (their counting still runs).
PER_CLIENT_LIMITS_OFF = ("--max-concurrent-per-client", "0", "--max-queued-per-client", "0")


@contextlib.contextmanager
def proxy(
    backend_port: int, *flags: str, profile: str | None = None
) -> Iterator[tuple[int, int, int]]:
    models = json.dumps([{"name": "m", "endpoint": f"http://127.0.0.1:{backend_port}/v1"}])
    profiler = ["-m", "pyinstrument", "-r", "text", "-o", profile] if profile else []
    process = _child(
        *profiler, "-m", "tests.proxy.static_proxy", "--models", models,
        "--host", "127.0.0.1", "--port", "0", "--log-level", "WARNING",
        *PER_CLIENT_LIMITS_OFF, *flags,
        quiet="--access-log" in flags,  # its lines are written (and paid for), not shown
    )  # fmt: skip
    assert process.stdout is not None
    try:
        words = process.stdout.readline().split()
        yield int(words[1]), int(words[3]), process.pid
    finally:
        _stop(process)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


NGINX_CONF = """
worker_processes 1;
daemon off;
{user}
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  upstream backend {{ server 127.0.0.1:{backend}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port} backlog=1024;
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


@contextlib.contextmanager
def nginx(backend_port: int, *, wanted: bool = True) -> Iterator[tuple[int, list[int]] | None]:
    """nginx's port and the pids whose CPU time counts (master and worker); None
    when it is not installed (Debian package `nginx`) or not wanted."""
    # Debian installs it in /usr/sbin, which a non-root PATH may lack.
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if binary is None or not wanted:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as tmp:
        port = _free_port()
        user = "user root;" if os.geteuid() == 0 else ""
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(user=user, tmp=tmp, backend=backend_port, port=port))
        process = subprocess.Popen(
            [binary, "-c", str(conf), "-p", tmp, "-e", f"{tmp}/error.log"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_listening(port)
            yield port, [process.pid, *_children(process.pid)]
        finally:
            process.terminate()
            process.wait(timeout=20)


def _wait_listening(port: int) -> None:
    for _ in range(200):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def _load(port: int, connections: int, seconds: float) -> dict[str, Any]:
    output = subprocess.run(
        [sys.executable, __file__, "load", "--port", str(port),
         "--connections", str(connections), "--seconds", str(seconds)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return dict(json.loads(output))


def _streams(port: int, streams: int) -> dict[str, Any]:
    output = subprocess.run(
        [sys.executable, __file__, "sse", "--port", str(port), "--streams", str(streams)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return dict(json.loads(output))


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """User and system CPU time of these processes so far (Linux /proc)."""
    user = system = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(child) for child in text.split()]
    return []


def _ratio(a: float, b: float | None) -> float | None:
    return round(a / b, 3) if b else None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg()[0],
        "seconds_per_figure": args.seconds,
        "load": {},
        "sse": {},
    }
    with (
        backend(args.events, args.interval) as backend_port,
        nginx(backend_port, wanted=not args.without_nginx) as front,
        proxy(backend_port, *args.proxy_flag) as (proxy_port, _, proxy_pid),
    ):
        targets: dict[str, tuple[int, list[int]]] = {
            "direct": (backend_port, []),
            "proxy": (proxy_port, [proxy_pid]),
        }
        if front is not None:
            targets["nginx"] = front
        results["nginx"] = front is not None
        for connections in CONNECTIONS:
            row = {}
            for name, (port, pids) in targets.items():
                before = cpu_seconds(pids)
                figures = _load(port, connections, args.seconds)
                if pids:
                    # CPU time over warm-up and measurement, per request of both.
                    after = cpu_seconds(pids)
                    user, system = after[0] - before[0], after[1] - before[1]
                    answered = figures["requests"] + figures.pop("warmup_requests")
                    figures["cpu_us_per_request"] = round((user + system) / answered * 1e6, 1)
                    # The kernel's share: the socket reads and writes, the loop's polls.
                    figures["cpu_system_us_per_request"] = round(system / answered * 1e6, 1)
                else:
                    figures.pop("warmup_requests")
                row[name] = figures
            results["load"][str(connections)] = row
        results["sse"] = {name: _streams(port, args.streams) for name, (port, _) in targets.items()}
    results["ratios"] = ratios(results)
    results["drain"] = asyncio.run(drain(args.queued))
    results["load_average_after"] = os.getloadavg()[0]
    return results


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for connections, row in results["load"].items():
        rps = {name: figures["requests_per_second"] for name, figures in row.items()}
        out[f"rps_proxy_over_nginx_at_{connections}"] = _ratio(rps["proxy"], rps.get("nginx"))
        out[f"rps_proxy_over_direct_at_{connections}"] = _ratio(rps["proxy"], rps["direct"])
    one = results["load"]["1"]
    out["added_p50_ms_at_1_proxy"] = round(one["proxy"]["p50_ms"] - one["direct"]["p50_ms"], 3)
    if "nginx" in one:
        out["added_p50_ms_at_1_nginx"] = round(one["nginx"]["p50_ms"] - one["direct"]["p50_ms"], 3)
    sse = results["sse"]
    out["sse_p99_proxy_over_nginx"] = _ratio(
        sse["proxy"]["delay_p99_ms"], sse.get("nginx", {}).get("delay_p99_ms")
    )
    out["sse_p99_proxy_over_direct"] = _ratio(
        sse["proxy"]["delay_p99_ms"], sse["direct"]["delay_p99_ms"]
    )
    return out


async def drain(queued: int) -> dict[str, Any]:
    """`queued` requests wait for a model that is not Ready; time until all are answered."""
    import aiohttp

    with backend(1, 0.0) as backend_port:
        endpoint = f"http://127.0.0.1:{backend_port}/v1"
        with proxy(backend_port, "--max-queue", str(queued)) as (port, control, _):
            url = f"http://127.0.0.1:{port}{PATH}"
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                cold = {"name": "m", "endpoint": endpoint, "ready": False}
                await session.post(f"http://127.0.0.1:{control}/control/put", json=cold)

                async def ask() -> None:
                    async with session.post(url, data=REQUEST_BODY) as answer:
                        await answer.read()
                        assert answer.status == 200, answer.status

                tasks = [asyncio.create_task(ask()) for _ in range(queued)]
                depth_url = f"http://127.0.0.1:{control}/control/depth?model=m"
                while True:
                    async with session.get(depth_url) as answer:
                        if (await answer.json())["depth"] >= queued:
                            break
                    await asyncio.sleep(0.05)
                started = time.perf_counter()
                warm = {**cold, "ready": True}
                await session.post(f"http://127.0.0.1:{control}/control/put", json=warm)
                await asyncio.gather(*tasks)
                elapsed = time.perf_counter() - started
    return {"queued": queued, "seconds_until_all_answered": round(elapsed, 3)}


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Load the proxy alone under pyinstrument; the profile goes to `args.output`."""
    with (
        backend(args.events, args.interval) as backend_port,
        proxy(backend_port, profile=args.output) as (proxy_port, _, _),
    ):
        figures = _load(proxy_port, args.connections, args.seconds)
    return {"profile": args.output, "load": figures}


# -- instructions per request -----------------------------------------------------------


async def _fixed_load(port: int, connections: int, per_connection: int) -> None:
    """`per_connection` requests one after another on each of `connections`."""
    request = request_bytes(port, REQUEST_BODY)

    async def one_connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = Answers()
        for _ in range(per_connection):
            writer.write(request)
            while not answers.feed(await reader.read(65536)):
                pass
        writer.close()

    await asyncio.gather(*(one_connection() for _ in range(connections)))


def instructions(connections: int, requests: int) -> dict[str, Any]:
    """User-space instructions per request of the proxy process, counted by valgrind
    (cachegrind, no cache simulation) while `connections` keep-alive connections send
    fixed requests to it: the difference between two runs, one with a sixth of the
    requests, so start-up and shutdown cancel out. Unlike requests per second, the
    figure does not move with what else runs on the machine."""
    if shutil.which("valgrind") is None:
        raise SystemExit("instructions: valgrind is not installed (Debian package valgrind)")
    per_connection = max(6, requests // connections)
    counted = {}
    with backend(1, 0.0) as backend_port:
        models = json.dumps([{"name": "m", "endpoint": f"http://127.0.0.1:{backend_port}/v1"}])
        for count in (per_connection // 6, per_connection):
            process = subprocess.Popen(
                [
                    "valgrind", "--tool=cachegrind", "--cache-sim=no",
                    "--cachegrind-out-file=/dev/null",
                    sys.executable, "-m", "tests.proxy.static_proxy", "--models", models,
                    "--host", "127.0.0.1", "--port", "0", "--log-level", "WARNING",
                    *PER_CLIENT_LIMITS_OFF,
                ],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            assert process.stdout is not None and process.stdin is not None
            port = int(process.stdout.readline().split()[1])
            with _loop_runner() as runner:
                runner.run(_fixed_load(port, connections, count))
            process.stdin.close()  # static_proxy stops when its stdin closes
            assert process.stderr is not None
            errors = process.stderr.read()
            process.wait(timeout=300)
            found = re.search(r"I\s+refs:\s+([\d,]+)", errors)
            assert found, errors[-2000:]
            counted[count] = int(found.group(1).replace(",", ""))
    small, large = sorted(counted)
    per_request = (counted[large] - counted[small]) / ((large - small) * connections)
    return {
        "connections": connections,
        "requests": large * connections,
        "proxy_instructions_per_request": round(per_request),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    bench = parser
    bench.add_argument("--seconds", type=float, default=4.0, help="per figure (default 4)")
    bench.add_argument("--streams", type=int, default=200)
    bench.add_argument("--events", type=int, default=40, help="events per stream")
    bench.add_argument("--interval", type=float, default=0.05, help="seconds between events")
    bench.add_argument("--queued", type=int, default=200)
    bench.add_argument(
        "--without-nginx", action="store_true", help="direct and proxy only (as without nginx)"
    )
    bench.add_argument(
        "--proxy-flag", action="append", default=[], help="extra flag for the proxy (repeatable)"
    )
    backend_cmd = sub.add_parser("backend")
    backend_cmd.add_argument("--events", type=int, default=40)
    backend_cmd.add_argument("--interval", type=float, default=0.05)
    load_cmd = sub.add_parser("load")
    load_cmd.add_argument("--port", type=int, required=True)
    load_cmd.add_argument("--connections", type=int, required=True)
    load_cmd.add_argument("--seconds", type=float, required=True)
    profile_cmd = sub.add_parser("profile", help="the proxy under pyinstrument, loaded")
    profile_cmd.add_argument("--connections", type=int, default=32)
    profile_cmd.add_argument("--seconds", type=float, default=5.0)
    profile_cmd.add_argument("--output", default="proxy-profile.txt")
    profile_cmd.add_argument("--events", type=int, default=1)
    profile_cmd.add_argument("--interval", type=float, default=0.0)
    count_cmd = sub.add_parser(
        "instructions", help="the proxy's instructions per request (valgrind)"
    )
    count_cmd.add_argument("--connections", type=int, default=32)
    count_cmd.add_argument("--requests", type=int, default=1920)
    sse_cmd = sub.add_parser("sse")
    sse_cmd.add_argument("--port", type=int, required=True)
    sse_cmd.add_argument("--streams", type=int, required=True)
    args = parser.parse_args()
    if args.command == "backend":
        with _loop_runner() as runner:
            runner.run(serve_backend(args.events, args.interval))
    elif args.command == "load":
        with _loop_runner() as runner:
            figures = runner.run(drive_load(args.port, args.connections, args.seconds, 1.0))
        print(json.dumps(figures))
    elif args.command == "profile":
        print(json.dumps(profile(args), indent=2))
    elif args.command == "instructions":
        print(json.dumps(instructions(args.connections, args.requests), indent=2))
    elif args.command == "sse":
        with _loop_runner() as runner:
            print(json.dumps(runner.run(drive_streams(args.port, args.streams))))
    else:
        print(json.dumps(measure(args), indent=2))


if __name__ == "__main__":
    main()
