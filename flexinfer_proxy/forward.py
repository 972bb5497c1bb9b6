"""Relaying one request to a backend and its answer back to the client.

The request body is sent as given (in slices when large, see `upstream`); the
answer is copied chunk by chunk as it arrives (server-sent events included), with
its status and headers, never buffered whole and never decompressed. An answer
that says it is at most `WHOLE_ANSWER_BYTES` long, or that has arrived whole with
its head, is written to the client in one write with its head. Hop-by-hop headers,
and those the `Connection` header names, are dropped in both directions; the
client's credentials (`CREDENTIALS`) and forwarding headers (`Forwarded`,
`X-Forwarded-*`, `X-Real-IP`) never reach a backend, nor does any of these spelled
with `_` for `-`, and `X-Forwarded-For` is set to the client's address alone.

Failures before the answer started are exceptions the caller turns into answers:
`BackendUnavailable` (refused, reset, closed, or a reply that is not HTTP; `retryable`
when nothing was sent) and `BackendTimeout` (no headers within the headers
timeout). After the answer started, a failure or a backend silent for longer than
the read timeout can only end the stream: an event stream gets a final
`data: {"error": ...}` event that OpenAI clients raise, anything else is cut
(`StreamCut`; the caller cuts the client's connection).

A non-streamed JSON answer of at most `REWRITE_LIMIT_BYTES` has its `model` put
back to the name the client asked for when the request's was rewritten; streamed
answers are relayed untouched (their chunks carry the backend's name).

A request whose answer the caller already started (a streamed request that waited:
its 200 and event-stream head went out with the waiting comments) gets the
backend's event stream as the rest of that body; a backend answer other than 200
becomes one error event (`stream_error_event`'s shape, the backend's own `error`
when it sent one) and the stream's clean end.

This module knows nothing about models, queues or demand.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable

import attrs

from flexinfer_proxy import openai_errors
from flexinfer_proxy.backend_slots import BackendSlots
from flexinfer_proxy.http_server import Request
from flexinfer_proxy.upstream import (
    EVENT_STREAM,
    AnswerFailed,
    AnswerStopped,
    ConnectFailed,
    HeadersTimeout,
    Origin,
    UpstreamConnection,
    UpstreamError,
    UpstreamPool,
    header_value,
    media_type,
)

log = logging.getLogger("flexinfer.proxy.forward")

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
# Dropped from requests too: the proxy met the client's `Expect` itself (the body is
# all here), and a backend asked for it would only add a `100 Continue`.
REQUEST_HOP_BY_HOP = HOP_BY_HOP | {b"expect"}
# A client's credentials are for the proxy (or for nobody): a backend is another
# tenant's process and must never see them, keys on or off.
CREDENTIALS = frozenset({b"authorization", b"proxy-authorization", b"x-api-key", b"api-key",
                         b"cookie"})  # fmt: skip
# What a client says about the path it came by is not believed: these are dropped and
# `X-Forwarded-For` is set to the address the proxy saw (`X-Forwarded-*` by prefix).
FORWARDING = frozenset({b"forwarded", b"x-real-ip"})
REQUEST_SKIPPED = REQUEST_HOP_BY_HOP | CREDENTIALS | FORWARDING
# Non-streamed JSON answers up to this size get their `model` rewritten back.
REWRITE_LIMIT_BYTES = 1024 * 1024
# An answer that says it is at most this long (and is not an event stream) is read
# whole and sent in one write with its headers.
WHOLE_ANSWER_BYTES = 64 * 1024


class BackendUnavailable(Exception):
    """The backend could not be reached, or gave no valid answer before its headers."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable  # nothing was sent: trying again is safe


class BackendTimeout(Exception):
    """The backend sent no headers within the headers timeout."""


class StreamCut(Exception):
    """The backend failed (or fell silent) after its answer had started."""


class ClientGone(ConnectionError):
    """The client went away while its answer was being written."""


@attrs.frozen
class ModelRewrite:
    """The name the client asked for and the one the backend answers with."""

    requested: str
    backend: str


def _connection_named(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Header names a `Connection` header lists (hop-by-hop by RFC 9110 7.6.1)."""
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    return frozenset(named - {b""})


def upstream_header_lines(
    headers: list[tuple[bytes, bytes]],
    *,
    client: str | None,
    names_hop_headers: bool = True,
) -> bytes:
    """The client's headers minus hop-by-hop ones, `Expect`, credentials, forwarding
    headers (any `X-Forwarded-*`), their spellings with `_`, and those its
    `Connection` header names (when `names_hop_headers`), plus
    `X-Forwarded-For: <client>`, as `Name: value` lines."""
    lines = []
    if names_hop_headers:
        skip = REQUEST_SKIPPED | _connection_named(headers)
        for name, value in headers:
            if _forwarded(name.lower(), skip):
                lines.append(b"%s: %s\r\n" % (name, value))
    else:
        verdicts = _VERDICTS
        for name, value in headers:
            keep = verdicts.get(name)
            if keep is None:
                keep = _remember(name)
            if keep:
                lines.append(b"%s: %s\r\n" % (name, value))
    if client:
        lines.append(b"X-Forwarded-For: %s\r\n" % client.encode("latin-1"))
    return b"".join(lines)


def _forwarded(lower: bytes, skip: frozenset[bytes]) -> bool:
    if lower in skip or lower.startswith(b"x-forwarded-"):
        return False
    if b"_" in lower:
        # `Transfer_Encoding`, `Content_Length`, `X_Forwarded_For`...: a backend that
        # reads `_` as `-` (every WSGI/CGI server: both become HTTP_TRANSFER_ENCODING)
        # would take them for the fields the proxy drops, and frame or trust the
        # request differently.
        dashed = lower.replace(b"_", b"-")
        return dashed not in skip and not dashed.startswith(b"x-forwarded-")
    return True


# Whether a header name, as clients spell it, is forwarded (without a `Connection`
# field naming others): clients send the same few names on every request, so each
# is decided once. Bounded: a client making names up empties it, never grows it.
_VERDICTS: dict[bytes, bool] = {}
_VERDICTS_KEPT = 1024


def _remember(name: bytes) -> bool:
    keep = _forwarded(name.lower(), REQUEST_SKIPPED)
    if len(_VERDICTS) >= _VERDICTS_KEPT:
        _VERDICTS.clear()
    _VERDICTS[name] = keep
    return keep


def request_head(
    method: str, target: bytes, origin: Origin, header_lines: bytes, length: int
) -> bytes:
    return b"%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n" % (
        method.encode("ascii"),
        target,
        origin.host_header,
        header_lines,
        length,
    )


def answer_header_lines(upstream: UpstreamConnection) -> bytes:
    """The backend's headers minus hop-by-hop ones and those its `Connection` names."""
    headers = upstream.headers
    if upstream.names_hop_headers:
        skip = HOP_BY_HOP | _connection_named(headers)
        return b"".join(
            b"%s: %s\r\n" % (name, value) for name, value in headers if name.lower() not in skip
        )
    lines = []
    relayed = _RELAYED
    for name, value in headers:
        keep = relayed.get(name)
        if keep is None:
            keep = name.lower() not in HOP_BY_HOP
            if len(relayed) >= _VERDICTS_KEPT:
                relayed.clear()
            relayed[name] = keep
        if keep:
            lines.append(b"%s: %s\r\n" % (name, value))
    return b"".join(lines)


# The same for a backend's answer header names: relayed unless hop-by-hop.
_RELAYED: dict[bytes, bool] = {}


async def relay_in_slot(
    pool: UpstreamPool,
    request: Request,
    *,
    slots: BackendSlots,
    origin: Origin,
    head: bytes,
    body: bytes | bytearray,
    rewrite: ModelRewrite | None = None,
    on_dispatched: Callable[[], None] | None = None,
    on_headers: Callable[[], None] | None = None,
) -> None:
    """`relay`, holding one of the backend's capped `slots`. `on_dispatched` is called
    once the request's place is fixed: its head is on the wire, or it waits in line
    for a slot."""
    async with slots.slot(str(origin), on_queued=on_dispatched or _nothing):
        await relay(
            pool,
            request,
            origin=origin,
            head=head,
            body=body,
            rewrite=rewrite,
            on_dispatched=on_dispatched,
            on_headers=on_headers,
        )


def _nothing() -> None:
    return None


async def relay(
    pool: UpstreamPool,
    request: Request,
    *,
    origin: Origin,
    head: bytes,
    body: bytes | bytearray,
    rewrite: ModelRewrite | None = None,
    on_dispatched: Callable[[], None] | None = None,
    on_headers: Callable[[], None] | None = None,
) -> None:
    """Send `head` and `body` to `origin` and stream the backend's answer to the client.

    `on_dispatched` is called once the request's head is on the wire, `on_headers`
    once the backend's answer head has arrived.
    """
    # The request is sent once: a failure after it was written (a kept-alive connection
    # the backend closed as it crossed the request, included) is the backend's, never
    # a reason to send it again, since the backend may already be running it (the
    # pool's keep-alive limits make that crossing rare; OpenAI clients retry the 502).
    upstream = pool.take_idle(origin)
    if upstream is None:
        try:
            upstream = await pool.acquire(origin)
        except ConnectFailed as error:
            raise BackendUnavailable(str(error), retryable=True) from error
    try:
        try:
            await upstream.exchange(head, body, on_sent=on_dispatched)
        except HeadersTimeout as error:
            raise BackendTimeout(str(error)) from error
        except UpstreamError as error:
            raise BackendUnavailable(str(error), retryable=False) from error
        if on_headers is not None:
            on_headers()
        if request.answered:
            await _continue_stream(request, upstream)
        elif rewrite is not None and _rewritable(upstream):
            await _rewritten_back(request, upstream, rewrite)
        else:
            await _stream_back(request, upstream)
    finally:
        pool.release(upstream)


def _rewritable(upstream: UpstreamConnection) -> bool:
    length = upstream.content_length
    return (
        length is not None
        and length <= REWRITE_LIMIT_BYTES
        and media_type(upstream.headers) == b"application/json"
        and header_value(upstream.headers, b"content-encoding") is None
    )


async def _whole(upstream: UpstreamConnection) -> bytes:
    if upstream.body.complete:
        return upstream.body.take()
    try:
        return await upstream.body.read_all()
    except UpstreamError as error:
        raise BackendUnavailable(f"answer cut: {error}", retryable=False) from error


async def _rewritten_back(
    request: Request, upstream: UpstreamConnection, rewrite: ModelRewrite
) -> None:
    raw = await _whole(upstream)
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("model") == rewrite.backend:
        answer["model"] = rewrite.requested
        raw = json.dumps(answer, ensure_ascii=False).encode()
    lines = answer_header_lines(upstream)
    request.start(upstream.status, upstream.reason, lines, content_length=len(raw), first=raw)


async def _continue_stream(request: Request, upstream: UpstreamConnection) -> None:
    """The backend's answer as the rest of an event stream the proxy already started."""
    if upstream.status != 200:
        length = upstream.content_length
        raw = await _whole(upstream) if length is not None and length <= WHOLE_ANSWER_BYTES else b""
        request.write(_error_event_from(upstream.status, raw))
        request.finish()
        return
    first = upstream.body.take()
    await _copy_body(request, upstream, first=first, event_stream=True)


def _error_event_from(status: int, raw: bytes) -> bytes:
    """An error event carrying the backend's own `error` object, or saying its status."""
    try:
        answer = json.loads(raw) if raw else None
    except ValueError:
        answer = None
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict):
        return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
    message = f"The backend answered {status} instead of its event stream."
    return openai_errors.stream_error_event(message, code="backend_error")


async def _stream_back(request: Request, upstream: UpstreamConnection) -> None:
    length = upstream.content_length
    status, reason = upstream.status, upstream.reason
    lines = answer_header_lines(upstream)
    if upstream.body.complete or (length is not None and length <= WHOLE_ANSWER_BYTES):
        whole = await _whole(upstream)
        request.start(status, reason, lines, content_length=len(whole), first=whole)
        return
    # The head and what arrived with it in one write.
    request.start(status, reason, lines, content_length=length, first=upstream.body.take())
    event_stream = length is None and media_type(upstream.headers) == EVENT_STREAM
    await _copy_body(request, upstream, first=b"", event_stream=event_stream)


async def _copy_body(
    request: Request, upstream: UpstreamConnection, *, first: bytes, event_stream: bool
) -> None:
    """The rest of the backend's answer, chunk by chunk, then the answer's end."""
    try:
        request.write(first)
        while True:
            if request.write_paused:
                await request.drain()
            chunk = await upstream.body.readany()
            if not chunk:
                break
            request.write(chunk)
    except UpstreamError as error:
        # Headers are gone already: the only honest signals left are an error event
        # (for an event stream) and a cut.
        silent = isinstance(error, AnswerFailed) and error.silent
        what = "fell silent" if silent else "failed"
        if isinstance(error, AnswerStopped):
            what = f"was stopped ({error})"
        if event_stream:
            message = f"The backend {what} in the middle of its answer."
            request.write(openai_errors.stream_error_event(message, code="stream_cut"))
        raise StreamCut(f"backend {what} mid-answer: {error}") from error
    except ConnectionError as error:
        raise ClientGone(str(error)) from error
    request.finish()
