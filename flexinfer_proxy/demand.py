"""Demand signalling: what the proxy tells the cluster, and how often.

`DemandSignaller` turns queue changes and served requests into writes through a
`DemandSink` (docs/election.md 1.4 and 4, docs/resources.md):

- a Model or a standalone ModelDeployment gets a timestamp (`lastActiveTime` /
  `lastAccessTime`) when a burst of requests starts queueing, again once a minute
  while they stay queued, and at most once a minute for served requests;
- a GPUGroup member gets its queue depth and oldest arrival written as the
  `demand.ai.flexinfer/<member>` annotation whenever they change (coalesced: one
  write in flight per member, the latest state wins), at least once a minute while
  requests wait, and the key removed when the queue drains; its served requests
  refresh `lastAccessTime` at most once a minute. The same annotation carries its
  requests in flight (`inFlight`, set through `in_flight_changed` by
  `flexinfer_proxy.in_flight`, which owns their timing); the key stays while either
  is above 0;
- when every client waiting for a model left before it was Ready
  (`demand_withdrawn`), the demand their burst wrote is taken back: a member's
  annotation is already gone with its queue; a Model's or standalone
  ModelDeployment's timestamp is put back to the value the burst's first write
  replaced, if it still holds the last value this proxy wrote (docs/election.md 1.4).

Writes never hold up a client request: they run as tasks, and `flush()` waits for
them (shutdown, tests). The annotation's wire format is the core's
(`flexinfer_core.annotations`), shared with the controller that reads it; the sink
performs the writes; this module owns their timing. It reads time only from the
injected `Clock`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from datetime import datetime, timedelta
from typing import Any, Protocol

import attrs

from flexinfer_kube.clock import Clock
from flexinfer_proxy.directory import ModelEntry
from flexinfer_proxy.metrics import ProxyMetrics

log = logging.getLogger("flexinfer.proxy.demand")

REFRESH_INTERVAL = timedelta(seconds=60)

# Results of one timestamp write, as `flexinfer_proxy_demand_writes_total{result}`.
WRITTEN = "written"
ALREADY_CURRENT = "already_current"  # the object already says `now` or later
SET_BY_OTHER = "set_by_other"  # three conflicts, but someone set it within 30 s
CONFLICTED = "conflicted"  # three conflicts and nothing recent: not done
NOT_FOUND = "not_found"
FAILED = "failed"
CHANGED_SINCE = "changed_since"  # a withdrawal found someone else's later write: kept

DONE_RESULTS = frozenset({WRITTEN, ALREADY_CURRENT, SET_BY_OTHER})


@attrs.frozen
class MarkOutcome:
    result: str
    conflicts: int = 0
    # What the write replaced (None: the field was absent), when it wrote.
    replaced: datetime | None = None

    @property
    def done(self) -> bool:
        return self.result in DONE_RESULTS


@attrs.frozen
class QueueReport:
    """A GPUGroup member's queue as the controller reads it."""

    queued: int
    oldest_waiting: datetime | None
    # Requests its server is answering (docs/election.md 1.6).
    in_flight: int = 0

    @property
    def empty(self) -> bool:
        return self.queued == 0 and self.in_flight == 0


class DemandSink(Protocol):
    """Where demand goes: the cluster in production, a recorder in tests."""

    async def mark_active(self, entry: ModelEntry, *, now: datetime) -> MarkOutcome:
        """Set the entry's activity timestamp to `now` (never moving it backwards)."""
        ...

    async def report_queue(
        self, entry: ModelEntry, report: QueueReport | None, *, now: datetime
    ) -> None:
        """Write (or, for None, remove) the member's demand annotation on its GPUGroup."""
        ...

    async def withdraw(
        self, entry: ModelEntry, *, written: datetime, restore: datetime | None
    ) -> str:
        """Set the entry's activity timestamp back to `restore` (None: remove it) if it
        still says `written`; a result of `flexinfer_proxy_demand_writes_total`."""
        ...


@attrs.define
class _ModelSignals:
    """Per-model bookkeeping of what was last sent and what is pending."""

    last_marked: datetime | None = None
    refresher: asyncio.Task[None] | None = None
    report: QueueReport | None = None
    reporter: asyncio.Task[None] | None = None
    report_dirty: bool = False
    # The current burst of queued demand: its first write (in flight or done), and
    # what that write replaced, so a withdrawal can put it back.
    burst_mark: asyncio.Task[MarkOutcome] | None = None
    in_flight: int = 0


class DemandSignaller:
    def __init__(
        self,
        sink: DemandSink,
        *,
        clock: Clock,
        metrics: ProxyMetrics,
        refresh_interval: timedelta = REFRESH_INTERVAL,
    ) -> None:
        self._sink = sink
        self._clock = clock
        self._metrics = metrics
        self._refresh_interval = refresh_interval
        self._models: dict[str, _ModelSignals] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def queue_changed(self, entry: ModelEntry, report: QueueReport) -> None:
        """Called by the queues after every enqueue, dispatch, timeout and abandonment."""
        signals = self._signals(entry.key)
        was_queued = signals.refresher is not None
        if report.queued > 0 and not was_queued:
            log.info(
                "requests for %s/%s are queueing; signalling demand", entry.namespace, entry.name
            )
            signals.refresher = asyncio.create_task(self._refresh_while_queued(entry))
            if not entry.reports_queue:
                signals.burst_mark = self._mark(entry, signal="queued")
        elif report.queued == 0 and signals.refresher is not None:
            signals.refresher.cancel()
            signals.refresher = None
        if entry.reports_queue:
            self._report(entry, attrs.evolve(report, in_flight=signals.in_flight))

    def in_flight_changed(self, entry: ModelEntry, count: int) -> None:
        """A GPUGroup member's requests in flight, to write with its queue (rate-limited
        and refreshed by the caller, `flexinfer_proxy.in_flight`)."""
        signals = self._signals(entry.key)
        signals.in_flight = count
        queued = signals.report or QueueReport(queued=0, oldest_waiting=None)
        self._report(entry, attrs.evolve(queued, in_flight=count), force=True)

    def demand_withdrawn(self, entry: ModelEntry) -> None:
        """Every client waiting for `entry` left before it was Ready: take the burst's
        demand back (a member's annotation went with its queue already)."""
        signals = self._signals(entry.key)
        burst, signals.burst_mark = signals.burst_mark, None
        if entry.reports_queue or burst is None:
            return
        self._spawn(self._withdraw(entry, burst))

    async def _withdraw(self, entry: ModelEntry, burst: asyncio.Task[MarkOutcome]) -> None:
        outcome = await asyncio.shield(burst)
        signals = self._signals(entry.key)
        written = signals.last_marked
        if outcome.result != WRITTEN or written is None or signals.burst_mark is not None:
            return  # it wrote nothing to take back, or a new burst began meanwhile
        try:
            result = await self._sink.withdraw(entry, written=written, restore=outcome.replaced)
        except Exception:
            log.exception("withdrawing the demand for %s/%s failed", entry.namespace, entry.name)
            result = FAILED
        if result == WRITTEN:
            signals.last_marked = None  # the next request writes again
        self._metrics.demand_writes.labels(model=entry.key, signal="withdrawn", result=result).inc()

    def served(self, entry: ModelEntry) -> None:
        """A request is being served by a Ready model: refresh at most once per interval."""
        last = self._signals(entry.key).last_marked
        if last is not None and self._clock.now() - last < self._refresh_interval:
            return
        self._mark(entry, signal="served")

    async def flush(self) -> None:
        """Wait until every write started so far has finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for signals in self._models.values():
            if signals.refresher is not None:
                signals.refresher.cancel()
                signals.refresher = None
        await self.flush()

    def _signals(self, key: str) -> _ModelSignals:
        signals = self._models.get(key)
        if signals is None:  # (setdefault would build a throwaway one per request)
            signals = self._models[key] = _ModelSignals()
        return signals

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _mark(self, entry: ModelEntry, *, signal: str) -> asyncio.Task[MarkOutcome]:
        signals = self._signals(entry.key)
        previous = signals.last_marked
        now = self._clock.now()
        signals.last_marked = now  # claimed now, so a concurrent request does not write too
        return self._spawn(self._write_mark(entry, now=now, previous=previous, signal=signal))

    async def _write_mark(
        self, entry: ModelEntry, *, now: datetime, previous: datetime | None, signal: str
    ) -> MarkOutcome:
        try:
            outcome = await self._sink.mark_active(entry, now=now)
        except Exception:
            log.exception("demand write for %s/%s failed", entry.namespace, entry.name)
            outcome = MarkOutcome(FAILED)
        if outcome.conflicts:
            self._metrics.demand_conflicts.labels(model=entry.key).inc(outcome.conflicts)
        self._metrics.demand_writes.labels(
            model=entry.key, signal=signal, result=outcome.result
        ).inc()
        if not outcome.done:
            log.warning(
                "demand for %s/%s not recorded (%s)", entry.namespace, entry.name, outcome.result
            )
            signals = self._signals(entry.key)
            if signals.last_marked == now:
                signals.last_marked = previous  # let the next request try again
        return outcome

    async def _refresh_while_queued(self, entry: ModelEntry) -> None:
        """Keep the demand fresh while requests wait longer than the refresh interval."""
        while True:
            await asyncio.sleep(self._refresh_interval.total_seconds())
            signals = self._signals(entry.key)
            if entry.reports_queue and signals.report is not None:
                self._report(entry, signals.report, force=True)
            elif not entry.reports_queue:
                self._mark(entry, signal="queued")

    def _report(self, entry: ModelEntry, report: QueueReport, *, force: bool = False) -> None:
        signals = self._signals(entry.key)
        if report == signals.report and not force:
            return
        signals.report = report
        signals.report_dirty = True
        if signals.reporter is None:
            signals.reporter = self._spawn(self._write_reports(entry))

    async def _write_reports(self, entry: ModelEntry) -> None:
        """Write the latest report until nothing new arrived during the last write."""
        signals = self._signals(entry.key)
        try:
            while signals.report_dirty:
                signals.report_dirty = False
                report = signals.report
                await self._write_report(entry, report)
        finally:
            signals.reporter = None

    async def _write_report(self, entry: ModelEntry, report: QueueReport | None) -> None:
        wire = report if report is not None and not report.empty else None
        try:
            await self._sink.report_queue(entry, wire, now=self._clock.now())
            result = WRITTEN
        except Exception:
            log.exception("queue report for %s/%s failed", entry.namespace, entry.name)
            result = FAILED
        signal = "queue_report" if wire is not None else "queue_cleared"
        self._metrics.demand_writes.labels(model=entry.key, signal=signal, result=result).inc()
