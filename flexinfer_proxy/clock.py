"""The proxy's one source of wall-clock time.

Demand timestamps (`lastActiveTime`, `oldestWaiting`, `reportedAt`) and the
once-a-minute refresh limit read `now` through an injected `Clock`, so tests move
time by hand. Queue wait limits use the event loop's monotonic timer instead: a
wall clock that jumps must not expire or extend a client's wait. This module owns
time and nothing else. (It mirrors `flexinfer_k8s.clock` on purpose: the proxy and
the controller must not import each other, and the core must not read a clock.)
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, timezone-aware UTC."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to (thread-safe)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now
