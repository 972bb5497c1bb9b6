"""RFC 3339 instants as the API server stores them: the one reader and writer.

Status fields (`lastActiveTime`, `preemptedAt`, ...) and the proxy's demand reports
are RFC 3339 strings; the controller and the proxy both read and write them here.
Parsing text is pure, so it lives in the core; reading the clock does not. An instant
recorded in the future is read as the `now` a decision is given (`not_after`), and
one far ahead (`far_ahead`) is said (`future_note`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, overload

FUTURE_TOLERANCE = timedelta(minutes=1)
"""How far past `now` a recorded instant (`lastActiveTime`, `lastAccessTime`,
`preemptedAt`, `lastSwapTime`) may be and pass without comment: a proxy whose clock
runs a little ahead. Any instant after `now` is read as `now` (`not_after`); beyond
this the decisions say so and the value is rewritten."""


def not_after(value: datetime | None, now: datetime) -> datetime | None:
    """`value`, or `now` if it lies in the future: a far-future instant read as recorded
    would keep a member demanded, or a cooldown running, until that date."""
    return None if value is None else min(value, now)


def far_ahead(value: datetime | None, now: datetime) -> bool:
    """Whether `value` lies more than `FUTURE_TOLERANCE` after `now`."""
    return value is not None and value > now + FUTURE_TOLERANCE


def future_note(field: str, value: datetime) -> str:
    """How a decision says it read `field` (holding `value`, in the future) as now."""
    return f"{field} {value.isoformat()} is in the future and is read as now"


def parse_rfc3339(value: Any) -> datetime | None:
    """An RFC 3339 instant as an aware UTC datetime; None when absent or unreadable.

    A value without an offset is read as UTC (the API server writes `Z`).
    """
    if not isinstance(value, str) or not value:
        return None
    text = value.strip().replace("z", "Z")
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


@overload
def format_rfc3339(value: datetime) -> str: ...


@overload
def format_rfc3339(value: None) -> None: ...


def format_rfc3339(value: datetime | None) -> str | None:
    """RFC 3339 in UTC, microseconds kept so a written instant reads back equal."""
    if value is None:
        return None
    utc = value.astimezone(UTC)
    if utc.microsecond:
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")
