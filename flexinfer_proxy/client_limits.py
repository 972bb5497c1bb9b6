"""Per-client bounds: requests in progress and requests queued, per client.

A client is its API key (the Secret entry's name) when the proxy has keys, else the
address its connection comes from; behind a load balancer that does not keep client
addresses, every client is that balancer's address, and the limits are its.

- `--max-concurrent-per-client`: requests of one client the proxy handles at once,
  from their head to the end of their answer (reading the body, queued, relayed);
  the next is refused at once (429);
- `--max-queued-per-client`: requests of one client waiting for their model to turn
  Ready; the next that would wait is refused at once (429).

So one client can neither hold every connection's worth of work nor fill a model's
queue (`--max-queue`) for everyone else. 0 turns a limit off. This module counts; it
answers no HTTP and reads no clock.
"""

from __future__ import annotations


class ClientLimits:
    """Counts per client; `enter`/`leave` and `queue`/`unqueue` come in pairs."""

    def __init__(self, *, max_concurrent: int, max_queued: int) -> None:
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self._active: dict[str, int] = {}
        self._queued: dict[str, int] = {}

    def enter(self, client: str) -> bool:
        """Count a request of `client` in progress; False (and not counted) at its limit."""
        active = self._active
        held = active.get(client, 0)
        if held >= self.max_concurrent > 0:
            return False
        active[client] = held + 1
        return True

    def leave(self, client: str) -> None:
        # Forgotten at zero: clients come and go (addresses), the map must not grow.
        active = self._active
        held = active[client] - 1
        if held:
            active[client] = held
        else:
            del active[client]

    def may_queue(self, client: str) -> bool:
        """Whether another request of `client` may wait now (counts nothing)."""
        return not self.max_queued or self._queued.get(client, 0) < self.max_queued

    def queue(self, client: str) -> bool:
        """Count a request of `client` waiting; False (and not counted) at its limit."""
        if not self.may_queue(client):
            return False
        self._queued[client] = self._queued.get(client, 0) + 1
        return True

    def unqueue(self, client: str) -> None:
        held = self._queued[client] - 1
        if held:
            self._queued[client] = held
        else:
            del self._queued[client]

    def active(self, client: str) -> int:
        return self._active.get(client, 0)

    def queued(self, client: str) -> int:
        return self._queued.get(client, 0)
