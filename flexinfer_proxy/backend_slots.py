"""A cap on concurrent requests per backend, served strictly first come, first served.

`BackendSlots(limit)` lets at most `limit` requests talk to one backend at a time
(0 = no cap). A request that finds every slot busy waits in that backend's line
and calls `on_queued()` at once — its place is fixed from then on, because a
freed slot is handed to the head of the line and a newcomer never takes a slot
while others wait. (aiohttp's own per-host connection limit does not promise
this: a request arriving as a connection is released can take it first.)

This module knows nothing about HTTP, models or queues of the proxy.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class BackendSlots:
    def __init__(self, limit: int = 0) -> None:
        self._limit = limit
        self._busy: defaultdict[str, int] = defaultdict(int)
        self._line: defaultdict[str, deque[asyncio.Future[None]]] = defaultdict(deque)

    @property
    def capped(self) -> bool:
        """False: `slot` never waits (callers may skip it altogether)."""
        return self._limit > 0

    def busy(self, backend: str) -> int:
        return self._busy.get(backend, 0)

    def waiting(self, backend: str) -> int:
        return len(self._line.get(backend, ()))

    @asynccontextmanager
    async def slot(self, backend: str, *, on_queued: Callable[[], None]) -> AsyncIterator[None]:
        """Hold one of `backend`'s slots for the body of the `async with`."""
        if self._limit <= 0:
            yield
            return
        await self._acquire(backend, on_queued)
        try:
            yield
        finally:
            self._release(backend)

    async def _acquire(self, backend: str, on_queued: Callable[[], None]) -> None:
        line = self._line[backend]
        if self._busy[backend] < self._limit and not line:
            self._busy[backend] += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.append(turn)
        on_queued()
        try:
            await turn  # resolved by `_release`, which hands its slot over to us
        except asyncio.CancelledError:
            if turn in line:
                line.remove(turn)
            elif turn.done() and not turn.cancelled():
                self._release(backend)  # handed a slot we will not use: pass it on
            raise

    def _release(self, backend: str) -> None:
        line = self._line[backend]
        while line:
            turn = line.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._busy[backend] -= 1
