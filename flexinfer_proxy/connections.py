"""Client connections: a cap on how many, and which one makes room at the cap.

`--max-connections`: at the cap, a new connection first evicts the connection that
has been without a request in progress the longest (idle keep-alive, or still
sending its head: nginx reuses idle keep-alive connections the same way); when
every connection has a request in progress, the newcomer gets a 503 and is closed.

The server (`http_server`) tells the guard when a connection opens (`admit`), closes
(`forget`), starts a request (`mark_busy`), finishes its answer (`mark_idle`) and
closes lingering (`mark_lingering`: evicted before any other); it
also enforces the header and idle timeouts and reports the closes it makes for them
through `on_closed`. This module knows HTTP only as "connections with or without a
request in progress".
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("flexinfer.proxy.connections")


class Closable(Protocol):
    def close(self) -> None: ...


class ConnectionGuard:
    def __init__(
        self,
        *,
        max_connections: int,
        on_closed: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.max_connections = max_connections
        self._open: set[Closable] = set()
        # Connections without a request in progress, longest first.
        self._idle: OrderedDict[Closable, None] = OrderedDict()
        self.on_closed = on_closed  # called with "refused", "evicted" or "header_timeout"

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def admit(self, connection: Closable) -> bool:
        if len(self._open) >= self.max_connections:
            if not self._idle:
                self.on_closed("refused")
                log.warning("refusing a connection: %d are open", len(self._open))
                return False
            oldest, _ = self._idle.popitem(last=False)
            self.on_closed("evicted")
            self.forget(oldest)  # counted out now; its connection_lost comes later
            oldest.close()
        self._open.add(connection)
        self._idle[connection] = None
        return True

    def forget(self, connection: Closable) -> None:
        self._idle.pop(connection, None)
        self._open.discard(connection)

    def mark_busy(self, connection: Closable) -> None:
        self._idle.pop(connection, None)

    def mark_idle(self, connection: Closable) -> None:
        if connection in self._open:
            self._idle[connection] = None  # a new key goes last: the most recently idle

    def mark_lingering(self, connection: Closable) -> None:
        """Answered and closing, only draining what the client still sends: the first
        to make room at the cap."""
        if connection in self._open:
            self._idle[connection] = None
            self._idle.move_to_end(connection, last=False)
