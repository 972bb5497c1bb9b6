"""Relaying one request to a backend and its answer back to the client.

The request body is sent as given (in slices, so a large one is never copied
whole into a socket buffer); the answer is copied chunk by chunk as it arrives
(server-sent events included), with its status and headers, never buffered whole
and never decompressed. Hop-by-hop headers, and those the `Connection` header
names, are dropped in both directions; `X-Forwarded-For` gets the client's address.

Failures before the answer started are exceptions the caller turns into answers:
`BackendUnavailable` (refused, reset, closed, or a reply that is not HTTP; `retryable`
when nothing was sent) and `BackendTimeout` (no headers within the headers
timeout). After the answer started, a failure or a backend silent for longer than
the read timeout can only end the stream: an event stream gets a final
`data: {"error": ...}` event that OpenAI clients raise, anything else is cut.

A non-streamed JSON answer of at most `REWRITE_LIMIT_BYTES` has its `model` put
back to the name the client asked for when the request's was rewritten; streamed
answers are relayed untouched (their chunks carry the backend's name).

This module knows nothing about models, queues or demand.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import attrs
from aiohttp import web
from aiohttp.abc import AbstractResolver, AbstractStreamWriter
from aiohttp.payload import BytesPayload
from multidict import CIMultiDict
from yarl import URL

from flexinfer_proxy import openai_errors
from flexinfer_proxy.backend_slots import BackendSlots

log = logging.getLogger("flexinfer.proxy.forward")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

# Bodies are written to the backend in slices of this size, draining in between.
SEND_SLICE_BYTES = 256 * 1024
# Non-streamed JSON answers up to this size get their `model` rewritten back.
REWRITE_LIMIT_BYTES = 1024 * 1024
# An answer that says it is at most this long (and is not an event stream) is read
# whole and sent in one write with its headers: three writes become one.
WHOLE_ANSWER_BYTES = 64 * 1024


@attrs.frozen
class UpstreamTimeouts:
    connect: float = 10.0
    headers: float = 600.0  # a non-streamed completion sends its headers when done
    read: float = 300.0  # silence between two chunks of an answer


class BackendUnavailable(Exception):
    """The backend could not be reached, or gave no valid answer before its headers."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable  # nothing was sent: trying again is safe


class BackendTimeout(Exception):
    """The backend sent no headers within the headers timeout."""


class StreamCut(Exception):
    """The backend failed (or fell silent) after its answer had started."""

    def __init__(self, message: str, *, response: web.StreamResponse) -> None:
        super().__init__(message)
        self.response = response  # prepared: its headers (and part of it) are sent


def _connection_named(headers: Mapping[str, str]) -> frozenset[str]:
    """Header names a `Connection` header lists (hop-by-hop by RFC 9110 7.6.1)."""
    named = {
        token.strip().lower()
        for value in headers.getall("Connection", ())  # type: ignore[attr-defined]
        for token in value.split(",")
    }
    return frozenset(named - {""})


def upstream_headers(
    headers: Mapping[str, str], *, client: str | None, drop: Iterable[str] = ()
) -> CIMultiDict[str]:
    """The client's headers minus hop-by-hop ones (and `drop`), plus X-Forwarded-For."""
    skip = HOP_BY_HOP | _connection_named(headers) | frozenset(drop)
    result: CIMultiDict[str] = CIMultiDict(
        (k, v) for k, v in headers.items() if k.lower() not in skip
    )
    if client:
        forwarded = headers.get("X-Forwarded-For")
        result["X-Forwarded-For"] = f"{forwarded}, {client}" if forwarded else client
    return result


def _dispatch_tracer() -> aiohttp.TraceConfig:
    """Call the request's `on_dispatched` once its headers are on the wire."""

    async def headers_sent(
        session: aiohttp.ClientSession, context: SimpleNamespace, params: Any
    ) -> None:
        on_dispatched = getattr(context, "trace_request_ctx", None)
        if on_dispatched is not None:
            on_dispatched()

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(headers_sent)
    return trace


def new_upstream_session(
    *,
    timeouts: UpstreamTimeouts | None = None,
    resolver: AbstractResolver | None = None,
    traced: bool = False,
) -> aiohttp.ClientSession:
    """A pooled session for all backends; no total timeout (generation can be long).

    `traced`: calls a request's `on_dispatched` once its headers are sent. Tracing
    costs every request it is on, so only requests that left a queue use it.
    """
    timeouts = timeouts or UpstreamTimeouts()
    return aiohttp.ClientSession(
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
        connector=aiohttp.TCPConnector(limit=0, resolver=resolver),
        trace_configs=[_dispatch_tracer()] if traced else None,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
    )


def backend_of(url: str) -> str:
    """The scheme, host and port a URL talks to: what a backend slot is counted by."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class SlicedBody(BytesPayload):
    """A body written in slices, each drained before the next is copied into the socket."""

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        view = memoryview(self._value)
        if content_length is not None:
            view = view[:content_length]
        for start in range(0, len(view), SEND_SLICE_BYTES):
            await writer.write(view[start : start + SEND_SLICE_BYTES])


@attrs.frozen
class ModelRewrite:
    """The name the client asked for and the one the backend answers with."""

    requested: str
    backend: str


async def relay(
    session: aiohttp.ClientSession,
    request: web.Request,
    *,
    url: URL,
    body: bytes | bytearray,
    headers: CIMultiDict[str],
    slots: BackendSlots,
    timeouts: UpstreamTimeouts,
    rewrite: ModelRewrite | None = None,
    on_dispatched: Callable[[], None] | None = None,
) -> web.StreamResponse:
    """Send `body` to `url` and stream the backend's answer back to the client.

    `on_dispatched` is called once the request's place is fixed: its headers are
    on the wire, or it waits in line for one of the backend's capped `slots`.
    """
    if slots.capped:
        async with slots.slot(backend_of(str(url)), on_queued=on_dispatched or _nothing):
            return await _exchange(
                session, request, url, body, headers, timeouts, rewrite, on_dispatched
            )
    return await _exchange(session, request, url, body, headers, timeouts, rewrite, on_dispatched)


async def _exchange(
    session: aiohttp.ClientSession,
    request: web.Request,
    url: URL,
    body: bytes | bytearray,
    headers: CIMultiDict[str],
    timeouts: UpstreamTimeouts,
    rewrite: ModelRewrite | None,
    on_dispatched: Callable[[], None] | None,
) -> web.StreamResponse:
    data: bytes | bytearray | SlicedBody = body
    if len(body) > SEND_SLICE_BYTES:
        data = SlicedBody(body)
    try:
        async with asyncio.timeout(timeouts.headers):
            upstream = await session.request(
                request.method, url, data=data, headers=headers, trace_request_ctx=on_dispatched
            )
    except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError) as error:
        raise BackendUnavailable(str(error) or type(error).__name__, retryable=True) from error
    except TimeoutError as error:
        raise BackendTimeout(f"no headers within {timeouts.headers:g}s") from error
    except aiohttp.ClientError as error:
        raise BackendUnavailable(str(error) or type(error).__name__, retryable=False) from error
    async with upstream:
        if rewrite is not None and _rewritable(upstream):
            return await _rewritten_back(request, upstream, rewrite, timeouts)
        return await _stream_back(request, upstream, timeouts)


def _nothing() -> None:
    return None


def _response_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    skip = HOP_BY_HOP | _connection_named(upstream.headers)
    return CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in skip)


def _rewritable(upstream: aiohttp.ClientResponse) -> bool:
    length = upstream.content_length
    return (
        upstream.content_type == "application/json"
        and length is not None
        and length <= REWRITE_LIMIT_BYTES
        and "Content-Encoding" not in upstream.headers
    )


async def _rewritten_back(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    rewrite: ModelRewrite,
    timeouts: UpstreamTimeouts,
) -> web.StreamResponse:
    try:
        async with asyncio.timeout(timeouts.read):
            raw = await upstream.read()
    except (TimeoutError, aiohttp.ClientError) as error:
        raise BackendUnavailable(f"answer cut: {error!r}", retryable=False) from error
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("model") == rewrite.backend:
        answer["model"] = rewrite.requested
        raw = json.dumps(answer, ensure_ascii=False).encode()
    headers = _response_headers(upstream)
    return web.Response(status=upstream.status, reason=upstream.reason, body=raw, headers=headers)


async def _stream_back(
    request: web.Request, upstream: aiohttp.ClientResponse, timeouts: UpstreamTimeouts
) -> web.StreamResponse:
    length = upstream.content_length
    if length is not None and length <= WHOLE_ANSWER_BYTES:
        try:
            async with asyncio.timeout(timeouts.read):
                whole = await upstream.read()
        except (TimeoutError, aiohttp.ClientError) as error:
            raise BackendUnavailable(f"answer cut: {error!r}", retryable=False) from error
        return web.Response(
            status=upstream.status,
            reason=upstream.reason,
            body=whole,
            headers=_response_headers(upstream),
        )
    response = web.StreamResponse(
        status=upstream.status, reason=upstream.reason, headers=_response_headers(upstream)
    )
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    await response.prepare(request)
    content = upstream.content
    loop = asyncio.get_running_loop()
    silence = _SilenceWatch(loop, timeouts.read, upstream)
    try:
        while chunk := await content.readany():
            silence.last = loop.time()
            await response.write(chunk)
    except aiohttp.ClientError as error:
        # Headers are gone already: the only honest signals left are an error event
        # (for an event stream) and a cut.
        reason = "fell silent" if silence.fired else "failed"
        if upstream.content_type == "text/event-stream" and upstream.content_length is None:
            message = f"The backend {reason} in the middle of its answer."
            await response.write(openai_errors.stream_error_event(message, code="stream_cut"))
        raise StreamCut(f"backend {reason} mid-answer: {error!r}", response=response) from error
    finally:
        silence.stop()
    await response.write_eof()
    return response


class _SilenceWatch:
    """Closes the backend's answer once nothing arrived for `seconds`.

    The reader stamps `last` per chunk (a float store); one timer checks the stamp
    when it fires and re-arms for the rest. Re-arming a timer per chunk instead
    costs a heap push for every event of every stream.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, seconds: float, upstream: aiohttp.ClientResponse
    ) -> None:
        self.last = loop.time()
        self.fired = False
        self._loop = loop
        self._seconds = seconds
        self._upstream = upstream
        self._handle = loop.call_at(self.last + seconds, self._check)

    def _check(self) -> None:
        due = self.last + self._seconds
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self.fired = True
        self._upstream.close()  # the pending read fails: a ClientError

    def stop(self) -> None:
        self._handle.cancel()
