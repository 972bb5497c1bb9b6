"""The cluster-backed `DemandSink`: the proxy's only writes to the API server.

- `mark_active`: `status.lastActiveTime` of a Model or `status.lastAccessTime` of
  a ModelDeployment, through the status subresource, as a JSON merge patch that
  carries the resourceVersion it read — so a concurrent writer makes it fail with
  409 Conflict, and it re-reads and tries again (at most 3 attempts). After three
  conflicts the demand still counts as recorded when someone else set the field
  within the last 30 s (docs/election.md 1.4). The field never moves backwards
  (but for `withdraw`).
- `report_in_flight`: `status.inFlight` of a Model (docs/election.md 1.6), a merge
  patch of the status subresource touching only that field, without a
  resourceVersion: the proxy is its only writer, and the latest count wins.
- `report_queue`: the `demand.ai.flexinfer/<member>` annotation on the member's
  GPUGroup (its format is `flexinfer_core.annotations`'), a merge patch touching
  only that key (null removes it).
- `withdraw`: the activity timestamp put back to what the burst's first write
  replaced (removed when it was absent), with the resourceVersion it read, and only
  while the field still holds the last value this proxy wrote: anyone's later write
  (a served request of another proxy, the controller's correction) wins.

Blocking `KubeApi` calls run in worker threads (`asyncio.to_thread`). This module
touches nothing else: no spec, no other status field, no other annotation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from flexinfer_core.annotations import (
    IN_FLIGHT_FIELD,
    DemandReport,
    InFlightReport,
    demand_annotation_key,
    format_demand,
    format_in_flight,
)
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_kube.kubeapi import Conflict, KubeApi, KubeError, NotFound
from flexinfer_kube.objects import JSON
from flexinfer_kube.resources import GPU_GROUPS, MODEL_DEPLOYMENTS, MODELS, Resource
from flexinfer_proxy.demand import (
    ALREADY_CURRENT,
    CHANGED_SINCE,
    CONFLICTED,
    FAILED,
    NOT_FOUND,
    SET_BY_OTHER,
    WRITTEN,
    MarkOutcome,
    QueueReport,
)
from flexinfer_proxy.directory import ModelEntry, ModelKind

log = logging.getLogger("flexinfer.proxy.demand")

MAX_ATTEMPTS = 3
OTHER_WRITER_WINDOW = timedelta(seconds=30)


def activity_field(kind: ModelKind) -> str:
    return "lastActiveTime" if kind is ModelKind.MODEL else "lastAccessTime"


class KubeDemandSink:
    """Writes demand through the given `KubeApi`.

    `before_write(obj)` runs between the read and the write of each attempt; it
    exists so tests can provoke the conflict the retry loop is there for.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        before_write: Callable[[JSON], None] | None = None,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self._api = api
        self._before_write = before_write
        self._max_attempts = max_attempts

    async def mark_active(self, entry: ModelEntry, *, now: datetime) -> MarkOutcome:
        return await asyncio.to_thread(self.mark_active_blocking, entry, now=now)

    async def report_queue(
        self, entry: ModelEntry, report: QueueReport | None, *, now: datetime
    ) -> None:
        await asyncio.to_thread(self.report_queue_blocking, entry, report, now=now)

    async def report_in_flight(self, entry: ModelEntry, count: int, *, now: datetime) -> None:
        await asyncio.to_thread(self.report_in_flight_blocking, entry, count, now=now)

    def report_in_flight_blocking(self, entry: ModelEntry, count: int, *, now: datetime) -> None:
        if entry.kind is not ModelKind.MODEL:
            return
        value = format_in_flight(
            InFlightReport(count=count, reported_at=now.replace(microsecond=0))
        )
        try:
            self._api.patch(
                MODELS, entry.namespace, entry.name, {"status": {IN_FLIGHT_FIELD: value}},
                subresource="status",
            )  # fmt: skip
        except NotFound:
            log.info(
                "Model %s/%s is gone; in-flight count not reported", entry.namespace, entry.name
            )

    def mark_active_blocking(self, entry: ModelEntry, *, now: datetime) -> MarkOutcome:
        field = activity_field(entry.kind)
        now = now.replace(microsecond=0)
        conflicts = 0
        try:
            for _ in range(self._max_attempts):
                obj = self._read_status(entry)
                current = parse_rfc3339((obj.get("status") or {}).get(field))
                if current is not None and current >= now:
                    return MarkOutcome(ALREADY_CURRENT, conflicts)
                if self._before_write is not None:
                    self._before_write(obj)
                if self._patch_status(entry, obj, field=field, value=format_rfc3339(now)):
                    return MarkOutcome(WRITTEN, conflicts, replaced=current)
                conflicts += 1
            current = parse_rfc3339((self._read_status(entry).get("status") or {}).get(field))
        except NotFound:
            return MarkOutcome(NOT_FOUND, conflicts)
        except KubeError as error:
            log.warning("writing %s of %s/%s: %s", field, entry.namespace, entry.name, error)
            return MarkOutcome(FAILED, conflicts)
        if current is not None and now - current <= OTHER_WRITER_WINDOW:
            return MarkOutcome(SET_BY_OTHER, conflicts)
        return MarkOutcome(CONFLICTED, conflicts)

    async def withdraw(
        self, entry: ModelEntry, *, written: datetime, restore: datetime | None
    ) -> str:
        return await asyncio.to_thread(
            self.withdraw_blocking, entry, written=written, restore=restore
        )

    def withdraw_blocking(
        self, entry: ModelEntry, *, written: datetime, restore: datetime | None
    ) -> str:
        field = activity_field(entry.kind)
        written = written.replace(microsecond=0)
        value = format_rfc3339(restore) if restore is not None else None
        try:
            for _ in range(self._max_attempts):
                obj = self._read_status(entry)
                current = parse_rfc3339((obj.get("status") or {}).get(field))
                if current != written:
                    return CHANGED_SINCE
                if self._patch_status(entry, obj, field=field, value=value):
                    return WRITTEN
        except NotFound:
            return NOT_FOUND
        except KubeError as error:
            log.warning("withdrawing %s of %s/%s: %s", field, entry.namespace, entry.name, error)
            return FAILED
        return CONFLICTED

    def report_queue_blocking(
        self, entry: ModelEntry, report: QueueReport | None, *, now: datetime
    ) -> None:
        if not entry.gpu_group:
            return
        value = (
            format_demand(
                DemandReport(
                    report.queued,
                    oldest_waiting=report.oldest_waiting,
                    reported_at=now,
                    in_flight=report.in_flight,
                )
            )
            if report is not None
            else None
        )
        body = {"metadata": {"annotations": {demand_annotation_key(entry.name): value}}}
        try:
            self._api.patch(GPU_GROUPS, entry.namespace, entry.gpu_group, body)
        except NotFound:
            log.warning(
                "GPUGroup %s/%s of %s does not exist; queue not reported",
                entry.namespace,
                entry.gpu_group,
                entry.name,
            )

    def _resource(self, entry: ModelEntry) -> Resource:
        return MODELS if entry.kind is ModelKind.MODEL else MODEL_DEPLOYMENTS

    def _read_status(self, entry: ModelEntry) -> JSON:
        return self._api.get(
            self._resource(entry), entry.namespace, entry.name, subresource="status"
        )

    def _patch_status(self, entry: ModelEntry, obj: JSON, *, field: str, value: str | None) -> bool:
        """One optimistic write (None removes the field); False on 409 Conflict (someone
        wrote since the read)."""
        body = {
            "metadata": {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")},
            "status": {field: value},
        }
        try:
            self._api.patch(
                self._resource(entry), entry.namespace, entry.name, body, subresource="status"
            )
        except Conflict:
            return False
        return True
