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
  refresh `lastAccessTime` at most once a minute.

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

DONE_RESULTS = frozenset({WRITTEN, ALREADY_CURRENT, SET_BY_OTHER})


@attrs.frozen
class MarkOutcome:
    result: str
    conflicts: int = 0

    @property
    def done(self) -> bool:
        return self.result in DONE_RESULTS


@attrs.frozen
class QueueReport:
    """A GPUGroup member's queue as the controller reads it."""

    queued: int
    oldest_waiting: datetime | None


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


@attrs.define
class _ModelSignals:
    """Per-model bookkeeping of what was last sent and what is pending."""

    last_marked: datetime | None = None
    refresher: asyncio.Task[None] | None = None
    report: QueueReport | None = None
    reporter: asyncio.Task[None] | None = None
    report_dirty: bool = False


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
                self._mark(entry, signal="queued")
        elif report.queued == 0 and signals.refresher is not None:
            signals.refresher.cancel()
            signals.refresher = None
        if entry.reports_queue:
            self._report(entry, report)

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

    def _mark(self, entry: ModelEntry, *, signal: str) -> None:
        signals = self._signals(entry.key)
        previous = signals.last_marked
        now = self._clock.now()
        signals.last_marked = now  # claimed now, so a concurrent request does not write too
        self._spawn(self._write_mark(entry, now=now, previous=previous, signal=signal))

    async def _write_mark(
        self, entry: ModelEntry, *, now: datetime, previous: datetime | None, signal: str
    ) -> None:
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
        wire = report if report is not None and report.queued > 0 else None
        try:
            await self._sink.report_queue(entry, wire, now=self._clock.now())
            result = WRITTEN
        except Exception:
            log.exception("queue report for %s/%s failed", entry.namespace, entry.name)
            result = FAILED
        signal = "queue_report" if wire is not None else "queue_cleared"
        self._metrics.demand_writes.labels(model=entry.key, signal=signal, result=result).inc()
