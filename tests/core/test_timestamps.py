from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339


def test_round_trip_keeps_microseconds() -> None:
    value = datetime(2026, 11, 29, 17, 0, 4, 123456, tzinfo=UTC)
    assert format_rfc3339(value) == "2026-11-29T17:00:04.123456Z"
    assert parse_rfc3339(format_rfc3339(value)) == value


def test_whole_seconds_and_offsets_normalise_to_utc() -> None:
    plus_two = datetime(2026, 11, 29, 19, 0, tzinfo=timezone(timedelta(hours=2)))
    assert format_rfc3339(plus_two) == "2026-11-29T17:00:00Z"
    assert parse_rfc3339("2026-11-29T19:00:00+02:00") == datetime(2026, 11, 29, 17, tzinfo=UTC)
    assert parse_rfc3339("2026-11-29T17:00:00z") == datetime(2026, 11, 29, 17, tzinfo=UTC)


@pytest.mark.parametrize("value", [None, "", "yesterday", 42, "2026-13-01T00:00:00Z"])
def test_absent_or_unreadable_is_none(value: object) -> None:
    assert parse_rfc3339(value) is None


def test_none_formats_to_none() -> None:
    assert format_rfc3339(None) is None
