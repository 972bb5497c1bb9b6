from __future__ import annotations

from datetime import timedelta

import pytest

from flexinfer_core import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(minutes=90)),
        ("250ms", timedelta(milliseconds=250)),
        ("2m30s", timedelta(seconds=150)),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("+10s", timedelta(seconds=10)),
    ],
)
def test_parse_go_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["3x", "", "5", "m", "1h30", "five minutes", "1 h"])
def test_invalid_duration_names_field_and_value(text: str) -> None:
    with pytest.raises(DurationError) as err:
        parse_duration(text, field="spec.gpu.swapCooldown")
    assert "spec.gpu.swapCooldown" in str(err.value)
    assert repr(text) in str(err.value)


def test_negative_duration_rejected() -> None:
    with pytest.raises(DurationError, match="negative"):
        parse_duration("-5m", field="spec.serverless.idleTimeout")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(minutes=5), "5m"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(0), "0s"),
    ],
)
def test_format_round_trips(value: timedelta, text: str) -> None:
    assert format_duration(value) == text
    assert parse_duration(text) == value


def test_a_duration_too_long_for_go_names_the_field_instead_of_overflowing() -> None:
    # Passes the CRD's pattern; used to raise OverflowError from timedelta.
    with pytest.raises(DurationError) as error:
        parse_duration("99999999999h", field="spec.gpu.swapCooldown")
    assert str(error.value) == (
        "spec.gpu.swapCooldown: '99999999999h' is longer than the longest duration Go can "
        "hold (2562047h47m16s)"
    )
    assert parse_duration("2562047h", field="f") == timedelta(hours=2562047)
