"""The proxy against hostile clients and backends, over real sockets.

The proxy runs as its own process (`static_proxy`: the production flags, server and
event loop over a static model list) so each bound is exercised through its flag,
its memory and descriptors can be read from /proc, and its log checked. Every
refusal must come with the expected status and an OpenAI-shaped body, and the
process must end up with the tasks and descriptors it started with.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
from yarl import URL

from .harness import BackendProcess, StaticProxy, async_test, eventually

MiB = 1024 * 1024

BOUNDED_FLAGS = (
    "--max-body-bytes", str(1 * MiB),
    "--max-buffered-bytes", str(4 * MiB),
    "--client-header-timeout", "1s",
    "--client-body-timeout", "1s",
    "--client-idle-timeout", "1s",
    "--max-queue", "2",
    "--max-queue-total", "3",
    "--backend-connect-timeout", "1s",
    "--backend-headers-timeout", "2s",
    "--backend-read-timeout", "1s",
    "--retry-after", "2",
    "--min-queue-wait", "30s",
)  # fmt: skip


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- raw HTTP ----------------------------------------------------------------------


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        """The OpenAI error object; fails unless the body has exactly that shape."""
        assert self.headers.get("content-type", "").startswith("application/json"), self
        payload = json.loads(self.body)
        assert set(payload) == {"error"}, payload
        assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
        return dict(payload["error"])


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if status < 200 or status in (204, 304):
        body = b""  # no body, by definition
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
    else:
        body = await reader.read()
    return Answer(status, headers, body)


def request_head(path: str, *, length: int | None = None, extra: str = "") -> bytes:
    framing = f"Content-Length: {length}\r\n" if length is not None else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        f"{framing}{extra}\r\n"
    ).encode()


@asynccontextmanager
async def connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """True once the other side closed the connection (data before that is skipped)."""
    try:
        while await asyncio.wait_for(reader.read(65536), 20):
            pass
    except (ConnectionError, TimeoutError):
        return False
    return True


@asynccontextmanager
async def scripted_backend(answer: bytes) -> AsyncIterator[int]:
    """A backend that reads one request per connection and writes `answer` as given."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            match = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(match.group(1)) if match else 0)
            writer.write(answer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


# -- the proxy under test ----------------------------------------------------------


@pytest.fixture(scope="module")
def bounded(
    backends: dict[str, BackendProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StaticProxy]:
    alpha = backends["alpha"].endpoint
    models = [
        {"name": "alpha", "endpoint": alpha},
        {"name": "cold", "endpoint": alpha, "ready": False},
        {"name": "cold2", "endpoint": alpha, "ready": False},
        {"name": "down", "endpoint": f"http://127.0.0.1:{_closed_port()}/v1"},
    ]
    proxy = StaticProxy(models, *BOUNDED_FLAGS, log_path=tmp_path_factory.mktemp("p") / "log")
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def baseline(bounded: StaticProxy) -> dict[str, int]:
    """Tasks and descriptors of the idle proxy, before any hostile test ran."""

    async def measure() -> int:
        async with aiohttp.ClientSession() as session:
            return await bounded.tasks(session)

    return {"tasks": asyncio.run(measure()), "descriptors": bounded.descriptors()}


async def post(
    session: aiohttp.ClientSession, proxy: StaticProxy, payload: Any, **kwargs: Any
) -> tuple[int, dict[str, str], Any]:
    async with session.post(f"{proxy.url}/v1/chat/completions", json=payload, **kwargs) as response:
        return response.status, dict(response.headers), await response.json()


# -- request bodies ----------------------------------------------------------------


@async_test
async def test_a_body_over_the_limit_is_refused_before_it_is_sent(
    bounded: StaticProxy, baseline: dict[str, int]
) -> None:
    async with connection(bounded.port) as (reader, writer):
        writer.write(request_head("/v1/embeddings", length=2 * MiB))
        answer = await read_answer(reader)  # not one byte of the body was sent
    assert answer.status == 413
    error = answer.error()
    assert error["code"] == "request_too_large"
    assert str(MiB) in error["message"] and "--max-body-bytes" in error["message"]


@async_test
async def test_a_chunked_body_over_the_limit_is_cut_off_while_it_arrives(
    bounded: StaticProxy,
) -> None:
    async with connection(bounded.port) as (reader, writer):
        writer.write(request_head("/v1/embeddings", extra="Transfer-Encoding: chunked\r\n"))
        piece = b'{"model": "alpha", "input": "' + b"x" * (64 * 1024)
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        filler = b"y" * (64 * 1024)
        answer: Answer | None = None
        for _ in range(40):  # 2.5 MiB at most, then the proxy must have answered
            writer.write(b"%x\r\n%s\r\n" % (len(filler), filler))
            try:
                await writer.drain()
                answer = await asyncio.wait_for(read_answer(reader), 0.05)
                break
            except (TimeoutError, ConnectionError):
                continue
        if answer is None:
            answer = await asyncio.wait_for(read_answer(reader), 20)
    assert answer.status == 413
    assert answer.error()["code"] == "request_too_large"


@async_test
async def test_expect_100_continue_refuses_a_large_body_before_it_is_sent(
    bounded: StaticProxy,
) -> None:
    expect = "Expect: 100-continue\r\n"
    async with connection(bounded.port) as (reader, writer):
        writer.write(request_head("/v1/embeddings", length=2 * MiB, extra=expect))
        answer = await asyncio.wait_for(read_answer(reader), 20)
    assert answer.status == 413
    assert answer.error()["code"] == "request_too_large"
    body = b'{"model": "alpha"}'
    async with connection(bounded.port) as (reader, writer):
        writer.write(request_head("/v1/embeddings", length=len(body), extra=expect))
        assert (await asyncio.wait_for(read_answer(reader), 20)).status == 100
        writer.write(body)
        assert (await asyncio.wait_for(read_answer(reader), 20)).status == 200


@async_test
async def test_json_nested_100k_deep_is_a_400_not_a_500(bounded: StaticProxy) -> None:
    body = b'{"model": "alpha", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{bounded.url}/v1/chat/completions", data=body) as response,
    ):
        status, payload = response.status, await response.json()
    assert status == 400
    assert payload["error"]["code"] == "invalid_request"
    assert "nested too deeply" in payload["error"]["message"]


@async_test
async def test_an_unknown_model_is_refused_before_its_body_is_read(bounded: StaticProxy) -> None:
    async with connection(bounded.port) as (reader, writer):
        writer.write(request_head("/v1/embeddings", length=900 * 1024))
        writer.write(b'{"model": "nobody-serves-this", "input": "')  # and nothing more
        answer = await asyncio.wait_for(read_answer(reader), 20)
    assert answer.status == 404
    error = answer.error()
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert answer.headers.get("connection") == "close"


@async_test
async def test_a_body_that_stops_arriving_is_a_408(bounded: StaticProxy) -> None:
    async with connection(bounded.port) as (reader, writer):
        writer.write(request_head("/v1/chat/completions", length=100) + b'{"model": "a')
        answer = await asyncio.wait_for(read_answer(reader), 20)
    assert answer.status == 408
    assert answer.error()["code"] == "request_timeout"
    assert "--client-body-timeout" in answer.error()["message"]


# -- client connections ------------------------------------------------------------


@async_test
async def test_half_sent_heads_are_closed_after_the_header_timeout(
    bounded: StaticProxy, baseline: dict[str, int]
) -> None:
    loris = [await asyncio.open_connection("127.0.0.1", bounded.port) for _ in range(30)]
    for _, writer in loris:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n")
    closed = await asyncio.gather(*(closed_by_peer(reader) for reader, _ in loris))
    assert all(closed)
    for _, writer in loris:
        writer.close()
    await eventually(
        lambda: bounded.descriptors() <= baseline["descriptors"] + 2,
        what="the slow-loris sockets to be released",
        attempts=400,
        interval=0.05,
    )


@async_test
async def test_an_idle_keep_alive_connection_is_closed(bounded: StaticProxy) -> None:
    async with connection(bounded.port) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
        assert (await read_answer(reader)).status == 200
        assert await closed_by_peer(reader)


# -- queues ------------------------------------------------------------------------


@async_test
async def test_queues_are_bounded_per_model_and_overall_with_spread_retry_afters(
    bounded: StaticProxy,
) -> None:
    async with aiohttp.ClientSession() as session:
        waiting = [asyncio.create_task(post(session, bounded, {"model": "cold"})) for _ in range(2)]
        await eventually(lambda: bounded.depth(session, "cold"), what="2 queued")
        await eventually(
            lambda: _is(bounded.depth(session, "cold"), 2), what="both queued for cold"
        )
        retry_afters = set()
        for _ in range(12):
            status, headers, payload = await post(session, bounded, {"model": "cold"})
            assert status == 503
            assert payload["error"]["code"] == "queue_full"
            assert "2 for this model" in payload["error"]["message"]
            retry_afters.add(int(headers["Retry-After"]))
        # The expected wait (about the model's 60 s cold start) plus up to as much
        # again: spread out, so refused clients do not all come back together.
        assert len(retry_afters) > 1
        assert all(2 <= value <= 121 for value in retry_afters), retry_afters

        waiting.append(asyncio.create_task(post(session, bounded, {"model": "cold2"})))
        await eventually(lambda: _is(bounded.depth(session, "cold2"), 1), what="cold2 queued")
        status, _, payload = await post(session, bounded, {"model": "cold2"})
        assert status == 503
        assert "3 in all" in payload["error"]["message"]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await eventually(lambda: _is(bounded.depth(session, "cold"), 0), what="cold drained")


async def _is(awaitable: Any, expected: int) -> bool:
    return bool(await awaitable == expected)


# -- backends ----------------------------------------------------------------------


@async_test
async def test_a_backend_without_headers_in_time_is_a_504(bounded: StaticProxy) -> None:
    async with aiohttp.ClientSession() as session:
        status, _, payload = await post(session, bounded, {"model": "alpha", "delay": 3})
    assert status == 504
    assert payload["error"]["code"] == "backend_timeout"
    assert "127.0.0.1" not in payload["error"]["message"]


@async_test
async def test_a_backend_that_never_accepts_is_a_502_after_the_connect_timeout(
    bounded: StaticProxy,
) -> None:
    # A listening socket whose accept queue is full drops further SYNs: connecting
    # hangs, as it does to a black-holed address.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        try:
            async with aiohttp.ClientSession() as session:
                endpoint = f"http://127.0.0.1:{port}/v1"
                await bounded.put(session, {"name": "black-hole", "endpoint": endpoint})
                status, _, payload = await post(session, bounded, {"model": "black-hole"})
        finally:
            for filler in fillers:
                filler.close()
    assert status == 502
    assert payload["error"]["code"] == "backend_unavailable"
    assert "black-hole at http://127.0.0.1" in bounded.log(), "the log names the backend"
    assert "Connection timeout" in bounded.log()


@async_test
async def test_a_backend_silent_mid_stream_ends_it_with_an_error_event(
    bounded: StaticProxy, backends: dict[str, BackendProcess]
) -> None:
    tag = _tag()
    payload = {"model": "alpha", "stream": True, "hold": True, "tag": tag}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{bounded.url}/v1/chat/completions", json=payload) as response:
            assert response.status == 200
            received = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in response.content.iter_any():
                    received += chunk
        await backends["alpha"].release(session, tag)
    events = [e for e in received.decode().split("\n\n") if e]
    assert json.loads(events[0].removeprefix("data: "))["index"] == 0
    error = json.loads(events[-1].removeprefix("data: "))["error"]
    assert error["code"] == "stream_cut"
    assert "data: [DONE]" not in events


@async_test
async def test_garbage_and_oversized_answers_are_502s_and_counted(bounded: StaticProxy) -> None:
    answers = {
        "garbage": b"THIS IS NOT HTTP\r\n\r\n",
        "oversized": b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * 200_000 + b"\r\n\r\n",
    }
    async with aiohttp.ClientSession() as session:
        for name, answer in answers.items():
            async with scripted_backend(answer) as port:
                endpoint = f"http://127.0.0.1:{port}/v1"
                await bounded.put(session, {"name": name, "endpoint": endpoint})
                status, _, payload = await post(session, bounded, {"model": name})
            assert status == 502, name
            assert payload["error"]["code"] == "backend_unavailable"
            assert str(port) not in payload["error"]["message"], "no backend address"
        async with session.get(f"{bounded.url}/metrics") as response:
            metrics = await response.text()
    for name in answers:
        sample = (
            f'flexinfer_proxy_requests_total{{model="test/{name}",outcome="backend_unavailable"}}'
        )
        assert f"{sample} 1.0" in metrics


@async_test
async def test_a_ready_backend_that_is_not_listening_yet_is_tried_again(
    bounded: StaticProxy,
) -> None:
    port = _closed_port()
    endpoint = f"http://127.0.0.1:{port}/v1"
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
        b'{"ok": "1"}'
    )
    async with aiohttp.ClientSession() as session:
        await bounded.put(session, {"name": "late", "endpoint": endpoint, "ready": False})
        request = asyncio.create_task(post(session, bounded, {"model": "late"}))
        await eventually(lambda: _is(bounded.depth(session, "late"), 1), what="late queued")
        # Ready (the pod's readiness says so), but nothing listens yet: refused.
        await bounded.put(session, {"name": "late", "endpoint": endpoint, "ready": True})
        await asyncio.sleep(0.3)
        assert not request.done(), "refused connections are retried within the wait"

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", port)
        try:
            status, _, payload = await request
        finally:
            server.close()
    assert (status, payload) == (200, {"ok": "1"})


@async_test
async def test_headers_the_connection_header_names_are_dropped_both_ways(
    bounded: StaticProxy, backends: dict[str, BackendProcess]
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            URL(f"{bounded.url}/v1/chat/completions?q=%23hash&x=%2F", encoded=True),
            json={"model": "alpha"},
            headers={
                "Connection": "keep-alive, X-Hop",
                "X-Hop": "private",
                "X-Forwarded-For": "203.0.113.7",
            },
        ) as response:
            echo = await response.json()
        seen = {k.lower(): v for k, v in echo["headers"].items()}
        assert echo["query"] == "q=%23hash&x=%2F", "the raw query, '#' and all"
        assert "x-hop" not in seen
        assert seen["x-forwarded-for"] == "127.0.0.1", "the address the proxy saw, only"

        answer = (
            b"HTTP/1.1 200 OK\r\nConnection: X-Backend-Hop\r\nX-Backend-Hop: secret\r\n"
            b"X-Kept: yes\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        )
        async with scripted_backend(answer) as port:
            endpoint = f"http://127.0.0.1:{port}/v1"
            await bounded.put(session, {"name": "hop", "endpoint": endpoint})
            status, headers, _ = await post(session, bounded, {"model": "hop"})
    assert status == 200
    assert headers["X-Kept"] == "yes"
    assert "X-Backend-Hop" not in headers


@async_test
async def test_a_client_that_leaves_mid_body_is_counted_as_gone(bounded: StaticProxy) -> None:
    async with connection(bounded.port) as (_, writer):
        writer.write(request_head("/v1/embeddings", length=600 * 1024))
        writer.write(b'{"input": "' + b"x" * (100 * 1024))
        await writer.drain()
    sample = 'flexinfer_proxy_requests_total{model="",outcome="client_disconnected"} 1.0'

    async def counted() -> bool:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{bounded.url}/metrics") as response,
        ):
            return sample in await response.text()

    await eventually(counted, what="the departure to be counted", attempts=200, interval=0.05)


@async_test
async def test_requests_that_are_not_http_get_a_400_and_no_traceback(bounded: StaticProxy) -> None:
    for garbage in (b"\x16\x03\x01 TLS hello\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"):
        async with connection(bounded.port) as (reader, writer):
            writer.write(garbage)
            answer = await asyncio.wait_for(read_answer(reader), 20)
        assert answer.status == 400
    log = bounded.log()
    assert "Traceback" not in log
    assert " ERROR " not in log


@async_test
async def test_nothing_is_left_behind(bounded: StaticProxy, baseline: dict[str, int]) -> None:
    """Runs after the module's other tests (pytest keeps file order)."""
    async with aiohttp.ClientSession() as session:
        await eventually(
            lambda: _at_most(bounded.tasks(session), baseline["tasks"]),
            what="the proxy's tasks to go back to what it had",
            attempts=300,
            interval=0.1,
        )
    # Pooled backend connections close after --backend-idle-timeout (4 s).
    await eventually(
        lambda: bounded.descriptors() <= baseline["descriptors"],
        what=f"descriptors back to {baseline['descriptors']}",
        attempts=300,
        interval=0.1,
    )


async def _at_most(awaitable: Any, limit: int) -> bool:
    return bool(await awaitable <= limit)


# -- memory ------------------------------------------------------------------------


@async_test
async def test_sixteen_50_mb_bodies_at_once_stay_under_512_mib(
    backends: dict[str, BackendProcess], tmp_path: Path
) -> None:
    models = [{"name": "alpha", "endpoint": backends["alpha"].endpoint}]
    proxy = StaticProxy(models, "--max-body-bytes", str(64 * MiB), log_path=tmp_path / "log")
    try:
        body = b'{"input": "' + b"t" * (50 * 1000 * 1000) + b'", "model": "alpha"}'
        async with aiohttp.ClientSession() as session:

            async def send() -> tuple[int, Any]:
                async with session.post(f"{proxy.url}/v1/embeddings", data=body) as response:
                    return response.status, await response.json()

            answers = await asyncio.gather(*(send() for _ in range(16)))
            peak = proxy.peak_rss_bytes()
    finally:
        proxy.stop()
    statuses = sorted(status for status, _ in answers)
    assert set(statuses) <= {200, 503}, statuses
    assert 200 in statuses, "the budget still lets bodies through"
    for status, payload in answers:
        if status == 503:
            assert payload["error"]["code"] == "proxy_busy"
        else:
            assert payload["received_model"] == "alpha"
    assert peak < 512 * MiB, f"peak RSS {peak / MiB:.0f} MiB"


# -- the connection cap ------------------------------------------------------------


@async_test
async def test_at_the_connection_cap_idle_ones_make_room_and_busy_ones_refuse(
    backends: dict[str, BackendProcess], tmp_path: Path
) -> None:
    alpha = backends["alpha"]
    models = [{"name": "alpha", "endpoint": alpha.endpoint}]
    proxy = StaticProxy(models, "--max-connections", "8", log_path=tmp_path / "log")
    try:
        # Eight idle keep-alive connections fill the cap...
        idle = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(8)]
        for reader, writer in idle:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
            assert (await read_answer(reader)).status == 200
        # ...and a newcomer is still served: the longest idle one is closed for it.
        async with aiohttp.ClientSession() as session:
            status, _, _ = await post(session, proxy, {"model": "alpha"})
            assert status == 200
        assert await closed_by_peer(idle[0][0])
        for _, writer in idle:
            writer.close()

        # Eight requests in progress: nothing to make room with, the newcomer gets a 503.
        tags = [_tag() for _ in range(8)]
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True)
        ) as session:
            streams = [
                await session.post(
                    f"{proxy.url}/v1/chat/completions",
                    json={"model": "alpha", "stream": True, "hold": True, "tag": tag},
                )
                for tag in tags
            ]
            async with connection(proxy.port) as (reader, writer):
                answer = await asyncio.wait_for(read_answer(reader), 20)
            assert answer.status == 503
            assert answer.error()["code"] == "too_many_connections"
            for tag in tags:
                await alpha.release(session, tag)
            for stream in streams:
                assert (await stream.read()).endswith(b"data: [DONE]\n\n")
                stream.release()
            async with session.get(f"{proxy.url}/metrics") as response:
                metrics = await response.text()
        assert 'flexinfer_proxy_client_connections_closed_total{reason="evicted"} 1.0' in metrics
        assert 'flexinfer_proxy_client_connections_closed_total{reason="refused"} 1.0' in metrics
    finally:
        proxy.stop()
