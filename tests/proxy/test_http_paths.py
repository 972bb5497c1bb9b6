"""The proxy's own HTTP/1.1 paths over real sockets: the upstream pool and the server.

Backends here are scripted asyncio servers in the test's process, so each test
decides the exact bytes a backend answers with (framing, `Connection: close`, a
close between requests) and counts the connections it was given. The proxy runs
in-process (`running_proxy`), so the pool's counters can be read between requests.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from prometheus_client import CollectorRegistry

from flexinfer_proxy import http_server, model_field
from flexinfer_proxy.app import Proxy, ProxyConfig, serve
from flexinfer_proxy.directory import InMemoryDirectory
from flexinfer_proxy.resolve_file import HostsFileResolver

from .harness import RecordingSink, RunningProxy, async_test, entry, eventually, running_proxy
from .test_hostile import Answer, closed_by_peer, connection, read_answer, request_head

COMPLETION = b'{"model": "m", "choices": []}'
MiB = 1024 * 1024


@attrs.define
class Scripted:
    """A backend that answers each request with what `answer(index, body)` gives."""

    port: int = 0
    connections: int = 0
    requests: list[bytes] = attrs.field(factory=list)  # the bodies, in arrival order
    heads: list[bytes] = attrs.field(factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@asynccontextmanager
async def scripted(
    answer: Callable[[int, bytes], bytes | list[bytes]], *, close_after_each: bool = False
) -> AsyncIterator[Scripted]:
    """`answer` may give pieces: they are written a moment apart (a stream)."""
    backend = Scripted()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                match = re.search(rb"(?i)content-length:\s*(\d+)", head)
                body = await reader.readexactly(int(match.group(1)) if match else 0)
                backend.requests.append(body)
                backend.heads.append(head)
                pieces = answer(len(backend.requests) - 1, body)
                for piece in [pieces] if isinstance(pieces, bytes) else pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.02)
                if close_after_each:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    backend.port = int(server.sockets[0].getsockname()[1])
    try:
        yield backend
    finally:
        server.close()


def json_answer(body: bytes = COMPLETION, *, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
        % (extra, len(body), body)
    )


def chunked(*pieces: bytes, content_type: bytes = b"text/event-stream") -> bytes:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n%s0\r\n\r\n"
        % (content_type, chunks)
    )


async def chat(url: str, model: str = "m", **fields: Any) -> Answer:
    """One request on its own connection, read with the hostile tests' raw reader."""
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"model": model, **fields}).encode()
    async with connection(port) as (reader, writer):
        writer.write(request_head("/v1/chat/completions", length=len(body)) + body)
        return await asyncio.wait_for(read_answer(reader), 20)


# -- the upstream pool ---------------------------------------------------------------


@async_test
async def test_backend_connections_are_reused_across_requests() -> None:
    async with (
        scripted(lambda index, body: json_answer()) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        for _ in range(5):
            answer = await chat(p.url)
            assert (answer.status, answer.body) == (200, COMPLETION)
        assert backend.connections == 1
        assert p.proxy.pool is not None and p.proxy.pool.connects == 1


@async_test
async def test_a_backend_that_closes_between_requests_gets_a_new_connection() -> None:
    # Keep-alive by its headers, but it closes after each answer (as a server whose
    # keep-alive timeout is shorter than the pool's does): the close is seen and that
    # connection is never used again.
    async with (
        scripted(lambda index, body: json_answer(), close_after_each=True) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        pool = p.proxy.pool
        assert pool is not None
        for round_ in range(1, 4):
            answer = await chat(p.url)
            assert (answer.status, answer.body) == (200, COMPLETION)
            await eventually(lambda: pool.idle_connections == 0, what="the close to be seen")
            assert backend.connections == round_
        assert p.metric("flexinfer_proxy_requests_total", model="test/m", outcome="served") == 3


@asynccontextmanager
async def closing_on_reuse(
    second_answer: bytes = b"", *, first_answer: bytes | None = None
) -> AsyncIterator[Scripted]:
    """Answers the first request of each connection (`first_answer`, a JSON completion
    unless given); on the second it writes `second_answer` (nothing: its keep-alive
    close crossed the request) and closes."""
    backend = Scripted()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend.connections += 1
        try:
            for index in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                match = re.search(rb"(?i)content-length:\s*(\d+)", head)
                backend.requests.append(await reader.readexactly(int(match.group(1))))
                first = json_answer() if first_answer is None else first_answer
                writer.write(first if index == 0 else second_answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    backend.port = int(server.sockets[0].getsockname()[1])
    try:
        yield backend
    finally:
        server.close()


@async_test
async def test_a_post_is_never_sent_twice_when_a_reused_connection_closes_under_it() -> None:
    """The backend closes a pooled connection just as a request crosses it, without a
    byte of an answer: it may have started the request, so it is not sent again (a
    second completion, twice the GPU work); the client gets a 502 (issue 22)."""
    async with (
        closing_on_reuse() as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        assert (await chat(p.url)).status == 200
        answer = await chat(p.url)
        assert (answer.status, answer.error()["code"]) == (502, "backend_unavailable")
        assert (backend.connections, len(backend.requests)) == (1, 2), "sent once"
        assert (await chat(p.url)).status == 200, "then a new connection"
        assert backend.connections == 2


@async_test
async def test_a_connection_that_carried_an_event_stream_is_not_reused() -> None:
    """llama.cpp's server closes the connection after every streamed answer although
    its headers say keep-alive; the close can cross the next request (the demo's warm
    request met it). Such a connection is not pooled: the next request gets its own,
    and both are answered."""
    stream = chunked(b'data: {"choices": []}\n\n', b"data: [DONE]\n\n").replace(
        b"Transfer-Encoding", b"Keep-Alive: timeout=5, max=100\r\nTransfer-Encoding"
    )
    async with (
        closing_on_reuse(first_answer=stream) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        for _ in range(2):
            answer = await chat(p.url, stream=True)
            assert (answer.status, answer.body.endswith(b"data: [DONE]\n\n")) == (200, True)
        assert (backend.connections, len(backend.requests)) == (2, 2)


@async_test
async def test_a_reused_connection_whose_answer_began_is_not_sent_again() -> None:
    """Once a byte of an answer came back the backend took the request: no second try."""
    async with (
        closing_on_reuse(second_answer=b"HTTP/1.1 200 OK\r\nContent-") as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        assert (await chat(p.url)).status == 200
        answer = await chat(p.url)
        assert answer.status == 502
        assert backend.connections == 1 and len(backend.requests) == 2


@async_test
async def test_a_connection_is_not_reused_past_the_backends_keep_alive() -> None:
    """`Keep-Alive: timeout=1` (llama.cpp's server sends `timeout=5`) leaves no second
    of margin: such a connection is never pooled, whatever --backend-idle-timeout."""
    alive_1s = json_answer(extra=b"Keep-Alive: timeout=1, max=100\r\n")
    async with (
        scripted(lambda index, body: alive_1s) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        for _ in range(3):
            assert (await chat(p.url)).status == 200
        assert backend.connections == 3


@async_test
async def test_a_connection_idle_past_the_backend_idle_timeout_is_not_reused() -> None:
    config = ProxyConfig(backend_idle_timeout=0.2)
    async with (
        scripted(lambda index, body: json_answer()) as backend,
        running_proxy([entry("m", backend.endpoint)], config=config) as p,
    ):
        assert (await chat(p.url)).status == 200
        await asyncio.sleep(0.5)  # idle at least this long: past the 0.2 s limit
        assert (await chat(p.url)).status == 200
        assert backend.connections == 2


@async_test
async def test_an_answer_with_connection_close_is_not_reused() -> None:
    async with (
        scripted(lambda index, body: json_answer(extra=b"Connection: close\r\n")) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        for _ in range(2):
            assert (await chat(p.url)).status == 200
        assert p.proxy.pool is not None and p.proxy.pool.connects == 2


@async_test
async def test_chunked_close_delimited_and_large_answers_arrive_whole() -> None:
    events = [b'data: {"i": %d}\n\n' % i for i in range(50)] + [b"data: [DONE]\n\n"]
    large = json.dumps({"model": "m", "data": "x" * (3 * 1024 * 1024)}).encode()
    answers = {
        # chunked, many chunks: re-chunked to the client, nothing lost or merged wrong
        "chunked": chunked(*events),
        # neither length nor chunks: the backend's close ends it
        "close-delimited": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
        # larger than every buffer of the path: relayed under backpressure
        "large": json_answer(large),
        # informational answers before the real one are skipped
        "early-hints": b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + json_answer(),
    }
    expected = {
        "chunked": b"".join(events),
        "close-delimited": b"until the end",
        "large": large,
        "early-hints": COMPLETION,
    }
    for name, raw in answers.items():
        close = name == "close-delimited"
        async with (
            scripted(lambda index, body, raw=raw: raw, close_after_each=close) as backend,
            running_proxy([entry("m", backend.endpoint)]) as p,
        ):
            answer = await chat(p.url)
        assert answer.status == 200, name
        assert answer.body == expected[name], name


@async_test
async def test_the_request_reaches_the_backend_as_sent() -> None:
    async with (
        scripted(lambda index, body: json_answer()) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        large = "y" * (2 * 1024 * 1024)  # sent in slices, past every socket buffer
        await chat(p.url, messages=[], note="é", blob=large)
    sent = json.loads(backend.requests[0])
    assert (sent["model"], sent["note"], len(sent["blob"])) == ("m", "é", len(large))


@async_test
async def test_expect_is_met_by_the_proxy_and_not_sent_on() -> None:
    async with (
        scripted(lambda index, body: json_answer()) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        port = int(p.url.rsplit(":", 1)[1])
        body = b'{"model": "m"}'
        expect = "Expect: 100-continue\r\n"
        async with connection(port) as (reader, writer):
            writer.write(request_head("/v1/chat/completions", length=len(body), extra=expect))
            assert (await asyncio.wait_for(read_answer(reader), 20)).status == 100
            writer.write(body)
            assert (await asyncio.wait_for(read_answer(reader), 20)).status == 200
    assert backend.requests == [body]
    assert b"expect" not in backend.heads[0].lower()


# -- the server ------------------------------------------------------------------------


@async_test
async def test_pipelined_requests_are_answered_in_order() -> None:
    async with (
        scripted(lambda index, body: json_answer(body)) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        port = int(p.url.rsplit(":", 1)[1])
        bodies = [json.dumps({"model": "m", "n": n}).encode() for n in range(3)]
        async with connection(port) as (reader, writer):
            writer.write(
                b"".join(request_head("/v1/chat/completions", length=len(b)) + b for b in bodies)
                + b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n"
            )
            answers = [await asyncio.wait_for(read_answer(reader), 20) for _ in range(4)]
    assert [json.loads(a.body)["n"] for a in answers[:3]] == [0, 1, 2]
    assert json.loads(answers[3].body) == {"status": "ok"}


@async_test
async def test_a_head_and_body_arriving_byte_by_byte_are_read() -> None:
    async with (
        scripted(lambda index, body: json_answer(body)) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        port = int(p.url.rsplit(":", 1)[1])
        body = b'{"model": "m", "n": 7}'
        raw = request_head("/v1/chat/completions", length=len(body)) + body
        async with connection(port) as (reader, writer):
            for index in range(len(raw)):
                writer.write(raw[index : index + 1])
                await writer.drain()
            answer = await asyncio.wait_for(read_answer(reader), 20)
    assert (answer.status, json.loads(answer.body)["n"]) == (200, 7)


@async_test
async def test_a_chunked_request_body_is_read_and_sent_with_its_length() -> None:
    async with (
        scripted(lambda index, body: json_answer()) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        port = int(p.url.rsplit(":", 1)[1])
        pieces = [b'{"model": ', b'"m", "x": ', b'"chunks"}']
        async with connection(port) as (reader, writer):
            writer.write(
                request_head("/v1/chat/completions", extra="Transfer-Encoding: chunked\r\n")
            )
            for piece in pieces:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            writer.write(b"0\r\n\r\n")
            answer = await asyncio.wait_for(read_answer(reader), 20)
    assert answer.status == 200
    assert backend.requests == [b"".join(pieces)]


@async_test
async def test_a_head_over_the_limit_is_a_431_and_the_connection_closes() -> None:
    config = ProxyConfig(max_header_bytes=4096)
    async with running_proxy([entry("m", "http://127.0.0.1:9/v1")], config=config) as p:
        port = int(p.url.rsplit(":", 1)[1])
        # In one piece, and in pieces (a header line that never ends).
        for pieces in (
            [b"X-Big: " + b"b" * 5000 + b"\r\n\r\n"],
            [b"X-Endless: "] + [b"e" * 1000] * 6,
        ):
            async with connection(port) as (reader, writer):
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n")
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                answer = await asyncio.wait_for(read_answer(reader), 20)
                assert answer.status == 431
                error = answer.error()
                assert error["code"] == "request_header_too_large"
                assert "4096" in error["message"] and "--max-header-bytes" in error["message"]
                assert answer.headers["connection"] == "close"
                assert await asyncio.wait_for(reader.read(), 20) == b""
        # A head just under the limit is served.
        async with connection(port) as (reader, writer):
            writer.write(
                b"GET /healthz HTTP/1.1\r\nHost: proxy\r\nX-Ok: " + b"o" * 3000 + b"\r\n\r\n"
            )
            assert (await asyncio.wait_for(read_answer(reader), 20)).status == 200


@async_test
async def test_http_1_0_clients_get_keep_alive_only_when_asked() -> None:
    events = [b"data: 1\n\n", b"data: [DONE]\n\n"]
    stream = chunked(*events)
    head_end = stream.index(b"\r\n\r\n") + 4
    async with (
        scripted(lambda index, body: [stream[:head_end], stream[head_end:]]) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        port = int(p.url.rsplit(":", 1)[1])
        async with connection(port) as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            answer = await asyncio.wait_for(read_answer(reader), 20)
            assert (answer.status, answer.headers["connection"]) == (200, "keep-alive")
            # A streamed answer cannot be chunked for HTTP/1.0: it ends with the close.
            body = b'{"model": "m", "stream": true}'
            writer.write(
                b"POST /v1/chat/completions HTTP/1.0\r\nConnection: keep-alive\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
            rest = await asyncio.wait_for(reader.read(), 20)
    assert b"transfer-encoding" not in head.lower()
    assert b"connection: close" in head.lower()
    assert rest == b"".join(events)


@async_test
async def test_a_body_whose_framing_breaks_gets_one_answer_and_the_close() -> None:
    async with running_proxy([entry("m", "http://127.0.0.1:9/v1")]) as p:
        port = int(p.url.rsplit(":", 1)[1])
        async with connection(port) as (reader, writer):
            writer.write(
                request_head("/v1/chat/completions", extra="Transfer-Encoding: chunked\r\n")
            )
            writer.write(b'6\r\n{"mode\r\nnot a chunk size\r\n')
            answer = await asyncio.wait_for(read_answer(reader), 20)
            rest = await asyncio.wait_for(reader.read(), 20)
    assert answer.status == 400
    assert "cut off" in answer.error()["message"]
    assert rest == b"", "one answer, then the close"
    outcome = {"model": "", "outcome": "client_disconnected"}
    assert p.metric("flexinfer_proxy_requests_total", **outcome) == 1


@async_test
async def test_backend_names_are_resolved_through_the_given_resolver(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 backend.team.svc\n")
    async with scripted(lambda index, body: json_answer()) as backend:
        endpoint = f"http://backend.team.svc:{backend.port}/v1"
        proxy = Proxy(
            InMemoryDirectory(
                [entry("m", endpoint), entry("nowhere", "http://nowhere.invalid/v1")]
            ),
            RecordingSink(),
            registry=CollectorRegistry(),
            resolver=HostsFileResolver(hosts),
        )
        server, port = await serve(proxy, host="127.0.0.1", port=0)
        try:
            answer = await chat(f"http://127.0.0.1:{port}")
            assert (answer.status, answer.body) == (200, COMPLETION)
            assert b"host: backend.team.svc:%d" % backend.port in backend.heads[0].lower()
            # A name nobody knows: nothing could be sent, a 502.
            assert (await chat(f"http://127.0.0.1:{port}", model="nowhere")).status == 502
        finally:
            await server.cleanup()


def test_a_body_read_whole_never_pauses_the_reading_it_waits_for() -> None:
    # `RequestBody.read()` takes nothing until the body's end; were reading paused
    # below that size, a body read whole would wait forever.
    assert http_server.BODY_HIGH_WATER >= model_field.SMALL_BODY_BYTES


@async_test
async def test_the_access_log_has_a_line_per_request_when_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="flexinfer.proxy.access")
    async with (
        scripted(lambda index, body: json_answer()) as backend,
        running_proxy([entry("m", backend.endpoint)], config=ProxyConfig(access_log=True)) as p,
    ):
        await chat(p.url)
        async with p.session.get(f"{p.url}/nowhere?x=1") as answer:
            assert answer.status == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "flexinfer.proxy.access"]
    assert len(lines) == 2, lines
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in lines[0]
    assert '"GET /nowhere?x=1 HTTP/1.1" 404' in lines[1]


@async_test
async def test_without_the_flag_nothing_is_logged_per_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="flexinfer.proxy.access")
    async with (
        scripted(lambda index, body: json_answer()) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        await chat(p.url)
    assert not [r for r in caplog.records if r.name == "flexinfer.proxy.access"]


@async_test
async def test_an_upgrade_offer_is_declined_and_the_request_served() -> None:
    # curl --http2 on http:// offers h2c this way; RFC 9110 7.8 lets a server ignore it.
    offer = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABk\r\n"
    async with (
        scripted(lambda index, body: json_answer(body)) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        port = int(p.url.rsplit(":", 1)[1])
        async with connection(port) as (reader, writer):
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: proxy\r\n{offer}\r\n".encode())
            answer = await asyncio.wait_for(read_answer(reader), 20)
            assert (answer.status, answer.headers["connection"]) == (200, "close")
            assert await asyncio.wait_for(reader.read(), 20) == b""
        body = b'{"model": "m", "n": 1}'
        async with connection(port) as (reader, writer):
            head = request_head("/v1/chat/completions", length=len(body), extra=offer)
            writer.write(head + body[:5])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(body[5:] + b"GET /healthz HTTP/1.1\r\n\r\n")  # not read: closes
            answer = await asyncio.wait_for(read_answer(reader), 20)
            assert await asyncio.wait_for(reader.read(), 20) == b""
        assert (answer.status, json.loads(answer.body)["n"]) == (200, 1)
        assert backend.requests == [body]
        assert b"upgrade" not in backend.heads[0].lower()
        # CONNECT asks for a tunnel: refused.
        async with connection(port) as (reader, writer):
            writer.write(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
            assert (await asyncio.wait_for(read_answer(reader), 20)).status == 400


# -- issue 22: framing, Host and the lingering close over real sockets -------------------


def _port(p: RunningProxy) -> int:
    return int(p.url.rsplit(":", 1)[1])


@async_test
async def test_a_head_whose_end_arrives_with_a_large_body_is_not_counted_with_it() -> None:
    """The head's last CRLF pair split across reads, 70 KiB of body in the second: the
    head is a few hundred bytes, not 431 (the body was counted as head)."""
    async with (
        scripted(lambda index, body: json_answer()) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        body = json.dumps({"model": "m", "pad": "x" * 70_000}).encode()
        head = request_head("/v1/chat/completions", length=len(body))
        async with connection(_port(p)) as (reader, writer):
            writer.write(head[:-1])  # all but the last LF
            await eventually(
                lambda: any(c._meter.started for c in p.runner.server.connections),
                what="the proxy to read the head but its last byte",
            )
            writer.write(head[-1:] + body)
            answer = await asyncio.wait_for(read_answer(reader), 20)
        assert answer.status == 200
        assert backend.requests == [body]


@async_test
async def test_an_answer_head_whose_end_arrives_with_a_large_body_is_not_a_502() -> None:
    """The same on the backend side: its answer head's last byte arrives with 70 KiB of
    body (it was a 502, "the answer's head is larger than 65536 bytes")."""
    large = json.dumps({"model": "m", "pad": "y" * 70_000}).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (
        len(large)
    )
    proceed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        match = re.search(rb"(?i)content-length:\s*(\d+)", request)
        await reader.readexactly(int(match.group(1)) if match else 0)
        writer.write(head[:-1])
        await writer.drain()
        await proceed.wait()
        writer.write(head[-1:] + large)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    endpoint = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    try:
        async with running_proxy([entry("m", endpoint)]) as p:
            pool = p.proxy.pool
            assert pool is not None
            answer = asyncio.create_task(chat(p.url))
            await eventually(
                lambda: any(c._meter.started for c in pool._open),
                what="the proxy to read the answer's head but its last byte",
            )
            proceed.set()
            assert ((await answer).status, (await answer).body) == (200, large)
    finally:
        server.close()


@pytest.mark.parametrize(
    ("hosts", "version"),
    [((), "1.1"), (("proxy", "proxy"), "1.1"), (("a", "b"), "1.1"), (("a", "b"), "1.0")],
)
@async_test
async def test_a_request_without_exactly_one_host_is_a_400(
    hosts: tuple[str, ...], version: str
) -> None:
    """RFC 9112 3.2: no Host in HTTP/1.1, or several in any version, is a 400."""
    async with (
        scripted(lambda index, body: json_answer()) as backend,
        running_proxy([entry("m", backend.endpoint)]) as p,
    ):
        body = b'{"model": "m"}'
        fields = "".join(f"Host: {host}\r\n" for host in hosts)
        raw = (
            f"POST /v1/chat/completions HTTP/{version}\r\n{fields}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        async with connection(_port(p)) as (reader, writer):
            writer.write(raw)
            answer = await asyncio.wait_for(read_answer(reader), 20)
            assert await closed_by_peer(reader)
        assert (answer.status, answer.error()["code"]) == (400, "invalid_http")
        assert backend.requests == []


def _send_like_http_client(port: int, size: int) -> int | str:
    """`http.client`'s way, as the OpenAI SDK's transports do: the whole body, then
    read. The status, or the error it ended with."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(
            "POST", "/v1/embeddings", body=b"x" * size, headers={"Content-Type": "text/plain"}
        )
        return connection.getresponse().status
    except OSError as error:
        return type(error).__name__
    finally:
        connection.close()


@pytest.mark.parametrize(("lingering_bytes", "expected"), [(None, 413), (64 * 1024, "reset")])
@async_test
async def test_a_client_sending_a_body_too_large_whole_reads_its_413(
    lingering_bytes: int | None, expected: int | str
) -> None:
    """Refused before it is read, the body still arrives: the proxy closes lingering
    (reads and drops it) so the client reads the 413 rather than a reset; past
    --lingering-bytes it closes, and the client sees the reset."""
    config = ProxyConfig(max_body_bytes=MiB)
    if lingering_bytes is not None:
        config = attrs.evolve(config, lingering_bytes=lingering_bytes)
    async with running_proxy([], config=config) as p:
        outcome = await asyncio.to_thread(_send_like_http_client, _port(p), 32 * MiB)
    if expected == "reset":
        assert outcome in ("BrokenPipeError", "ConnectionResetError"), outcome
    else:
        assert outcome == expected


@async_test
async def test_a_lingering_close_ends_after_the_lingering_time() -> None:
    """A client that stops sending but keeps its end open is closed after
    --lingering-time, not held until its own timeouts."""
    config = ProxyConfig(
        max_body_bytes=1024,
        lingering_time=0.3,
        client_header_timeout=300.0,
        client_idle_timeout=300.0,
    )
    async with running_proxy([], config=config) as p:
        head = request_head("/v1/chat/completions", length=10 * MiB)
        async with connection(_port(p)) as (reader, writer):
            writer.write(head + b"x" * 4096)
            answer = await asyncio.wait_for(read_answer(reader), 20)
            assert answer.status == 413
            assert await reader.read() == b"", "the answer, then the proxy's end shut"
            await eventually(
                lambda: not p.runner.server.connections, what="the lingering connection to close"
            )
