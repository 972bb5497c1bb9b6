"""Polling waits for integration tests: generous deadlines, never timing assertions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None], *, what: str, timeout: float = 60.0, interval: float = 0.2
) -> T:
    """Call `probe` until it returns something truthy and return that; fail naming `what`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval)
