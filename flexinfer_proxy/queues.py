"""Per-model FIFO queues of requests waiting for their model to become Ready.

A request for a model that is not Ready (or that already has others waiting, so
nobody jumps the line) takes a `Ticket` and waits. Queues are kept by the entry's
key (`namespace/name`), so same-named models of two namespaces never share one.
When the directory says the model is Ready, a drain task admits tickets oldest
first; each admitted request signals `dispatched()` once its place toward the
backend is fixed (headers on the wire, or in line for a capped backend's slot, see
`backend_slots`) or it gave up, and only then is the next one admitted. Requests
on separate connections may still reach an uncapped backend's handlers slightly
out of order; with a cap they cannot. A drain stops as soon as the model is no
longer Ready and resumes on the next change. Every change of a queue is reported
to the `DemandSignaller`.

This module owns waiting and ordering; it neither forwards requests nor decides
the wait limit's length (the caller passes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections import deque
from datetime import datetime

from flexinfer_kube.clock import Clock
from flexinfer_proxy.demand import DemandSignaller, QueueReport
from flexinfer_proxy.directory import ModelDirectory, ModelEntry
from flexinfer_proxy.metrics import ProxyMetrics

log = logging.getLogger("flexinfer.proxy.queues")

# How long a drain waits for an admitted request to reach its backend before it
# admits the next anyway: a connect that hangs (a black-holed address) must not
# make every queued request wait out the full connect timeout in turn.
DISPATCH_GRACE_SECONDS = 2.0


class WaitResult(enum.Enum):
    ADMITTED = "admitted"  # the model is Ready and it is this request's turn
    TIMED_OUT = "timed_out"  # the wait limit passed
    CLOSING = "closing"  # the proxy is shutting down


class Ticket:
    """One queued request: admitted by the drain, dispatched by its handler."""

    def __init__(self, key: str, *, arrived: datetime, enqueued_at: float) -> None:
        self.key = key
        self.arrived = arrived
        self.enqueued_at = enqueued_at
        # True: go ahead; False: refused because the proxy is closing.
        self.admitted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._dispatched = asyncio.Event()

    def dispatched(self) -> None:
        """The request reached its backend (or never will): the next may go."""
        self._dispatched.set()

    async def wait_dispatched(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._dispatched.wait(), timeout)


class RequestQueues:
    def __init__(
        self,
        directory: ModelDirectory,
        signaller: DemandSignaller,
        *,
        clock: Clock,
        metrics: ProxyMetrics,
        dispatch_grace: float = DISPATCH_GRACE_SECONDS,
    ) -> None:
        self._directory = directory
        self._signaller = signaller
        self._clock = clock
        self._metrics = metrics
        self._dispatch_grace = dispatch_grace
        self._queues: dict[str, deque[Ticket]] = {}
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self._total = 0
        directory.subscribe(self.model_changed)

    def depth(self, key: str) -> int:
        return len(self._queues.get(key, ()))

    @property
    def total(self) -> int:
        """Requests waiting across every model."""
        return self._total

    def oldest_wait(self, key: str) -> float:
        """Seconds the longest-waiting request for `key` has waited (0 when none)."""
        queue = self._queues.get(key)
        return self.waited(queue[0]) if queue else 0.0

    def enqueue(self, entry: ModelEntry) -> Ticket:
        loop = asyncio.get_running_loop()
        ticket = Ticket(entry.key, arrived=self._clock.now(), enqueued_at=loop.time())
        if self._closed:
            ticket.admitted.set_result(False)
            return ticket
        self._queues.setdefault(entry.key, deque()).append(ticket)
        self._total += 1
        self._changed(entry)
        self.model_changed(entry.key)
        return ticket

    async def wait(self, ticket: Ticket, *, limit: float) -> WaitResult:
        """Wait until admitted, refused (closing) or the limit passed (the ticket is gone).

        A cancelled wait (the client went away) removes the ticket, or, if it was
        admitted in the meantime, releases the drain, and re-raises.
        """
        try:
            await asyncio.wait({ticket.admitted}, timeout=limit)
        except asyncio.CancelledError:
            if not self._discard(ticket):
                ticket.dispatched()
            raise
        if not ticket.admitted.done():
            self._discard(ticket)
            return WaitResult.TIMED_OUT
        return WaitResult.ADMITTED if ticket.admitted.result() else WaitResult.CLOSING

    def waited(self, ticket: Ticket) -> float:
        return asyncio.get_running_loop().time() - ticket.enqueued_at

    def model_changed(self, key: str) -> None:
        """Directory listener: start a drain when a model with waiters is Ready."""
        entry = self._directory.lookup(key)
        if entry is None or not entry.ready or not self._queues.get(key):
            return
        if self._closed or key in self._drains:
            return
        self._drains[key] = asyncio.create_task(self._drain(key))

    async def close(self) -> None:
        """Stop draining and refuse every waiting request (they answer 503, not a cut)."""
        self._closed = True
        for task in self._drains.values():
            task.cancel()
        for task in list(self._drains.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for key, queue in self._queues.items():
            while queue:
                queue.popleft().admitted.set_result(False)
                self._total -= 1
            entry = self._directory.lookup(key)
            if entry is not None:
                self._changed(entry)

    async def _drain(self, key: str) -> None:
        try:
            while True:
                entry = self._directory.lookup(key)
                queue = self._queues.get(key)
                if entry is None or not entry.ready or not queue:
                    return
                ticket = queue.popleft()
                self._total -= 1
                self._changed(entry)
                ticket.admitted.set_result(True)
                await ticket.wait_dispatched(self._dispatch_grace)
        finally:
            self._drains.pop(key, None)
            # A change may have arrived while this drain was finishing.
            self._restart_if_needed(key)

    def _restart_if_needed(self, key: str) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closing
            asyncio.get_running_loop().call_soon(self.model_changed, key)

    def _discard(self, ticket: Ticket) -> bool:
        queue = self._queues.get(ticket.key)
        if queue is None or ticket not in queue:
            return False
        queue.remove(ticket)
        self._total -= 1
        entry = self._directory.lookup(ticket.key)
        if entry is not None:
            self._changed(entry)
        else:
            self._metrics.queued.labels(model=ticket.key).set(len(queue))
        return True

    def _changed(self, entry: ModelEntry) -> None:
        queue = self._queues.get(entry.key) or deque()
        self._metrics.queued.labels(model=entry.key).set(len(queue))
        oldest = queue[0].arrived if queue else None
        self._signaller.queue_changed(entry, QueueReport(queued=len(queue), oldest_waiting=oldest))
