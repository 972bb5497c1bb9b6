"""In-flight reports: how many requests each Model's server is answering right now.

The controller reads them when a Model loses the card (docs/election.md 1.6): with
requests in flight it drains first (keeps its pods until they are answered, or its
drain timeout ends) instead of being scaled to 0 at once. `InFlightReporter` counts a
request from the moment the proxy starts sending it to the backend until its answer
(a stream included) has ended, and writes the count through an `InFlightSink`:

A GPUGroup member's count goes into its demand annotation instead (the
`DemandSignaller` writes it with its queue); the sink is told which (`Proxy` wires a
`SplitSink`).

- one writer per Model: at most one write in flight, the latest count wins (coalesced);
- rate-limited: a change between two counts above 0 is written at most once per
  `min_interval` (the proxy's `--in-flight-interval`); a change to or from 0 is
  written as soon as the write in flight (if any) is done, so a drain starts and
  ends promptly;
- a count above 0 is written again every `refresh_interval` (30 s) even unchanged,
  since the controller reads a report older than 5 minutes as 0 (a dead proxy cannot
  hold a drain) and the demand window reads such reports as current only while fresh.

Writes never hold up a client request: they run as tasks; `close()` waits for them.
The wire format (`status.inFlight`) is the core's (`flexinfer_core.annotations`); the
sink performs the write; this module owns the counting and the timing. Timestamps
come from the injected `Clock`; the pauses between writes use the event loop's
monotonic time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

import attrs

from flexinfer_kube.clock import Clock
from flexinfer_proxy.demand import DemandSignaller
from flexinfer_proxy.directory import ModelEntry, ModelKind

log = logging.getLogger("flexinfer.proxy.in_flight")

MIN_INTERVAL = timedelta(seconds=1)
MIN_INTERVAL_BOUNDS = (timedelta(milliseconds=100), timedelta(seconds=30))
"""`--in-flight-interval` must lie within these (inclusive)."""
REFRESH_INTERVAL = timedelta(seconds=30)


@runtime_checkable
class InFlightSink(Protocol):
    async def report_in_flight(self, entry: ModelEntry, count: int, *, now: datetime) -> None:
        """Write `count` as the entry's in-flight report, dated `now`."""
        ...


@attrs.define
class _Member:
    count: int = 0
    written: int = 0  # the count last written (0 before any write: nothing to say)
    written_at: float | None = None  # loop time of the last write
    writer: asyncio.Task[None] | None = None
    changed: asyncio.Event = attrs.field(factory=asyncio.Event)


class InFlightReporter:
    def __init__(
        self,
        sink: InFlightSink | None,
        *,
        clock: Clock,
        min_interval: timedelta = MIN_INTERVAL,
        refresh_interval: timedelta = REFRESH_INTERVAL,
    ) -> None:
        self._sink = sink
        self._clock = clock
        self._min_interval = min_interval.total_seconds()
        self._refresh = refresh_interval.total_seconds()
        self._members: dict[str, _Member] = {}

    def count(self, entry: ModelEntry) -> int:
        member = self._members.get(entry.key)
        return 0 if member is None else member.count

    @contextlib.contextmanager
    def request(self, entry: ModelEntry) -> Iterator[None]:
        """Count one request in flight to `entry`'s server while the block runs."""
        if self._sink is None or not (entry.kind is ModelKind.MODEL or entry.reports_queue):
            yield  # a standalone ModelDeployment shares no card: nothing to drain
            return
        member = self._members.get(entry.key)
        if member is None:
            member = self._members[entry.key] = _Member()
        member.count += 1
        self._changed(entry, member)
        try:
            yield
        finally:
            member.count -= 1
            self._changed(entry, member)

    def _changed(self, entry: ModelEntry, member: _Member) -> None:
        member.changed.set()
        if member.writer is None:
            member.writer = asyncio.create_task(self._write_loop(entry, member))

    async def _write_loop(self, entry: ModelEntry, member: _Member) -> None:
        """Write the latest count until 0 is written; while above 0, refresh it."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                member.changed.clear()
                count = member.count
                since = None if member.written_at is None else loop.time() - member.written_at
                if count == member.written and (count == 0 or (since or 0) < self._refresh):
                    if count == 0:
                        return
                    await _wait(member.changed, self._refresh - (since or 0))
                    continue
                # A change to or from 0 goes out at once: it starts or ends a drain.
                if (
                    count > 0
                    and member.written > 0
                    and since is not None
                    and since < self._min_interval
                ):
                    # Rate-limited: wait out the interval, then write whatever is latest.
                    await asyncio.sleep(self._min_interval - since)
                    continue
                if not await self._write(entry, count):
                    await asyncio.sleep(self._min_interval)  # then try the latest again
                    continue
                member.written, member.written_at = count, loop.time()
        finally:
            member.writer = None
            if member.count != member.written:  # changed while the last write finished
                self._changed(entry, member)
            elif member.count == 0:
                self._members.pop(entry.key, None)

    async def _write(self, entry: ModelEntry, count: int) -> bool:
        assert self._sink is not None
        try:
            await self._sink.report_in_flight(entry, count, now=self._clock.now())
        except Exception:
            log.exception("in-flight report for %s failed", entry.key)
            return False
        return True

    async def close(self) -> None:
        """Wait for the writes in progress (requests are over: the last says 0)."""
        while writers := [m.writer for m in self._members.values() if m.writer is not None]:
            await asyncio.gather(*writers, return_exceptions=True)


class SplitSink:
    """Models' counts to `models` (`status.inFlight`), GPUGroup members' to their demand
    annotation through `signaller`."""

    def __init__(self, models: InFlightSink | None, signaller: DemandSignaller) -> None:
        self._models = models
        self._signaller = signaller

    async def report_in_flight(self, entry: ModelEntry, count: int, *, now: datetime) -> None:
        if entry.reports_queue:
            self._signaller.in_flight_changed(entry, count)
        elif self._models is not None:
            await self._models.report_in_flight(entry, count, now=now)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, seconds))
