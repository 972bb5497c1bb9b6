"""Pooled HTTP/1.1 connections to backends: the proxy's forward hop.

Built on asyncio protocols and httptools' response parser (llhttp) rather than
aiohttp's ClientSession, whose request and response objects, connector bookkeeping
and payload streams cost about 90 µs of CPU a request (docs/benchmarks.md). What it
owns:

- connecting: a name is resolved by the given resolver (aiohttp's interface, so
  `--resolve-file` works as before; answers are kept 10 s as aiohttp's connector
  did), each address is tried in turn, all within the connect timeout; `https://`
  origins use the system's trust store;
- one request at a time per connection: the head and body are written (a body over
  `SEND_SLICE_BYTES` in slices, each taken by the socket before the next), and
  `on_sent` is called once the head is on the wire;
- the answer: its head (at most `MAX_ANSWER_HEAD_BYTES`; 1xx answers are skipped),
  then its body as it arrives, with backpressure (reading pauses while more than
  `BODY_HIGH_WATER` bytes wait), ended by its length, its last chunk or, when it
  gives neither, the close;
- timeouts: no head within the headers timeout, or silence mid-body longer than the
  read timeout, fails the exchange and closes the connection. One lazily re-armed
  timer per connection watches both, so a request costs no timer operations;
- heads measured by `framing.HeadMeter` (1xx heads skipped, at most
  `MAX_ANSWER_HEAD_BYTES` each) and bodies framed by `framing.answer_head`; bytes
  after an answer's end make the connection unfit for reuse;
- reuse: a connection goes back to its origin's pool only after a whole answer and
  when neither side asked to close, and is taken again only while it has been idle
  less than `idle_timeout` (`--backend-idle-timeout`, below every rendered backend's
  keep-alive) and less than the backend's own `Keep-Alive: timeout=N` less a
  second; one the backend closes while idle is dropped when its close is seen. A
  connection that carried an event stream (`text/event-stream`) is closed, not pooled:
  llama.cpp's server closes every connection right after a streamed answer while its
  headers say keep-alive, and a request sent on it in between would fail (a stream
  lasts seconds of generation: a new connection is noise beside it). A
  request is sent once: the backend closing a reused connection as the request
  crosses it is avoided by those limits, and answered 502 when it happens anyway
  (the backend may have started it: sending it again could run it twice);
- ending an origin's answers on request (`end_answers`), for a backend whose pods are
  going away.

It knows nothing of clients, models or queues.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

import attrs
import httptools
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from flexinfer_proxy.framing import (
    LENGTH,
    UNTIL_CLOSE,
    BodyBuffer,
    HeadMeter,
    HeadTooLarge,
    answer_head,
)
from flexinfer_proxy.write_flow import WriteFlow

# Bodies are written to the backend in slices of this size, draining in between.
SEND_SLICE_BYTES = 256 * 1024
MAX_ANSWER_HEAD_BYTES = 64 * 1024
# Reading from a backend pauses while this much of its answer waits to be relayed
# (and resumes once it is taken).
BODY_HIGH_WATER = 256 * 1024
# A pooled connection idle this long is not used again: below the keep-alive of every
# backend we render (uvicorn's 5 s: vLLM, SGLang, mlc-llm; llama.cpp's server, 5 s),
# so the backend never closes it just as a request is sent on it.
DEFAULT_IDLE_SECONDS = 4.0
# A backend's `Keep-Alive: timeout=N` shortens it to N less this margin.
KEEP_ALIVE_MARGIN_SECONDS = 1.0
SWEEP_SECONDS = 2.5
DNS_CACHE_SECONDS = 10.0
EVENT_STREAM = b"text/event-stream"

_IDLE, _WAITING, _READING = 0, 1, 2


@attrs.frozen
class UpstreamTimeouts:
    connect: float = 10.0
    headers: float = 600.0  # a non-streamed completion sends its headers when done
    read: float = 300.0  # silence between two chunks of an answer


class UpstreamError(Exception):
    """The exchange with the backend failed."""


class ConnectFailed(UpstreamError):
    """No connection (refused, unreachable, unknown name, connect timeout): nothing sent."""


class HeadersTimeout(UpstreamError):
    """The backend sent no head within the headers timeout."""


class AnswerFailed(UpstreamError):
    """The connection closed or broke, or the answer is not HTTP, or it fell silent."""

    def __init__(self, message: str, *, silent: bool = False) -> None:
        super().__init__(message)
        self.silent = silent  # ended by the read timeout


class AnswerStopped(AnswerFailed):
    """The proxy ended the answer: the pods of the model it came from are going away."""


@attrs.frozen(cache_hash=True)
class Origin:
    """Where a backend listens: what a pooled connection is good for."""

    scheme: str
    host: str
    port: int
    host_header: bytes = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        value = (host if self.port == default else f"{host}:{self.port}").encode("idna")
        object.__setattr__(self, "host_header", value)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def origin_of(url: str) -> tuple[Origin, str]:
    """The origin of `url` and its path (without a trailing slash)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if scheme == "https" else 80)
    return Origin(scheme, parts.hostname, port), parts.path.rstrip("/")


class _Answer(BodyBuffer):
    """An answer's body as it arrives; taking it lets reading from the backend resume."""

    __slots__ = ("_connection",)
    _connection: UpstreamConnection  # set by its connection (one buffer per connection)

    def _taken(self) -> None:
        self._connection._resume_reading()


class UpstreamConnection(WriteFlow, asyncio.Protocol):
    """One connection to a backend, and the answer being read on it."""

    def __init__(self, pool: UpstreamPool, origin: Origin) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._timeouts = pool.timeouts
        self.origin = origin
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.alive = True
        self.reuse_until = 0.0  # when idle in the pool: not taken after this
        # The answer being read.
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self.names_hop_headers = False  # a `Connection` header was sent
        self.head_done = False
        self.keep_alive = False
        self.keep_alive_hint: float | None = None  # `Keep-Alive: timeout=N`, seconds
        self.body = _Answer()
        self.body._connection = self
        self._meter = HeadMeter(MAX_ANSWER_HEAD_BYTES)
        self._in_body = False  # the final head is in: the rest is the answer's body
        self._informational = False
        self._eof_delimited = False
        # Timeouts.
        self._phase = _IDLE
        self._sent_at = 0.0
        self._last_data = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0
        # Backpressure (writing: `WriteFlow`).
        self._reading_paused = False

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == _IDLE:
            self.close()  # nothing was asked: a broken or hostile backend
            return
        if phase == _READING:
            self._last_data = self._loop.time()
        try:
            self._take(data)
        except HeadTooLarge:
            self._broken(f"the answer's head is larger than {MAX_ANSWER_HEAD_BYTES} bytes")
            return
        except httptools.HttpParserCallbackError as error:
            if isinstance(error.__context__, _AfterAnswer):
                self.keep_alive = False  # more than one answer: never reused
                self.close()
            else:
                self._broken(f"invalid answer: {error.__context__ or error}")
            return
        except httptools.HttpParserUpgrade:
            self._broken("the backend switched protocols")
            return
        except httptools.HttpParserError as error:
            self._broken(f"the answer is not HTTP/1.x: {error}")
            return
        if self._phase == _READING:
            due = self._last_data + self._timeouts.read
            if self._timer is None or self._timer_due > due:
                self._arm(due)

    def _take(self, data: bytes) -> None:
        """Measure each head up to its end, then hand the rest to llhttp whole: nothing
        may follow an answer. Only a 1xx head (`HTTP/1.1 1..`) is cut from what
        follows it, since another head comes after it."""
        start = 0
        meter = self._meter
        while not self._in_body:
            began_here = not meter.size
            end = meter.scan(data, start)
            if end < 0:
                break
            if began_here and data[start : start + 10] != b"HTTP/1.1 1":
                break  # the answer's own head: its body follows in the same call
            self._parser.feed_data(data[start:end])
            start = end
            if start >= len(data):
                return
        self._parser.feed_data(data if start == 0 else data[start:])

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pool._lost(self)
        if self._phase == _READING and self._eof_delimited:
            self.keep_alive = False
            self._phase = _IDLE
            self.body.finish()  # the answer gave no length: the close ends it
        elif self._phase != _IDLE:
            detail = f": {exc}" if exc else ""
            self._fail(AnswerFailed(f"the backend closed the connection{detail}"))
        self.fail_writers(AnswerFailed("the backend closed the connection"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.body.complete:
            raise _AfterAnswer()
        self.headers = []
        self.reason = b""

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            if status == 101:
                raise _Switching()
            self._informational = True  # 100 Continue, 103 Early Hints: not the answer
            return
        framing, length, self.names_hop_headers, self.keep_alive_hint = answer_head(
            self.headers, status=status
        )
        self.status = status
        self.content_length = length if framing == LENGTH else None
        self.keep_alive = self._parser.should_keep_alive()
        self._eof_delimited = framing == UNTIL_CLOSE
        self._in_body = True
        self.head_done = True
        self._phase = _READING
        self._last_data = self._loop.time()
        self.body.wake()

    def on_body(self, data: bytes) -> None:
        body = self.body
        body.feed(data)
        if body.size > BODY_HIGH_WATER and not self._reading_paused:
            self._reading_paused = True
            if self.transport is not None:
                self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self._phase = _IDLE
        self.body.finish()

    # -- the exchange --------------------------------------------------------------------

    async def exchange(
        self, head: bytes, body: bytes | bytearray, *, on_sent: Callable[[], None] | None
    ) -> None:
        """Send a request; return once the answer's head is in. Raises `UpstreamError`.
        A request is sent once: whatever fails after its first byte was written is the
        caller's to answer, never to send again (the backend may be running it)."""
        transport = self.transport
        if transport is None:
            raise AnswerFailed("the backend closed the connection")
        self.head_done = self.keep_alive = self._in_body = False
        self.status = 0
        self.content_length = None
        self.keep_alive_hint = None
        # The answer's buffer, emptied rather than made anew (no allocation per request;
        # the last answer was relayed whole before the connection came back to the pool).
        answer = self.body
        answer._chunks = []
        answer.size = 0
        answer.complete = False
        answer.error = None
        answer._waiter = None
        self._phase = _WAITING
        self._sent_at = now = self._loop.time()
        self._arm(now + self._timeouts.headers)
        if len(body) <= SEND_SLICE_BYTES:
            transport.write(head + body)
            if on_sent is not None:
                on_sent()
        else:
            transport.write(head)
            if on_sent is not None:
                on_sent()
            view = memoryview(body)
            for start in range(0, len(view), SEND_SLICE_BYTES):
                if answer.error is not None or self.head_done:
                    break  # an answer (or a failure) came before the whole body went
                if self.transport is None:
                    break
                self.transport.write(view[start : start + SEND_SLICE_BYTES])
                await self.wait_writable()
        while not self.head_done:
            if answer.error is not None:
                raise answer.error
            await answer.wait()

    def close(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.close()

    @property
    def answering(self) -> bool:
        """A request was sent and its answer is not all in yet."""
        return self._phase != _IDLE

    def stop_answer(self, reason: str) -> None:
        """End the answer in progress with `AnswerStopped(reason)` and close."""
        self._fail(AnswerStopped(reason))
        self.close()

    # -- inside ----------------------------------------------------------------------------

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def _fail(self, error: UpstreamError) -> None:
        self._phase = _IDLE
        self.body.fail(error)

    def _broken(self, message: str) -> None:
        self._fail(AnswerFailed(message))
        self.close()

    def _arm(self, due: float) -> None:
        timer = self._timer
        if timer is not None:
            if self._timer_due <= due:
                return
            timer.cancel()
        self._timer_due = due
        self._timer = self._loop.call_at(due, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self.alive:
            return
        now = self._loop.time()
        if self._phase == _WAITING:
            due = self._sent_at + self._timeouts.headers
            if now >= due:
                self._fail(HeadersTimeout(f"no headers within {self._timeouts.headers:g}s"))
                self.close()
                return
        elif self._phase == _READING:
            due = self._last_data + self._timeouts.read
            if now >= due:
                message = f"silent for {self._timeouts.read:g}s mid-answer"
                self._fail(AnswerFailed(message, silent=True))
                self.close()
                return
        else:
            return
        self._arm(due)


class _AfterAnswer(Exception):
    pass


class _Switching(Exception):
    pass


def header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header `name` (lower case) in an answer's headers, or None."""
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def media_type(headers: list[tuple[bytes, bytes]]) -> bytes:
    """An answer's media type, lower case, without parameters (b"" when it names none)."""
    value = header_value(headers, b"content-type") or b""
    return value.split(b";", 1)[0].strip().lower()


class UpstreamPool:
    """Connections to every backend, kept for reuse per origin."""

    def __init__(
        self,
        *,
        timeouts: UpstreamTimeouts | None = None,
        resolver: AbstractResolver | None = None,
        idle_timeout: float = DEFAULT_IDLE_SECONDS,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.timeouts = timeouts or UpstreamTimeouts()
        self.idle_timeout = idle_timeout
        self._resolver = resolver
        self._own_resolver = resolver is None
        self._idle: dict[Origin, list[UpstreamConnection]] = {}
        self._open: set[UpstreamConnection] = set()
        self._addresses: dict[tuple[str, int], tuple[float, list[tuple[str, int, int]]]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._tls: ssl.SSLContext | None = None
        self.connects = 0  # connections opened so far (tests read it)

    def end_answers(self, origin: Origin, reason: str) -> int:
        """End every answer in progress from `origin` and close all its connections;
        returns how many answers were ended.

        For a backend whose pods are going away (scaled to zero). A server told to stop
        may stop generating yet hold the answer's connection open until its client
        closes it (llama-server does), so its pod would take its whole termination
        grace period to go and the next model's pod would wait for it."""
        ended = 0
        for connection in list(self._open):
            if connection.origin != origin:
                continue
            if connection.answering:
                connection.stop_answer(reason)
                ended += 1
            else:
                connection.close()
        self._idle.pop(origin, None)
        return ended

    @property
    def idle_connections(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    async def acquire(self, origin: Origin) -> UpstreamConnection:
        """A connection to `origin`: an idle one (`take_idle`), else a new one."""
        return self.take_idle(origin) or await self._connect(origin)

    def take_idle(self, origin: Origin) -> UpstreamConnection | None:
        """An idle connection to `origin` still within its keep-alive (the most recently
        used), or None."""
        idle = self._idle.get(origin)
        if idle:
            now = self.loop.time()
            while idle:
                connection = idle.pop()
                transport = connection.transport
                if (
                    now < connection.reuse_until
                    and connection.alive
                    and transport is not None
                    and not transport.is_closing()
                ):
                    return connection
                connection.close()
        return None

    def release(self, connection: UpstreamConnection) -> None:
        """Back to the pool if another request may use it (its answer was read whole,
        neither side asked to close, nothing failed, its keep-alive leaves time), else
        closed."""
        keep = self.idle_timeout
        hint = connection.keep_alive_hint
        if hint is not None:
            keep = min(keep, hint - KEEP_ALIVE_MARGIN_SECONDS)
        if (
            keep <= 0
            or not (connection.body.complete and connection.keep_alive and connection.alive)
            or connection.body.error is not None
            or (
                connection.content_length is None and media_type(connection.headers) == EVENT_STREAM
            )
        ):
            connection.close()
            return
        connection.reuse_until = self.loop.time() + keep
        idle = self._idle.get(connection.origin)
        if idle is None:
            idle = self._idle[connection.origin] = []
        idle.append(connection)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(SWEEP_SECONDS, self._sweep)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in list(self._open):
            connection.close()
        self._idle.clear()
        if self._own_resolver and self._resolver is not None:
            await self._resolver.close()
        await asyncio.sleep(0)  # let the transports' close callbacks run

    def _lost(self, connection: UpstreamConnection) -> None:
        self._open.discard(connection)
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.loop.time()
        for origin, idle in self._idle.items():
            kept = [c for c in idle if now < c.reuse_until]
            for connection in idle:
                if now >= connection.reuse_until:
                    connection.close()
            self._idle[origin] = kept
        if any(self._idle.values()):
            self._sweeper = self.loop.call_later(SWEEP_SECONDS, self._sweep)

    async def _connect(self, origin: Origin) -> UpstreamConnection:
        seconds = self.timeouts.connect
        try:
            async with asyncio.timeout(seconds):
                addresses = await self._resolve(origin)
                failure: OSError | None = None
                for host, port, family in addresses:
                    try:
                        _, connection = await self.loop.create_connection(
                            lambda: UpstreamConnection(self, origin),
                            host,
                            port,
                            family=family,
                            ssl=self._tls_context() if origin.scheme == "https" else None,
                            server_hostname=origin.host if origin.scheme == "https" else None,
                        )
                    except OSError as error:
                        failure = error
                        continue
                    self.connects += 1
                    self._open.add(connection)
                    return connection
                raise ConnectFailed(f"cannot connect to {origin}: {failure}")
        except TimeoutError as error:
            raise ConnectFailed(f"Connection timeout to {origin} after {seconds:g}s") from error
        except OSError as error:  # the name did not resolve
            raise ConnectFailed(f"cannot connect to {origin}: {error}") from error

    async def _resolve(self, origin: Origin) -> list[tuple[str, int, int]]:
        key = (origin.host, origin.port)
        cached = self._addresses.get(key)
        now = self.loop.time()
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            address = ipaddress.ip_address(origin.host)
        except ValueError:
            if self._resolver is None:
                self._resolver = DefaultResolver()
            results = await self._resolver.resolve(origin.host, origin.port, socket.AF_UNSPEC)
            found = [(r["host"], r["port"], r["family"]) for r in results]
            expires = now + DNS_CACHE_SECONDS
        else:
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            found = [(origin.host, origin.port, family)]
            expires = float("inf")
        if not found:
            raise OSError(f"{origin.host} has no address")
        self._addresses[key] = (expires, found)
        return found

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
