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

Each ticket is told its 1-based position when it joins and the wait it should
expect (`estimate_wait`, from the `SwapTimes` this module feeds): a model's swap is
timed from the moment a request first waits for it while it is not Ready until the
drain lets the first one go, and kept by the node it is then Ready on (the entry's
`node`); a model waited for is expected on the node it last served on, any node when
it never has. A queue that empties because every waiting client went
away before the model was Ready (none of its requests was let go) withdraws the
model's demand (`DemandSignaller.demand_withdrawn`); one emptied by timeouts does
not (those clients were told to come back).

This module owns waiting, ordering and the swap timing; it neither forwards requests
nor decides the wait limit's length (the caller passes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections import deque
from collections.abc import Callable
from datetime import datetime

import attrs

from flexinfer_kube.clock import Clock
from flexinfer_proxy.demand import DemandSignaller, QueueReport
from flexinfer_proxy.directory import ModelDirectory, ModelEntry
from flexinfer_proxy.metrics import ProxyMetrics
from flexinfer_proxy.swap_times import CAUTIOUS, TYPICAL, SwapTimes

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
    """One queued request: admitted by the drain, dispatched by its handler.

    `position` (1-based) and `estimate` (seconds) are what it was told when it joined;
    `expected` is the wait still expected, erring long, when it gave up (for
    `Retry-After`).
    """

    def __init__(self, key: str, *, arrived: datetime, enqueued_at: float) -> None:
        self.key = key
        self.arrived = arrived
        self.enqueued_at = enqueued_at
        self.position = 0
        self.estimate = 0.0
        self.expected = 0.0
        # True: go ahead; False: refused because the proxy is closing.
        self.admitted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._dispatched = asyncio.Event()

    def dispatched(self) -> None:
        """The request reached its backend (or never will): the next may go."""
        self._dispatched.set()

    async def wait_dispatched(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._dispatched.wait(), timeout)


@attrs.frozen
class WaitingRequest:
    """A read-only view of one held request (for the live page)."""

    model: str  # namespace/name
    position: int  # 1-based, now
    waited_seconds: float
    estimate_seconds: float  # what it was told when it joined


class RequestQueues:
    def __init__(
        self,
        directory: ModelDirectory,
        signaller: DemandSignaller,
        *,
        clock: Clock,
        metrics: ProxyMetrics,
        swap_times: SwapTimes | None = None,
        dispatch_grace: float = DISPATCH_GRACE_SECONDS,
    ) -> None:
        self._directory = directory
        self._signaller = signaller
        self._clock = clock
        self._metrics = metrics
        self.swap_times = swap_times if swap_times is not None else SwapTimes()
        self._dispatch_grace = dispatch_grace
        self._queues: dict[str, deque[Ticket]] = {}
        # When the swap each waiting model is timed from began (clock time).
        self._swap_started: dict[str, datetime] = {}
        # Models whose current queue has had a request let go (its demand was real).
        self._burst_admitted: set[str] = set()
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
        queue = self._queues.setdefault(entry.key, deque())
        queue.append(ticket)
        self._total += 1
        if not entry.ready:
            self._swap_started.setdefault(entry.key, ticket.arrived)
        ticket.position = len(queue)
        ticket.estimate = self.estimate_wait(entry.key)
        self._changed(entry)
        self.model_changed(entry.key)
        return ticket

    async def wait(
        self,
        ticket: Ticket,
        *,
        limit: float,
        every: float = 0.0,
        on_tick: Callable[[Ticket], None] | None = None,
    ) -> WaitResult:
        """Wait until admitted, refused (closing) or the limit passed (the ticket is gone).

        With `on_tick`, it is called every `every` seconds while the ticket waits.
        A cancelled wait (the client went away), or one whose `on_tick` raised, removes
        the ticket, or, if it was admitted in the meantime, releases the drain, and
        re-raises.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        try:
            while True:
                left = deadline - loop.time()
                step = min(left, every) if on_tick is not None and every > 0 else left
                await asyncio.wait({ticket.admitted}, timeout=max(0.0, step))
                if ticket.admitted.done() or loop.time() >= deadline or on_tick is None:
                    break
                on_tick(ticket)
        except BaseException as error:
            # Cancelled (the client went away) or `on_tick` failed: never left queued.
            if not self._discard(ticket, gone=isinstance(error, asyncio.CancelledError)):
                ticket.dispatched()
            raise
        if not ticket.admitted.done():
            ticket.expected = self.estimate_wait(ticket.key, percentile=CAUTIOUS)
            self._discard(ticket)
            return WaitResult.TIMED_OUT
        return WaitResult.ADMITTED if ticket.admitted.result() else WaitResult.CLOSING

    def position(self, ticket: Ticket) -> int:
        """The ticket's 1-based place in its queue now (0: no longer queued)."""
        queue = self._queues.get(ticket.key) or deque()
        for place, queued in enumerate(queue, start=1):
            if queued is ticket:
                return place
        return 0

    def estimate_wait(self, key: str, *, percentile: float = TYPICAL) -> float:
        """Seconds a request joining `key`'s queue now is expected to wait, from the
        `percentile` of the swap times (`TYPICAL`: what it is told; `CAUTIOUS`: for
        `Retry-After`).

        0 for a Ready model (it waits only for the drain). Else the rest of the
        model's swap in progress (`SwapTimes.remaining`); for a member of a GPUGroup
        whose members take turns, behind every other member of its group whose
        requests began waiting earlier and is not Ready: the rest of their swaps, then
        its own whole swap. A member of a packed GPUGroup (`side_by_side`) starts
        beside the others: the rest of its own swap only.
        """
        entry = self._directory.lookup(key)
        if entry is None or entry.ready:
            return 0.0
        now = self._clock.now()
        started = self._swap_started.get(key, now)
        ahead = 0.0
        if entry.gpu_group and not entry.side_by_side:
            for other_key, other_started in self._swap_started.items():
                other = self._directory.lookup(other_key)
                if (
                    other_key != key
                    and other is not None
                    and not other.ready
                    and other.namespace == entry.namespace
                    and other.gpu_group == entry.gpu_group
                    and other_started < started
                ):
                    ahead += self.swap_times.remaining(
                        other_key,
                        started=other_started,
                        now=now,
                        node=other.node,
                        percentile=percentile,
                    )
        if ahead:
            return ahead + self.swap_times.estimate(key, node=entry.node, percentile=percentile)
        return self.swap_times.remaining(
            key, started=started, now=now, node=entry.node, percentile=percentile
        )

    def waiting(self) -> tuple[WaitingRequest, ...]:
        """Every held request, by model and position (a read-only view)."""
        loop = asyncio.get_running_loop()
        return tuple(
            WaitingRequest(
                model=key,
                position=place,
                waited_seconds=loop.time() - ticket.enqueued_at,
                estimate_seconds=ticket.estimate,
            )
            for key, queue in sorted(self._queues.items())
            for place, ticket in enumerate(queue, start=1)
        )

    def waited(self, ticket: Ticket) -> float:
        return asyncio.get_running_loop().time() - ticket.enqueued_at

    def model_changed(self, key: str) -> None:
        """Directory listener: start a drain when a model with waiters is Ready."""
        entry = self._directory.lookup(key)
        if entry is not None and not entry.ready and self._queues.get(key):
            # Waiters and no longer (or not yet) Ready: a swap is under way again.
            self._swap_started.setdefault(key, self._clock.now())
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
            self._swap_started.pop(key, None)
            self._burst_admitted.discard(key)
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
                self._swap_done(entry)
                self._burst_admitted.add(key)
                if not queue:
                    self._burst_admitted.discard(key)
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

    def _swap_done(self, entry: ModelEntry) -> None:
        """The first waiting request is let go: the swap it waited for is over, on the
        node the model is Ready on."""
        started = self._swap_started.pop(entry.key, None)
        if started is not None:
            now = self._clock.now()
            seconds = (now - started).total_seconds()
            self.swap_times.observe(entry.key, seconds, ended_at=now, node=entry.node)

    def _discard(self, ticket: Ticket, *, gone: bool = False) -> bool:
        """Take a ticket out of its queue; `gone`: its client went away."""
        key = ticket.key
        queue = self._queues.get(key)
        if queue is None or ticket not in queue:
            return False
        queue.remove(ticket)
        self._total -= 1
        entry = self._directory.lookup(key)
        withdrawn = False
        if not queue:
            # Nobody waits any more: the swap is not timed (nobody saw it end), and
            # if every client left before a single one was let go, nobody wants it.
            self._swap_started.pop(key, None)
            withdrawn = gone and key not in self._burst_admitted
            self._burst_admitted.discard(key)
        if entry is not None:
            self._changed(entry)
            if withdrawn and not entry.ready:
                log.info("every client waiting for %s left; withdrawing its demand", key)
                self._signaller.demand_withdrawn(entry)
        else:
            self._metrics.queued.labels(model=key).set(len(queue))
        return True

    def _changed(self, entry: ModelEntry) -> None:
        queue = self._queues.get(entry.key) or deque()
        self._metrics.queued.labels(model=entry.key).set(len(queue))
        oldest = queue[0].arrived if queue else None
        self._signaller.queue_changed(entry, QueueReport(queued=len(queue), oldest_waiting=oldest))
