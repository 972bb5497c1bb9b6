"""The proxy's HTTP/1.1 server: connections, request heads and bodies, keep-alive, answers.

Built on asyncio protocols and httptools (llhttp, the parser aiohttp vendors) rather than
aiohttp's server: aiohttp spends about 100 µs of CPU around every request (a request
object, a payload stream and a task each, response preparation; docs/benchmarks.md),
which alone is more than the proxy may spend per request to keep up with nginx. What
this module owns:

- parsing: a request head larger than `max_head_bytes` is answered 431, anything that is
  not HTTP/1.x (or a CONNECT) 400 (one INFO log line, no traceback); either closes the
  connection. An offer to upgrade (curl's h2c) is declined: the request is served in
  HTTP/1.1, then the connection closes;
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
from flexinfer_proxy.write_flow import WriteFlow

log = logging.getLogger("flexinfer.proxy.http")

DEFAULT_MAX_HEAD_BYTES = 64 * 1024
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


class RequestBody:
    """A request's body as it arrives; `read`/`readany` wait for it."""

    __slots__ = (
        "_chunks",
        "_connection",
        "_error",
        "_waiter",
        "complete",
        "expects_continue",
        "size",
    )

    def __init__(self, connection: _Connection, *, expects_continue: bool) -> None:
        self._connection = connection
        self._chunks: list[bytes] = []
        self.size = 0  # bytes waiting to be taken
        self.complete = False  # the whole body has arrived
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.expects_continue = expects_continue  # not yet answered 100 Continue

    # -- fed by the connection ---------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self.size += len(data)
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: Exception) -> None:
        if not self.complete:
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- read by the handler -----------------------------------------------------------

    def is_eof(self) -> bool:
        return self.complete and not self._chunks

    def take(self) -> bytes:
        """Everything that has arrived and was not taken yet (no waiting)."""
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self.size = 0
        self._connection._body_taken()
        return data

    async def readany(self) -> bytes:
        """The next bytes of the body; b"" at its end. Raises `BodyCutOff`."""
        while not self._chunks:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()
        return self.take()

    async def read(self) -> bytes:
        """The whole body."""
        while not self.complete:
            if self._error is not None:
                raise self._error
            await self._wait()
        return self.take()

    async def _wait(self) -> None:
        if self.expects_continue:
            self.expects_continue = False
            self._connection._send_continue()
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter


class Request:
    """One request: what arrived, and the means to answer it (once)."""

    __slots__ = (
        "_chunked",
        "_connection",
        "_will_close",
        "answered",
        "body",
        "content_length",
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
        self._chunked = False
        self._will_close = False

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
        self._connection.close()


class _Connection(WriteFlow, asyncio.Protocol):
    """One client connection: the parser's callbacks, the handler tasks, the timers."""

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
        self._raw_left: int | None = None  # after a declined upgrade: body bytes to come
        # Head being parsed.
        self._in_head = False
        self._fragmented = False
        self._head_bytes = 0
        self._message_bytes = 0  # of the message being parsed, as its callbacks saw it
        self._read_done = 0  # bytes of the current read that belonged to ended messages
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
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
        if self.transport is None or self._parse_failed or (self.closing and self._active is None):
            return
        if self._raw_left is not None:
            self._take_raw_body(data)
            return
        if self._in_head:
            # A head arriving in pieces: count what this piece adds (llhttp sets no limit).
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end
            if self._head_bytes > self._server.max_head_bytes:
                self._refuse_head()
                return
        self._read_done = 0
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:
            if isinstance(error.__context__, _HeadTooLarge):
                self._refuse_head()
            elif isinstance(error.__context__, _Upgrade):
                self._bad_request("protocol upgrades are not supported")
            else:
                self._bad_request(f"{error.__context__ or error}")
            return
        except httptools.HttpParserUpgrade as upgrade:  # an upgrade offer, declined
            self._take_raw_body(data[upgrade.args[0] :])
            return
        except httptools.HttpParserError as error:
            self._bad_request(str(error))
            return
        if self._in_head and not self._fragmented:
            # A head begun in this read is still open: what llhttp holds of it is what
            # follows the messages that ended in this read.
            self._fragmented = True
            self._head_bytes = len(data) - self._read_done
            if self._head_bytes > self._server.max_head_bytes:
                self._refuse_head()
                return
        if self._in_head and self._head_since is None:
            self._head_since = now = self._loop.time()
            self._arm(now + self._server.header_timeout)

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
                request.body._fail(gone)
        self._pipeline.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.fail_writers(ConnectionResetError("the client closed the connection"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._fragmented = False
        self._head_bytes = 0
        self._message_bytes = _REQUEST_LINE_BYTES
        self._url = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._message_bytes += len(url)
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        size = len(name) + len(value) + 4
        self._message_bytes += size
        if not self._fragmented:  # (the count of `_count`, inlined: once per header)
            self._head_bytes += size
            if self._head_bytes > self._server.max_head_bytes:
                raise _HeadTooLarge()

    def _count(self, size: int) -> None:
        if not self._fragmented:  # else data_received counts the head's pieces
            self._head_bytes += size
            if self._head_bytes > self._server.max_head_bytes:
                raise _HeadTooLarge()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_since = None
        parser = self._parser
        raw_method = parser.get_method()
        method = _METHODS.get(raw_method)
        if method is None:
            method = _METHODS.setdefault(raw_method, raw_method.decode("ascii"))
        content_length: int | None = 0
        expects_continue = False
        named = False
        for name, value in self._headers:
            size = len(name)
            if size == 14 and name.lower() == b"content-length":
                content_length = int(value)  # llhttp checked it is a number
            elif size == 17 and name.lower() == b"transfer-encoding":
                content_length = None
            elif size == 6 and name.lower() == b"expect":
                expects_continue = value.lower() == b"100-continue"
            elif size == 10 and name.lower() == b"connection":
                named = True
        keep_alive = parser.should_keep_alive()
        if parser.should_upgrade():
            if raw_method == b"CONNECT" or content_length is None:
                raise _Upgrade()
            # An offer to switch protocols (curl's h2c): declined, the request is served
            # in HTTP/1.1 (RFC 9110 7.8 lets a server ignore it). llhttp stops at the head,
            # so the body is taken as it comes and the connection closes after the answer.
            self._raw_left = content_length
            keep_alive = False
        version = parser.get_http_version()
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
        request.names_hop_headers = named
        self._receiving = request
        if self._active is None and not self.closing:
            self._start(request)
        else:
            self._pipeline.append(request)
            self._pause_reading()

    def on_body(self, data: bytes) -> None:
        self._message_bytes += len(data)
        request = self._receiving
        if request is not None:
            request.body._feed(data)
            if request.body.size > BODY_HIGH_WATER:
                self._pause_reading()

    def on_message_complete(self) -> None:
        self._read_done += self._message_bytes
        if self._raw_left:
            return  # a declined upgrade's body: not parsed, taken as it comes
        request = self._receiving
        if request is not None:
            self._receiving = None
            request.body._finish()

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
            self.close()
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

    def _take_raw_body(self, data: bytes) -> None:
        """The body of a request whose upgrade offer was declined (`_raw_left` bytes
        more); anything after it is not read: the connection closes after the answer."""
        left = self._raw_left or 0
        if not left or not data:
            return
        piece = data[:left]
        self._raw_left = left - len(piece)
        self.on_body(piece)
        if self._raw_left == 0:
            request, self._receiving = self._receiving, None
            if request is not None:
                request.body._finish()

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
        self._in_head = False
        self._head_since = None
        receiving, self._receiving = self._receiving, None
        if receiving is not None:
            receiving.body._fail(BodyCutOff("the request's framing is broken"))
        self.closing = True
        if self._active is None:
            if self.transport is not None:
                self.transport.write(answer)
            self.close()
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
        if self.transport is None or self._active is not None:
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


# The bytes of a request line and head end beyond its target and headers ("POST ",
# " HTTP/1.1\r\n", the final "\r\n"), at most: a head's size is never overestimated.
_REQUEST_LINE_BYTES = 20


class _HeadTooLarge(Exception):
    pass


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
    ) -> None:
        self.handler = handler
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
