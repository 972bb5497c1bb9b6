"""RFC 3339 instants as the API server stores them: the one reader and writer.

Status fields (`lastActiveTime`, `preemptedAt`, ...) and the proxy's demand reports
are RFC 3339 strings; the controller and the proxy both read and write them here.
Parsing text is pure, so it lives in the core; reading the clock does not.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, overload


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
