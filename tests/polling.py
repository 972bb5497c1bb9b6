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


def hold_while(
    window: Callable[[], bool], check: Callable[[], object], *, what: str, interval: float = 0.5
) -> int:
    """Assert `check()` holds at every sample while `window()` is true; return the number of
    samples, and fail if there was none (a window already over checks nothing)."""
    samples = 0
    while window():
        assert check(), f"{what} stopped holding after {samples} samples"
        samples += 1
        time.sleep(interval)
    assert samples >= 1, f"the window for {what} was over before the first sample"
    return samples
