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
- reuse: a connection goes back to its origin's pool only after a whole answer and
  when neither side asked to close; one the backend closes while idle is dropped when
  its close is seen, and idle ones are closed after `POOL_IDLE_SECONDS`. A close
  that crosses a request on a reused connection (no byte of an answer came) is
  told apart (`reused`, `answer_started`) so the caller can send it again.

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

from flexinfer_proxy.write_flow import WriteFlow

# Bodies are written to the backend in slices of this size, draining in between.
SEND_SLICE_BYTES = 256 * 1024
MAX_ANSWER_HEAD_BYTES = 64 * 1024
# Reading from a backend pauses while this much of its answer waits to be relayed
# (and resumes once it is taken).
BODY_HIGH_WATER = 256 * 1024
POOL_IDLE_SECONDS = 15.0  # aiohttp's connector kept idle connections as long
SWEEP_SECONDS = 2.5
DNS_CACHE_SECONDS = 10.0

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
        self.idle_since = 0.0
        self.reused = False  # taken from the pool (it carried an answer before)
        self.answer_started = False  # a byte of the current answer arrived
        # The answer being read.
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self.names_hop_headers = False  # a `Connection` header was sent
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self._chunks: list[bytes] = []
        self._size = 0
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._in_head = False
        self._fragmented = False
        self._head_bytes = 0
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
        self.answer_started = True
        if phase == _READING:
            self._last_data = self._loop.time()
        if self._in_head:
            # A head arriving in pieces: count what this piece adds to it.
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end
            if self._head_bytes > MAX_ANSWER_HEAD_BYTES:
                self._head_too_large()
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:
            if isinstance(error.__context__, _HeadTooLarge):
                self._head_too_large()
            else:
                self._broken(f"invalid answer: {error.__context__ or error}")
            return
        except httptools.HttpParserUpgrade:
            self._broken("the backend switched protocols")
            return
        except httptools.HttpParserError as error:
            self._broken(f"the answer is not HTTP/1.x: {error}")
            return
        if self._in_head and not self._fragmented:
            # A head begun in this read is still open: llhttp holds all of it.
            self._fragmented = True
            self._head_bytes = len(data)
            if self._head_bytes > MAX_ANSWER_HEAD_BYTES:
                self._head_too_large()
                return
        if self._phase == _READING:
            due = self._last_data + self._timeouts.read
            if self._timer is None or self._timer_due > due:
                self._arm(due)

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
            self.complete = True  # the answer gave no length: the close ends it
            self.keep_alive = False
            self._phase = _IDLE
            self._wake()
        elif self._phase != _IDLE:
            detail = f": {exc}" if exc else ""
            self._fail(AnswerFailed(f"the backend closed the connection{detail}"))
        self.fail_writers(AnswerFailed("the backend closed the connection"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._fragmented = False
        self._head_bytes = 0
        self.headers = []
        self.reason = b""

    def on_status(self, reason: bytes) -> None:
        self.reason += reason
        self._count(len(reason))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        if not self._fragmented:  # (the count of `_count`, inlined: once per header)
            self._head_bytes += len(name) + len(value) + 4
            if self._head_bytes > MAX_ANSWER_HEAD_BYTES:
                raise _HeadTooLarge()

    def _count(self, size: int) -> None:
        if not self._fragmented:
            self._head_bytes += size
            if self._head_bytes > MAX_ANSWER_HEAD_BYTES:
                raise _HeadTooLarge()

    def on_headers_complete(self) -> None:
        self._in_head = False
        status = self._parser.get_status_code()
        if status < 200:
            if status == 101:
                raise _Switching()
            self._informational = True  # 100 Continue, 103 Early Hints: not the answer
            return
        length: int | None = None
        chunked = False
        named = False
        for name, value in self.headers:
            size = len(name)
            if size == 14 and name.lower() == b"content-length":
                length = int(value)
            elif size == 17 and name.lower() == b"transfer-encoding":
                chunked = True
            elif size == 10 and name.lower() == b"connection":
                named = True
        self.names_hop_headers = named
        self.status = status
        self.content_length = None if chunked else length
        self.keep_alive = self._parser.should_keep_alive()
        self._eof_delimited = length is None and not chunked and status not in (204, 304)
        self.head_done = True
        self._phase = _READING
        self._last_data = self._loop.time()
        self._wake()

    def on_body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > BODY_HIGH_WATER and not self._reading_paused:
            self._reading_paused = True
            if self.transport is not None:
                self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self.complete = True
        self._phase = _IDLE
        self._wake()

    # -- the exchange --------------------------------------------------------------------

    async def exchange(
        self, head: bytes, body: bytes | bytearray, *, on_sent: Callable[[], None] | None
    ) -> None:
        """Send a request; return once the answer's head is in. Raises `UpstreamError`."""
        transport = self.transport
        if transport is None:
            raise AnswerFailed("the backend closed the connection")
        self.head_done = self.complete = self.keep_alive = self.answer_started = False
        self.status = 0
        self.content_length = None
        self._chunks = []
        self._size = 0
        self._error = None
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
                if self._error is not None:
                    break  # an answer (or a failure) came before the whole body went
                if self.transport is None:
                    break
                self.transport.write(view[start : start + SEND_SLICE_BYTES])
                await self.wait_writable()
        while not self.head_done:
            if self._error is not None:
                raise self._error
            self._waiter = waiter = self._loop.create_future()
            await waiter

    def take(self) -> bytes:
        """The answer's body bytes that arrived and were not taken yet."""
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._size = 0
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        """The next bytes of the answer's body; b"" at its end. Raises `UpstreamError`."""
        while not self._chunks:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()
        return self.take()

    async def read_all(self) -> bytes:
        parts = []
        while chunk := await self.read():
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.close()

    # -- inside ----------------------------------------------------------------------------

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        await self._waiter

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None and not self.complete:
            self._error = error
        self._phase = _IDLE
        self._wake()

    def _broken(self, message: str) -> None:
        self._fail(AnswerFailed(message))
        self.close()

    def _head_too_large(self) -> None:
        self._broken(f"the answer's head is larger than {MAX_ANSWER_HEAD_BYTES} bytes")

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


class _HeadTooLarge(Exception):
    pass


class _Switching(Exception):
    pass


class UpstreamPool:
    """Connections to every backend, kept for reuse per origin."""

    def __init__(
        self,
        *,
        timeouts: UpstreamTimeouts | None = None,
        resolver: AbstractResolver | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.timeouts = timeouts or UpstreamTimeouts()
        self._resolver = resolver
        self._own_resolver = resolver is None
        self._idle: dict[Origin, list[UpstreamConnection]] = {}
        self._open: set[UpstreamConnection] = set()
        self._addresses: dict[tuple[str, int], tuple[float, list[tuple[str, int, int]]]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._tls: ssl.SSLContext | None = None
        self.connects = 0  # connections opened so far (tests read it)

    @property
    def idle_connections(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    async def acquire(self, origin: Origin) -> UpstreamConnection:
        """A connection to `origin`: an idle one if there is one, else a new one."""
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if connection.alive and transport is not None and not transport.is_closing():
                connection.reused = True
                return connection
        return await self._connect(origin)

    async def connect(self, origin: Origin) -> UpstreamConnection:
        """A new connection to `origin`, never an idle one. Raises `ConnectFailed`."""
        return await self._connect(origin)

    def release(self, connection: UpstreamConnection) -> None:
        """Back to the pool if another request may use it (its answer was read whole,
        neither side asked to close, nothing failed), else closed."""
        if not (connection.complete and connection.keep_alive and connection.alive) or (
            connection._error is not None
        ):
            connection.close()
            return
        connection.idle_since = self.loop.time()
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
        oldest_kept = self.loop.time() - POOL_IDLE_SECONDS
        for idle in self._idle.values():
            while idle and idle[0].idle_since <= oldest_kept:
                idle.pop(0).close()
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
