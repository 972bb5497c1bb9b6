"""A de-duplicating work queue with one timer per key.

Keys are whole units of reconcile (a shared group, a GPUGroup, a finetune cache).
Semantics follow client-go's workqueue: a key queued many times is processed once;
a key is never processed by two workers at once; a key added while it is being
processed is processed again afterwards. Each key also has at most one timer
(the core's `next_change_at`); arming it replaces the previous one. Timers are kept
in wall-clock `datetime`s so a `ManualClock` can drive them in tests through
`fire_due`. The queue knows nothing about what a key means.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Hashable
from datetime import datetime
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._added_at: dict[K, float] = {}
        self._picked: dict[K, float] = {}
        self._timers: dict[K, datetime] = {}
        self._heap: list[tuple[datetime, int, K]] = []
        self._seq = itertools.count()
        self._shutdown = False

    # -- queueing -----------------------------------------------------------------

    def add(self, key: K) -> None:
        with self._cond:
            if self._shutdown or key in self._dirty:
                return
            self._dirty.add(key)
            self._added_at.setdefault(key, time.monotonic())
            if key not in self._processing:
                self._queue.append(key)
                self._cond.notify_all()

    def get(self, timeout: float | None = None) -> K | None:
        """The next key to process, or None on shutdown or timeout."""
        with self._cond:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._queue and not self._shutdown:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self._shutdown:
                return None
            key = self._queue.popleft()
            self._dirty.discard(key)
            self._processing.add(key)
            self._picked[key] = self._added_at.pop(key, time.monotonic())
            return key

    def queued_since(self, key: K) -> float | None:
        """`time.monotonic()` of the first add this processing of `key` covers."""
        with self._cond:
            return self._picked.get(key)

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            self._picked.pop(key, None)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def is_idle(self) -> bool:
        with self._cond:
            return not self._queue and not self._processing

    # -- timers -------------------------------------------------------------------

    def arm(self, key: K, when: datetime | None) -> None:
        """Set the key's timer to `when` (None disarms it), replacing any earlier one."""
        with self._cond:
            if when is None:
                self._timers.pop(key, None)
                return
            if self._timers.get(key) == when:
                return
            self._timers[key] = when
            heapq.heappush(self._heap, (when, next(self._seq), key))
            self._cond.notify_all()

    def timer(self, key: K) -> datetime | None:
        with self._cond:
            return self._timers.get(key)

    def fire_due(self, now: datetime) -> datetime | None:
        """Queue every key whose timer is at or before `now`; return the next timer."""
        due: list[K] = []
        with self._cond:
            while self._heap:
                when, _, key = self._heap[0]
                if self._timers.get(key) != when:
                    heapq.heappop(self._heap)  # replaced or disarmed
                    continue
                if when > now:
                    break
                heapq.heappop(self._heap)
                del self._timers[key]
                due.append(key)
            upcoming = self._heap[0][0] if self._heap else None
        for key in due:
            self.add(key)
        return upcoming

    def wait_for_timers(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking early when a timer is armed or on shutdown."""
        with self._cond:
            if not self._shutdown:
                self._cond.wait(seconds)

    # -- lifecycle ----------------------------------------------------------------

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    @property
    def is_shutdown(self) -> bool:
        with self._cond:
            return self._shutdown
