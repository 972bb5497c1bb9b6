"""The annotations flexinfer puts on Kubernetes objects, and their wire formats.

- `ai.flexinfer/active-services` on a ModelDeployment's Service: the service labels
  the proxy sends to it first, comma-separated. The controller no longer writes it on
  a Model's Service, and the proxy ignores it there: a Model's holder is read from the
  statuses (docs/election.md 1.3).
- `demand.ai.flexinfer/<member>` on a GPUGroup, written by the proxy and read by the
  controller: one member's queue as JSON, e.g.
  `{"queued": 3, "oldestWaiting": "2026-11-29T17:00:04Z", "reportedAt": "2026-11-29T17:00:09Z"}`
  (docs/resources.md). A report older than `DEMAND_STALE_AFTER` is no demand (a proxy
  that died with a queue); `decide_gpu_group` applies that rule and wakes up when a
  report goes stale. While the member answers requests it also carries `"inFlight": N`
  (the key is there while `queued` or `inFlight` is above 0; docs/election.md 1.6).
- `status.inFlight` on a Model of a shared group, written by the proxy through the
  status subresource: `{"count": 2, "reportedAt": "2026-11-29T17:00:09Z"}`, the requests
  sent to its server and not yet answered. Stale after `DEMAND_STALE_AFTER` like a
  demand report (a dead proxy cannot hold a drain).

Both sides format and parse here, so the proxy and the controller cannot drift apart.
Text in, values out: no clock (the staleness rule is told `now`), no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from flexinfer_core.snapshot import aware_or_none, int_between
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339

ACTIVE_SERVICES_ANNOTATION = "ai.flexinfer/active-services"
DEMAND_ANNOTATION_PREFIX = "demand.ai.flexinfer/"
DEMAND_STALE_AFTER = timedelta(minutes=5)


@attrs.frozen
class DemandReport:
    """One GPUGroup member's queue as the proxy reports it."""

    queued: int = attrs.field(validator=int_between(0, None))
    oldest_waiting: datetime | None = attrs.field(default=None, validator=aware_or_none)
    reported_at: datetime | None = attrs.field(default=None, validator=aware_or_none)
    # Requests sent to the member's server and not yet answered (docs/election.md 1.6).
    in_flight: int = attrs.field(default=0, validator=int_between(0, None), kw_only=True)

    @property
    def empty(self) -> bool:
        """Nothing to report: the proxy removes the key."""
        return self.queued == 0 and self.in_flight == 0


def demand_annotation_key(member: str) -> str:
    """The annotation that carries `member`'s queue on its GPUGroup."""
    return DEMAND_ANNOTATION_PREFIX + member


def format_demand(report: DemandReport) -> str:
    """The annotation's value; `oldestWaiting` only while requests wait."""
    value: dict[str, Any] = {"queued": report.queued}
    if report.queued > 0 and report.oldest_waiting is not None:
        value["oldestWaiting"] = format_rfc3339(report.oldest_waiting)
    if report.in_flight > 0:
        value["inFlight"] = report.in_flight
    if report.reported_at is not None:
        value["reportedAt"] = format_rfc3339(report.reported_at)
    return json.dumps(value, separators=(", ", ": "))


def parse_demand(value: Any) -> DemandReport | None:
    """A demand annotation's value; None when absent or unreadable (no demand).

    `queued` must be an integer of at least 0; unreadable instants read as absent.
    """
    try:
        body = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(body, Mapping):
        return None
    queued = body.get("queued")
    if isinstance(queued, bool) or not isinstance(queued, int) or queued < 0:
        return None
    return DemandReport(
        queued=queued,
        oldest_waiting=parse_rfc3339(body.get("oldestWaiting")) if queued > 0 else None,
        reported_at=parse_rfc3339(body.get("reportedAt")),
        in_flight=_count(body.get("inFlight")),
    )


def _count(value: Any) -> int:
    """A non-negative integer count; anything else reads as 0 (nothing in flight)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


@attrs.frozen
class InFlightReport:
    """`status.inFlight` of a Model: requests sent to its server and not yet answered."""

    count: int = attrs.field(validator=int_between(0, None))
    reported_at: datetime | None = attrs.field(default=None, validator=aware_or_none)


IN_FLIGHT_FIELD = "inFlight"
"""The key of the report under a Model's `status`."""


def format_in_flight(report: InFlightReport) -> dict[str, Any]:
    """The `status.inFlight` value the proxy writes."""
    value: dict[str, Any] = {"count": report.count}
    if report.reported_at is not None:
        value["reportedAt"] = format_rfc3339(report.reported_at)
    return value


def parse_in_flight(value: Any) -> InFlightReport | None:
    """A Model's `status.inFlight`; None when absent or unreadable (nothing in flight).

    `count` must be an integer of at least 0; an unreadable `reportedAt` reads as absent.
    """
    if not isinstance(value, Mapping):
        return None
    count = value.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return None
    return InFlightReport(count=count, reported_at=parse_rfc3339(value.get("reportedAt")))


def demand_is_stale(reported_at: datetime | None, *, now: datetime) -> bool:
    """A report older than `DEMAND_STALE_AFTER` counts as no demand; an undated one never
    goes stale (it is removed by the proxy that wrote it)."""
    return reported_at is not None and now - reported_at > DEMAND_STALE_AFTER
