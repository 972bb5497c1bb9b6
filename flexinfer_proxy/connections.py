"""Client connections: a cap on how many, and a deadline for each request's headers.

aiohttp closes a keep-alive connection that stays idle (`--client-idle-timeout`),
but it has no deadline for a request's head and no cap on connections, so 3,000
half-sent requests (slow loris) hold 3,000 descriptors for as long as they like.
`ConnectionGuard` wraps aiohttp's protocol factory:

- `--client-header-timeout`: from a connection's start, and from the first byte of
  each later request, the request's head must be complete within the timeout, or
  the connection is closed.
- `--max-connections`: at the cap, a new connection first evicts the connection
  that has been without a request in progress the longest (idle keep-alive, or
  still sending its head: nginx reuses idle keep-alive connections the same way);
  when every connection has a request in progress, the newcomer gets a 503 and is
  closed.

The request handler reports `request_started(request)` / `request_finished(request)`
(the head is complete / the answer is written). This module knows HTTP only as
"connections with or without a request in progress".
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

from flexinfer_proxy import openai_errors

log = logging.getLogger("flexinfer.proxy.connections")

_REFUSED = openai_errors.raw_response(
    503,
    "Service Unavailable",
    "The proxy serves as many connections as it may (--max-connections); retry later.",
    code="too_many_connections",
)


class GuardedConnection(asyncio.Protocol):
    """Delegates to aiohttp's protocol; keeps the state the guard needs."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self.transport: asyncio.Transport | None = None  # None once closed
        self.socket: asyncio.BaseTransport | None = None  # the guard's key, kept
        self.busy = False  # a request's head has arrived and its answer is not done
        self._deadline: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = self.socket = cast(asyncio.Transport, transport)
        if not self._guard.admit(self):
            self.transport.write(_REFUSED)
            self.transport.close()
            self.transport = None
            return
        self._arm()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        if not self.busy and self._deadline is None:
            self._arm()  # the first bytes of the next request's head
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self.transport is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return
        self.transport = None
        self._disarm()
        self._guard.forget(self)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # -- state -----------------------------------------------------------------

    def started(self) -> None:
        self.busy = True
        self._disarm()
        self._guard.mark_busy(self)

    def finished(self) -> None:
        self.busy = False
        self._guard.mark_idle(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self._guard.loop.call_later(
            self._guard.header_timeout, self._header_timed_out
        )

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _header_timed_out(self) -> None:
        self._deadline = None
        if not self.busy and self.transport is not None:
            log.info("closing a connection whose request head did not arrive in time")
            self._guard.on_closed("header_timeout")
            self.transport.close()


class ConnectionGuard:
    def __init__(
        self,
        inner_factory: Callable[[], Any],
        *,
        max_connections: int,
        header_timeout: float,
        loop: asyncio.AbstractEventLoop,
        on_closed: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._inner_factory = inner_factory
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.loop = loop
        self._open: dict[asyncio.BaseTransport, GuardedConnection] = {}
        # Connections without a request in progress, longest first.
        self._idle: OrderedDict[GuardedConnection, None] = OrderedDict()
        self.on_closed = on_closed  # called with "refused", "evicted" or "header_timeout"

    def __call__(self) -> GuardedConnection:
        return GuardedConnection(self, self._inner_factory())

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def admit(self, connection: GuardedConnection) -> bool:
        if len(self._open) >= self.max_connections:
            if not self._idle:
                self.on_closed("refused")
                log.warning("refusing a connection: %d are open", len(self._open))
                return False
            oldest, _ = self._idle.popitem(last=False)
            self.on_closed("evicted")
            self.forget(oldest)  # counted out now; its connection_lost comes later
            oldest.close()
        assert connection.socket is not None
        self._open[connection.socket] = connection
        self._idle[connection] = None
        return True

    def forget(self, connection: GuardedConnection) -> None:
        self._idle.pop(connection, None)
        if connection.socket is not None:
            self._open.pop(connection.socket, None)

    def mark_busy(self, connection: GuardedConnection) -> None:
        self._idle.pop(connection, None)

    def mark_idle(self, connection: GuardedConnection) -> None:
        if connection.transport is not None:
            self._idle[connection] = None
            self._idle.move_to_end(connection)

    def of(self, request: web.BaseRequest) -> GuardedConnection | None:
        transport = request.transport
        return self._open.get(transport) if transport is not None else None
