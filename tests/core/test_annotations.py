"""The annotations' wire formats, and the GPUGroup demand report's staleness."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from flexinfer_core import (
    DEMAND_STALE_AFTER,
    DemandReport,
    GpuGroupAction,
    GpuGroupMember,
    GpuGroupState,
    decide_gpu_group,
    demand_annotation_key,
    format_demand,
    parse_demand,
    reasons,
)

from .builders import T0, ago


def test_the_demand_annotation_as_docs_resources_md_shows_it() -> None:
    report = DemandReport(3, oldest_waiting=ago(5), reported_at=T0)
    assert demand_annotation_key("chat") == "demand.ai.flexinfer/chat"
    assert format_demand(report) == (
        '{"queued": 3, "oldestWaiting": "2026-03-01T11:59:55Z", '
        '"reportedAt": "2026-03-01T12:00:00Z"}'
    )


@pytest.mark.parametrize(
    "report",
    [
        DemandReport(3, oldest_waiting=ago(5), reported_at=T0),
        DemandReport(1, oldest_waiting=T0 + timedelta(microseconds=7), reported_at=T0),
        DemandReport(0, reported_at=T0),
        DemandReport(2),
    ],
)
def test_what_the_proxy_writes_the_controller_reads_back(report: DemandReport) -> None:
    assert parse_demand(format_demand(report)) == report


def test_an_empty_queue_carries_no_oldest_request() -> None:
    written = format_demand(DemandReport(0, oldest_waiting=ago(5), reported_at=T0))
    assert "oldestWaiting" not in json.loads(written)
    assert parse_demand('{"queued": 0, "oldestWaiting": "2026-03-01T11:59:55Z"}') == DemandReport(0)


@pytest.mark.parametrize(
    "value",
    [None, "", "{not json", "[1]", '{"queued": -1}', '{"queued": true}', '{"queued": "3"}', "{}"],
)
def test_an_unreadable_report_is_no_report(value: object) -> None:
    assert parse_demand(value) is None


def _queued_group(report_age: timedelta) -> GpuGroupState:
    member = GpuGroupMember("chat", queued=2, oldest_waiting=ago(400), reported_at=T0 - report_age)
    return GpuGroupState("gg", members=(member, GpuGroupMember("other")))


def test_a_stale_report_is_no_demand() -> None:
    fresh = decide_gpu_group(_queued_group(DEMAND_STALE_AFTER), now=T0)
    assert (fresh.action, fresh.active_model, fresh.reason) == (
        GpuGroupAction.SWAP,
        "chat",
        reasons.START,
    )
    stale = decide_gpu_group(_queued_group(DEMAND_STALE_AFTER + timedelta(seconds=1)), now=T0)
    assert (stale.action, stale.active_model, stale.reason) == (
        GpuGroupAction.IDLE,
        None,
        reasons.NO_DEMAND,
    )
    assert [s.queued_requests for s in stale.member_statuses] == [0, 0]


def test_next_change_at_is_when_a_live_report_goes_stale() -> None:
    reported = T0 - timedelta(minutes=1)
    member = GpuGroupMember("chat", queued=2, oldest_waiting=ago(400), reported_at=reported)
    # chat has served its own queue for a while: nothing else is due.
    state = GpuGroupState(
        "gg",
        members=(member, GpuGroupMember("other")),
        current_model="chat",
        last_swap_time=ago(minutes=30),
    )
    keep = decide_gpu_group(state, now=T0)
    assert (keep.action, keep.reason) == (GpuGroupAction.KEEP, reasons.KEEP_CURRENT)
    expiry = reported + DEMAND_STALE_AFTER + timedelta(microseconds=1)
    assert keep.next_change_at == expiry
    # One tick before, the report still counts; at that instant it no longer does, and
    # chat, idle for longer than its idle timeout, gives the GPU up.
    before = decide_gpu_group(state, now=expiry - timedelta(microseconds=1))
    assert (before.active_model, [s.queued_requests for s in before.member_statuses]) == (
        "chat",
        [2, 0],
    )
    after = decide_gpu_group(state, now=expiry)
    assert (after.active_model, after.reason) == (None, reasons.IDLE_TIMEOUT)
    assert [s.queued_requests for s in after.member_statuses] == [0, 0]
