"""Go-style durations (`90s`, `5m`, `1h30m`): parsing and printing.

The CRDs carry durations as strings with the same grammar as Go's
`time.ParseDuration`; this module is the one place that reads and writes them.
"""

from __future__ import annotations

import re
from datetime import timedelta

from flexinfer_core.errors import DurationError, InvalidFieldError

_UNIT_SECONDS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
MAX_SECONDS = (2**63 - 1) / 1e9
"""Go's longest duration (int64 nanoseconds, about 292 years): longer strings do not
parse in Go either, and would overflow Python's timedelta."""
MAX_WINDOW = timedelta(days=3650)
"""The longest window or timeout the core accepts. The CRDs allow at most 720h (30 days);
objects stored before that bound may hold more, and anything up to ten years still
decides correctly, while longer ones would overflow `now + window` (datetime ends in
year 9999) in the middle of a decision."""
_TERM = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str, *, field: str = "duration") -> timedelta:
    """Parse a Go duration such as ``"1h30m"`` or ``"90s"`` into a timedelta.

    Negative durations are rejected: every duration in flexinfer is a window or a
    timeout. ``"0"`` is accepted as zero, as in Go.
    """
    if not isinstance(text, str):
        raise DurationError(field, text, "is not a duration string (expected e.g. '90s', '5m')")
    s = text.strip()
    if s == "0":
        return timedelta(0)
    if not s:
        raise DurationError(field, text, "is empty (expected e.g. '90s', '5m', '1h30m')")
    if s[0] in "+-":
        if s[0] == "-":
            raise DurationError(field, text, "is negative; durations must be zero or more")
        s = s[1:]
    pos = 0
    total = 0.0
    while pos < len(s):
        match = _TERM.match(s, pos)
        if match is None:
            raise DurationError(
                field, text, "is not a valid duration (expected e.g. '90s', '5m', '1h30m')"
            )
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if total > MAX_SECONDS:
        raise DurationError(
            field, text, "is longer than the longest duration Go can hold (2562047h47m16s)"
        )
    return timedelta(seconds=total)


def check_window(value: timedelta, *, field: str, attribute: str = "") -> timedelta:
    """`value` if it is a usable window or timeout (zero up to `MAX_WINDOW`), else an
    `InvalidFieldError` naming `field`."""
    if value < timedelta(0):
        raise InvalidFieldError(
            field, value, "is negative; durations must be zero or more", attribute=attribute
        )
    if value > MAX_WINDOW:
        raise InvalidFieldError(
            field,
            value,
            "is too long: at most 3650 days (the CRDs allow 720h)",
            attribute=attribute,
        )
    return value


def seconds_window(value: int, *, field: str) -> timedelta:
    """A window given as whole seconds (`idleTimeoutSeconds`, `drainTimeoutSeconds`, ...).

    Checked before it becomes a timedelta: 2**62 seconds would overflow one, and the
    error must name `field` and the number as written, not an `OverflowError`.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFieldError(field, value, "is not a whole number of seconds")
    if value < 0:
        raise InvalidFieldError(field, value, "is negative; durations must be zero or more")
    if value > MAX_WINDOW.total_seconds():
        raise InvalidFieldError(
            field,
            value,
            f"is too long: at most {int(MAX_WINDOW.total_seconds())} seconds (3650 days; the "
            "CRDs allow 2592000)",
        )
    return timedelta(seconds=value)


def format_duration(value: timedelta) -> str:
    """Print a timedelta as Go would: ``5400s`` → ``1h30m``, ``90s`` → ``1m30s``."""
    seconds = value.total_seconds()
    if seconds < 0:
        raise DurationError("duration", value, "is negative; durations must be zero or more")
    if seconds == 0:
        return "0s"
    whole = int(seconds)
    frac = seconds - whole
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if secs or frac or not out:
        out += f"{secs + frac:.6f}".rstrip("0").rstrip(".") + "s"
    return out
