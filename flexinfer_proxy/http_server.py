"""The proxy's HTTP/1.1 server: connections, request heads and bodies, keep-alive, answers.

Built on asyncio protocols and httptools (llhttp, the parser aiohttp vendors) rather than
aiohttp's server: aiohttp spends about 100 µs of CPU around every request (a request
object, a payload stream and a task each, response preparation; docs/benchmarks.md),
which alone is more than the proxy may spend per request to keep up with nginx. What
this module owns:

- parsing: each read is cut where `framing` says a head or a body ends before llhttp
  sees it; a head larger than `max_head_bytes` (raw bytes up to its blank line) is
  answered 431; anything that is not HTTP/1.x, a framing `framing.request_head`
  refuses (two lengths, length and chunks, no Host or two), or a CONNECT, 400 (one
  INFO log line, no traceback); either closes the connection. An offer to upgrade
  (curl's h2c) is declined: the request is served in HTTP/1.1, then the connection
  closes;
- bodies as they arrive (`RequestBody`), with backpressure: reading from the client
  pauses while more than `BODY_HIGH_WATER` bytes wait to be taken; `Expect:
  100-continue` is answered when the handler first waits for the body;
- one handler task per request, in order (pipelined requests wait their turn, reading
  paused); the task is cancelled when its client goes away;
- answers, whole (`Answer`: head and body in one write) or streamed (chunked, or ended
  by closing for an HTTP/1.0 client), with write backpressure (`Request.drain`);
- keep-alive and its timeouts: a request's head must arrive within `header_timeout`
  (from the connection's start or from the head's first byte), an idle connection is
  closed after `idle_timeout`; the connection cap through `ConnectionGuard`. One lazily
  re-armed timer per connection watches both, so a request costs no timer operations;
- closing: after an answer while the client may still be sending (its body unread,
  a head refused), a lingering close (`linger_time`, `linger_bytes`): our side is
  shut and what arrives is dropped, so the client reads the answer, not a reset;
- shutdown: stop accepting, close idle connections, let answers in progress finish.

It knows nothing about models: `handler(request)` makes every answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools

from flexinfer_proxy.connections import ConnectionGuard
from flexinfer_proxy.framing import (
    BodyBuffer,
    ChunkedEnd,
    FramingError,
    HeadMeter,
    HeadTooLarge,
    request_head,
)
from flexinfer_proxy.write_flow import WriteFlow

log = logging.getLogger("flexinfer.proxy.http")

DEFAULT_MAX_HEAD_BYTES = 64 * 1024
# A lingering close reads and drops at most this long and this much (nginx lingers
# 30 s; the bytes let a client that sends a body up to 8 times --max-body-bytes whole,
# as `http.client` does, read its 413).
DEFAULT_LINGER_SECONDS = 30.0
DEFAULT_LINGER_BYTES = 128 * 1024 * 1024
# Reading from a client pauses while this much of its body waits to be taken. At
# least the largest body read whole (model_field.SMALL_BODY_BYTES): `read()` takes
# nothing until the end, so a pause below that size would never be lifted.
BODY_HIGH_WATER = 256 * 1024
BODY_LOW_WATER = 64 * 1024

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_METHODS: dict[bytes, str] = {}

Handler = Callable[["Request"], Awaitable[None]]


def reason_of(status: int) -> bytes:
    return _REASONS.get(status, b"Unknown")


class _Date:
    """The `Date` header's value, formatted at most once a second."""

    second = 0
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second = second
            cls.value = formatdate(second, usegmt=True).encode()
        return cls.value


class Answer:
    """A whole answer the proxy makes itself: status, body, extra headers, and whether
    the connection must close after it (the request's body may be unread)."""

    __slots__ = ("body", "close", "content_type", "headers", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        *,
        content_type: bytes = b"application/json; charset=utf-8",
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers
        self.close = close

    def closing(self) -> Answer:
        self.close = True
        return self


def json_answer(
    payload: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> Answer:
    return Answer(status, json.dumps(payload).encode(), headers=headers)


class BodyCutOff(ConnectionError):
    """The client left, or broke its own framing, before its body ended."""


class RequestBody(BodyBuffer):
    """A request's body as it arrives (`framing.BodyBuffer`); `read`/`readany` wait for
    it, and the first wait answers the client's `Expect: 100-continue`."""

    __slots__ = ("_connection", "expects_continue")

    def __init__(self, connection: _Connection, *, expects_continue: bool) -> None:
        # BodyBuffer's fields, set here rather than by super(): made for every request.
        self._chunks: list[bytes] = []
        self.size = 0
        self.complete = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._connection = connection
        self.expects_continue = expects_continue  # not yet answered 100 Continue

    def _taken(self) -> None:
        self._connection._body_taken()

    async def wait(self) -> None:
        if self.expects_continue:
            self.expects_continue = False
            self._connection._send_continue()
        self._waiter = waiter = self._connection._loop.create_future()
        await waiter


class Request:
    """One request: what arrived, and the means to answer it (once)."""

    __slots__ = (
        "_chunked",
        "_connection",
        "_cut",
        "_will_close",
        "answered",
        "body",
        "content_length",
        "extra_header_lines",
        "headers",
        "keep_alive",
        "method",
        "names_hop_headers",
        "path",
        "remote",
        "status",
        "target",
        "version",
    )

    # Positional, against the house style: keyword arguments cost on every request.
    def __init__(
        self,
        connection: _Connection,
        method: str,
        target: bytes,
        path: str,
        version: str,
        headers: list[tuple[bytes, bytes]],
        content_length: int | None,
        keep_alive: bool,
        expects_continue: bool,
    ) -> None:
        self._connection = connection
        self.method = method
        self.target = target  # path and query exactly as sent
        self.path = path  # decoded, without the query
        self.version = version
        self.headers = headers  # as sent, names in their case
        self.content_length = content_length  # None: chunked
        self.keep_alive = keep_alive
        self.names_hop_headers = False  # a `Connection` header was sent
        self.remote = connection.remote
        self.body = RequestBody(connection, expects_continue=expects_continue)
        self.answered = False  # the answer's head is written
        self.status = 0  # the answer's
        # `Name: value\r\n` lines added to whatever answer this request gets.
        self.extra_header_lines = b""
        self._chunked = False
        self._will_close = False
        self._cut = False

    @property
    def raw_path(self) -> str:
        return self.target.decode("latin-1")

    def header(self, name: bytes) -> str | None:
        """The first value of header `name` (given in lower case), or None."""
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return None

    # -- answering ---------------------------------------------------------------------

    def _closing(self, wanted: bool) -> bool:
        """Whether the connection closes after this answer (and the head must say so)."""
        close = wanted or not self.keep_alive or not self.body.complete or self._connection.closing
        self._will_close = close
        return close

    def _status_line(self, status: int, reason: bytes) -> bytes:
        return b"HTTP/1.1 %d %s\r\n" % (status, reason)

    def send(self, answer: Answer) -> None:
        """Write `answer` whole: head and body in one write."""
        assert not self.answered, "answered twice"
        self.answered = True
        self.status = answer.status
        close = self._closing(answer.close)
        parts = [
            self._status_line(answer.status, reason_of(answer.status)),
            b"Content-Type: ",
            answer.content_type,
            b"\r\nContent-Length: %d\r\nDate: " % len(answer.body),
            _Date.now(),
            b"\r\n",
        ]
        if answer.headers:
            for name, value in answer.headers.items():
                parts.append(f"{name}: {value}\r\n".encode("latin-1"))
        if self.extra_header_lines:
            parts.append(self.extra_header_lines)
        parts.append(self._connection_header(close))
        parts.append(b"\r\n")
        if self.method != "HEAD":
            parts.append(answer.body)
        self._connection._write(b"".join(parts))

    def _connection_header(self, close: bool) -> bytes:
        if close:
            return b"Connection: close\r\n"
        if self.version == "1.0":
            return b"Connection: keep-alive\r\n"
        return b""

    def start(
        self,
        status: int,
        reason: bytes,
        header_lines: bytes,
        *,
        content_length: int | None,
        first: bytes = b"",
    ) -> None:
        """Write an answer's head (and its first bytes, in the same write).

        `header_lines`: `Name: value\\r\\n` lines without framing headers. Without
        `content_length` the body is chunked (or, for an HTTP/1.0 client, ended by
        closing the connection).
        """
        assert not self.answered, "answered twice"
        self.answered = True
        self.status = status
        connection = self._connection
        if self.extra_header_lines:
            header_lines += self.extra_header_lines
        if (
            content_length is not None
            and self.keep_alive
            and self.body.complete
            and self.version == "1.1"
            and not connection.closing
        ):
            # The usual answer, in one formatting: kept alive, its length known.
            connection._write(
                b"HTTP/1.1 %d %s\r\n%sContent-Length: %d\r\n\r\n%s"
                % (status, reason or reason_of(status), header_lines, content_length, first)
            )
            return
        if content_length is not None:
            framing = b"Content-Length: %d\r\n" % content_length
            close = self._closing(False)
        elif self.version == "1.0":
            framing = b""
            close = self._closing(True)
        else:
            framing = b"Transfer-Encoding: chunked\r\n"
            self._chunked = True
            close = self._closing(False)
        head = b"%s%s%s%s\r\n" % (
            self._status_line(status, reason or reason_of(status)),
            header_lines,
            framing,
            self._connection_header(close),
        )
        if first:
            head += b"%x\r\n%s\r\n" % (len(first), first) if self._chunked else first
        self._connection._write(head)

    def write(self, chunk: bytes) -> None:
        """More of a started answer's body (sent as it is: one chunk)."""
        if not chunk:
            return
        if self._chunked:
            self._connection._write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            self._connection._write(chunk)

    @property
    def write_paused(self) -> bool:
        return self._connection.write_paused

    async def drain(self) -> None:
        """Until the client has taken enough of what was written (raises if it left)."""
        await self._connection._drain()

    def finish(self) -> None:
        """End a started answer."""
        if self._chunked:
            self._connection._write(b"0\r\n\r\n")

    def cut(self) -> None:
        """End a started answer without its proper end: the client sees it cut off."""
        self._will_close = True
        self._cut = True
        self._connection.close()


class _Connection(WriteFlow, asyncio.Protocol):
    """One client connection: the parser's callbacks, the handler tasks, the timers.

    Each read is cut where the framing module says a head or a body ends before llhttp
    parses it: a head is measured in raw bytes up to its blank line (`HeadMeter`), a
    body by its length or its last chunk (`ChunkedEnd`), so a pipelined request's head
    is measured from its own first byte and llhttp never sees the next message's bytes
    in the same call as this one's end.
    """

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = server.loop
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None  # None once closed
        self.remote: str | None = None
        self.closing = False  # no further request is served
        # The request whose head or body is being parsed; the one being handled; the
        # ones parsed while another was handled.
        self._receiving: Request | None = None
        self._active: Request | None = None
        self._task: asyncio.Task[None] | None = None
        self._pipeline: deque[Request] = deque()
        self._reading_paused = False
        self._broken: bytes | None = None  # an error answer owed after the active one
        self._parse_failed = False
        # Where the bytes being read belong (see the class docstring).
        self._meter = HeadMeter(server.max_head_bytes)
        self._body_left = 0  # of a body framed by its length
        self._chunks: ChunkedEnd | None = None  # the end of a chunked body, being sought
        self._message_open = False  # llhttp is inside a message
        self._raw_body = False  # a declined upgrade's body: taken as it comes, not parsed
        self._ignore_rest = False  # after a declined upgrade: nothing more is read
        # Head being parsed.
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        # Lingering close: bytes still accepted (and dropped) before the close.
        self._linger_left: int | None = None
        self._linger_until = 0.0
        # Timeouts (one timer, re-armed lazily).
        self._head_since: float | None = None
        self._idle_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)
        guard = self._server.guard
        if guard is not None and not guard.admit(self):
            self.transport.write(self._server.refusal)
            self.transport.close()
            self.transport = None
            return
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple | list) and peer:
            self.remote = str(peer[0])
        self._server.connections.add(self)
        now = self._loop.time()
        self._head_since = now
        self._arm(now + self._server.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self._linger_left is not None:
            self._linger(len(data))
            return
        if (
            self.transport is None
            or self._parse_failed
            or self._ignore_rest
            or (self.closing and self._active is None)
        ):
            return
        try:
            self._take(data)
        except HeadTooLarge:
            self._refuse_head()
        except FramingError as error:
            self._bad_request(str(error))
        except httptools.HttpParserCallbackError as error:
            cause = error.__context__
            if isinstance(cause, FramingError):
                self._bad_request(str(cause))
            elif isinstance(cause, _Upgrade):
                self._bad_request("protocol upgrades are not supported")
            else:
                self._bad_request(f"{cause or error}")
        except httptools.HttpParserError as error:
            self._bad_request(str(error))

    def _take(self, data: bytes) -> None:
        """Cut `data` at the ends of heads and bodies and feed each piece to llhttp."""
        start = 0
        size = len(data)
        while start < size and not self._ignore_rest:
            left = self._body_left
            if left:
                end = start + left
                if end > size:
                    end = size
                self._body_left = left - (end - start)
                self._feed(data, start, end)
                if not self._body_left:
                    self._body_ended()
            elif self._chunks is not None:
                found = self._chunks.scan(data, start)
                end = size if found < 0 else found
                self._feed(data, start, end)
                if found >= 0:
                    self._chunks = None
                    self._body_ended()
            else:
                end = self._meter.scan(data, start)
                if end < 0:
                    self._feed(data, start, size)
                    if self._head_since is None:
                        self._head_since = now = self._loop.time()
                        self._arm(now + self._server.header_timeout)
                    return
                self._feed(data, start, end)
                if self._message_open and self._receiving is None:
                    # llhttp is still in a head that we saw end.
                    raise FramingError("the head's end is not where it seems")
                if self._raw_body and not self._body_left:
                    self._body_ended()  # a declined upgrade without a body
            start = end

    def _feed(self, data: bytes, start: int, end: int) -> None:
        if self._raw_body:
            self.on_body(data[start:end])
            return
        piece = data if start == 0 and end == len(data) else data[start:end]
        try:
            self._parser.feed_data(piece)
        except httptools.HttpParserUpgrade as upgrade:
            # An offer to switch protocols (curl's h2c), declined: the request is served
            # in HTTP/1.1 (RFC 9110 7.8 lets a server ignore it). llhttp stops at the
            # head, so its body is taken as it comes and the connection closes after.
            self._raw_body = True
            rest = piece[upgrade.args[0] :]
            if rest:
                self.on_body(rest)

    def _body_ended(self) -> None:
        if self._raw_body:
            self._raw_body = False
            self._ignore_rest = True
            request, self._receiving = self._receiving, None
            if request is not None:
                request.body.finish()
        elif self._message_open:
            # llhttp reads the body as going on past where its framing says it ends.
            raise FramingError("the body does not end where its framing says")

    def eof_received(self) -> bool | None:
        return None  # close: a client that stops sending is treated as gone

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return
        self.transport = None
        self._server.connections.discard(self)
        if self._server.guard is not None:
            self._server.guard.forget(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        gone = BodyCutOff("the client closed the connection")
        for request in (self._receiving, self._active, *self._pipeline):
            if request is not None:
                request.body.fail(gone)
        self._pipeline.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.fail_writers(ConnectionResetError("the client closed the connection"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._message_open = True
        self._url = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._head_since = None
        parser = self._parser
        raw_method = parser.get_method()
        method = _METHODS.get(raw_method)
        if method is None:
            method = _METHODS.setdefault(raw_method, raw_method.decode("ascii"))
        version = parser.get_http_version()
        content_length, expects_continue, names_hop_headers = request_head(
            self._headers, version=version
        )
        keep_alive = parser.should_keep_alive()
        if parser.should_upgrade():
            if raw_method == b"CONNECT" or content_length is None:
                raise _Upgrade()
            keep_alive = False
        if content_length is None:
            self._chunks = ChunkedEnd()
        else:
            self._body_left = content_length
        url = self._url
        if url[:1] == b"/" and b"?" not in url and b"%" not in url:
            target, path = url, url.decode("latin-1")  # the usual case, spelled out
        else:
            target, path = _target_and_path(url)
        request = Request(
            self,
            method,
            target,
            path,
            version,
            self._headers,
            content_length,
            keep_alive,
            expects_continue and version == "1.1",
        )
        request.names_hop_headers = names_hop_headers
        self._receiving = request
        if self._active is None and not self.closing:
            self._start(request)
        else:
            self._pipeline.append(request)
            self._pause_reading()

    def on_body(self, data: bytes) -> None:
        request = self._receiving
        if request is not None:
            request.body.feed(data)
            if request.body.size > BODY_HIGH_WATER:
                self._pause_reading()

    def on_message_complete(self) -> None:
        self._message_open = False
        if self._body_left or (self._chunks is not None and not self._chunks.done):
            if self._parser.should_upgrade():
                return  # a declined upgrade's body: not parsed, taken as it comes
            # llhttp ends the body before its framing says it ends.
            raise FramingError("the body ends before its framing says")
        request = self._receiving
        if request is not None:
            self._receiving = None
            request.body.finish()

    # -- requests ----------------------------------------------------------------------

    def _start(self, request: Request) -> None:
        self._active = request
        if self._server.guard is not None:
            self._server.guard.mark_busy(self)
        self._task = self._loop.create_task(self._run(request))

    async def _run(self, request: Request) -> None:
        try:
            await self._server.handler(request)
        except asyncio.CancelledError:
            self.close()
            raise
        except Exception:
            log.exception("failed to handle %s %s", request.method, request.path)
            if not request.answered and self.transport is not None:
                request.send(_INTERNAL_ERROR)
            else:
                request.cut()
        if not request.answered and self.transport is not None:
            log.error("no answer to %s %s", request.method, request.path)
            request.send(_INTERNAL_ERROR)
        self._finished(request)

    def _finished(self, request: Request) -> None:
        self._active = None
        self._task = None
        if self.transport is None:
            return
        if request._will_close or self.closing or self._broken is not None:
            if self._broken is not None:
                self.transport.write(self._broken)
            if request._cut:
                self.close()
            else:
                self._close_after_answer(unread=not request.body.complete or self._parse_failed)
            return
        if self._server.guard is not None:
            self._server.guard.mark_idle(self)
        if self._pipeline:
            self._start(self._pipeline.popleft())
            if not self._pipeline:
                self._resume_reading()
            return
        if self._reading_paused:
            self._resume_reading()
        now = self._loop.time()
        self._idle_since = now
        if self._head_since is not None:
            self._arm(self._head_since + self._server.header_timeout)
        else:
            self._arm(now + self._server.idle_timeout)

    def _body_taken(self) -> None:
        if self._reading_paused and not self._pipeline:
            self._resume_reading()

    def _send_continue(self) -> None:
        self._write(b"HTTP/1.1 100 Continue\r\n\r\n")

    # -- writing -----------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    async def _drain(self) -> None:
        if self.transport is None:
            raise ConnectionResetError("the client closed the connection")
        await self.wait_writable()

    # -- closing and errors --------------------------------------------------------------

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def close_if_idle(self) -> bool:
        """For shutdown: close now if no request is being handled, else after it."""
        self.closing = True
        if self._active is None:
            self.close()
            return True
        return False

    def _close_after_answer(self, *, unread: bool) -> None:
        """Close once the answer is out. When the client may still be sending (its body
        unread, or a head refused), close lingering (RFC 9112 9.6): the answer is
        flushed and our side shut, then what still arrives is read and dropped, up to
        `linger_bytes` or `linger_time`, so the client reads the answer instead of a
        reset (a socket closed with unread input sends RST, which can destroy an
        answer the client has not read yet: `http.client` writes its whole body first)."""
        transport = self.transport
        if transport is None:
            return
        if not unread or self._server.linger_bytes <= 0 or not transport.can_write_eof():
            self.close()
            return
        self.closing = True
        self._linger_left = self._server.linger_bytes
        try:
            transport.write_eof()
        except (OSError, RuntimeError):
            self.close()
            return
        if self._server.guard is not None:
            self._server.guard.mark_lingering(self)
        self._reading_paused = False
        transport.resume_reading()
        self._linger_until = self._loop.time() + self._server.linger_time
        self._arm(self._linger_until)

    def _linger(self, size: int) -> None:
        assert self._linger_left is not None
        self._linger_left -= size
        if self._linger_left <= 0:
            log.info("closing a lingering connection: --lingering-bytes read and dropped")
            self.close()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            request = self._receiving
            if request is not None and request.body.size > BODY_LOW_WATER:
                return
            self._reading_paused = False
            self.transport.resume_reading()

    def _bad_request(self, reason: str) -> None:
        log.info("closing a connection that sent something that is not HTTP/1.x: %s", reason)
        self._fail_parse(_BAD_REQUEST)

    def _refuse_head(self) -> None:
        log.info("closing a connection whose request head exceeds --max-header-bytes")
        self._fail_parse(self._server.head_too_large)

    def _fail_parse(self, answer: bytes) -> None:
        """Nothing more can be read from this connection: answer, then close."""
        self._parse_failed = True
        self._head_since = None
        receiving, self._receiving = self._receiving, None
        if receiving is not None:
            receiving.body.fail(BodyCutOff("the request's framing is broken"))
        self.closing = True
        if self._active is None:
            if self.transport is not None:
                self.transport.write(answer)
            self._close_after_answer(unread=True)
            return
        self._pause_reading()
        if receiving is not self._active:
            # The answer in progress goes first; this one after it, then the close.
            self._broken = answer
        # else it is the active request's own body that broke: its handler answers
        # (it sees the body cut off), then the connection closes.

    # -- the timer -----------------------------------------------------------------------

    def _arm(self, due: float) -> None:
        timer = self._timer
        if timer is not None:
            if self._timer_due <= due:
                return  # fires first, and re-arms for what is then due
            timer.cancel()
        self._timer_due = due
        self._timer = self._loop.call_at(due, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.transport is None:
            return
        if self._linger_left is not None:
            if self._loop.time() >= self._linger_until:
                self.close()  # --lingering-time is over
            else:
                self._arm(self._linger_until)
            return
        if self._active is not None:
            return  # a request in progress: its end re-arms
        now = self._loop.time()
        if self._head_since is not None:
            due = self._head_since + self._server.header_timeout
            if now >= due:
                log.info("closing a connection whose request head did not arrive in time")
                if self._server.guard is not None:
                    self._server.guard.on_closed("header_timeout")
                self.close()
                return
        else:
            due = self._idle_since + self._server.idle_timeout
            if now >= due:
                self.close()
                return
        self._arm(due)


class _Upgrade(Exception):
    pass


def _target_and_path(url: bytes) -> tuple[bytes, str]:
    """The origin-form target (path and query as sent) and the decoded path."""
    if not url.startswith(b"/"):
        if url == b"*":
            return url, "*"
        parsed = httptools.parse_url(url)  # absolute form: http://host/path?query
        path_part = parsed.path or b"/"
        url = path_part + (b"?" + parsed.query if parsed.query else b"")
    path_part, _, _ = url.partition(b"?")
    path = path_part.decode("latin-1")
    if "%" in path:
        path = unquote(path, encoding="utf-8", errors="replace")
    return url, path


def _error_bytes(status: int, message: str, *, code: str) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    body = json.dumps({"error": error}).encode()
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (status, reason_of(status), len(body), body)
    )


_BAD_REQUEST = _error_bytes(400, "The request is not valid HTTP/1.1.", code="invalid_http")
_INTERNAL_ERROR = Answer(
    500,
    json.dumps(
        {
            "error": {
                "message": "The proxy failed to handle the request; the error is in its log.",
                "type": "server_error",
                "param": None,
                "code": "internal_error",
            }
        }
    ).encode(),
)


class HttpServer:
    """Serves `handler` on one listening socket; `shutdown` ends it gracefully."""

    def __init__(
        self,
        handler: Handler,
        *,
        guard: ConnectionGuard | None = None,
        refusal: bytes = b"",
        header_timeout: float = 10.0,
        idle_timeout: float = 75.0,
        max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES,
        linger_time: float = DEFAULT_LINGER_SECONDS,
        linger_bytes: int = DEFAULT_LINGER_BYTES,
    ) -> None:
        self.handler = handler
        self.linger_time = linger_time
        self.linger_bytes = linger_bytes
        self.guard = guard
        self.refusal = refusal  # written to a connection the guard refuses
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.max_head_bytes = max_head_bytes
        self.head_too_large = _error_bytes(
            431,
            f"The request head is larger than this proxy accepts ({max_head_bytes} bytes, "
            "--max-header-bytes).",
            code="request_header_too_large",
        )
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self.loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await self.loop.create_server(
            lambda: _Connection(self), host, port, backlog=1024, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def shutdown(self, timeout: float = 60.0) -> None:
        """Close idle connections, wait up to `timeout` for answers in progress, then
        cancel what is left and close every connection."""
        self.stop_listening()
        busy = [c for c in list(self.connections) if not c.close_if_idle()]
        tasks = [c._task for c in busy if c._task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
        for connection in list(self.connections):
            connection.close()
        # Let the transports' close callbacks run.
        await asyncio.sleep(0)
