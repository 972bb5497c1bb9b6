"""Write flow control of an asyncio protocol, shared by the proxy's two sides (the
client connections of `http_server` and the backend connections of `upstream`).

The transport calls `pause_writing` when its buffer is over the high-water mark and
`resume_writing` when it is drained; a writer that finds the protocol paused awaits
`wait_writable`; a lost connection fails that wait with `fail_writers`.
"""

from __future__ import annotations

import asyncio


class WriteFlow:
    """Mixed into an `asyncio.Protocol` that sets `self._loop` before any write."""

    _loop: asyncio.AbstractEventLoop
    write_paused: bool = False
    _drain_waiter: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        waiter = self._drain_waiter
        if waiter is not None:
            self._drain_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait_writable(self) -> None:
        """Return once the transport takes writes again (at once when it does)."""
        if not self.write_paused:
            return
        waiter = self._drain_waiter
        if waiter is None:
            waiter = self._drain_waiter = self._loop.create_future()
        await waiter

    def fail_writers(self, error: Exception) -> None:
        """The connection is gone: a writer waiting for it gets `error`."""
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
            waiter.exception()  # retrieved: the writer may be gone too
