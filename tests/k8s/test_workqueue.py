"""The work queue without a cluster: de-duplication, one worker per key, timers."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from flexinfer_k8s.workqueue import WorkQueue

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_key_added_many_times_is_processed_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert queue.get(timeout=0) == "a"
    assert queue.get(timeout=0) == "b"
    assert queue.get(timeout=0) is None


def test_a_key_added_while_processing_waits_and_runs_again() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    assert queue.get(timeout=0) == "a"
    queue.add("a")
    # Not handed to a second worker while the first still holds it.
    assert queue.get(timeout=0) is None
    queue.done("a")
    assert queue.get(timeout=0) == "a"
    queue.done("a")
    assert queue.is_idle()


def test_timers_fire_at_their_instant_and_rearming_replaces() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.arm("a", T0 + timedelta(seconds=10))
    queue.arm("a", T0 + timedelta(seconds=5))  # replaces the 10 s timer
    queue.arm("b", T0 + timedelta(seconds=7))
    assert queue.fire_due(T0 + timedelta(seconds=4)) == T0 + timedelta(seconds=5)
    assert len(queue) == 0
    upcoming = queue.fire_due(T0 + timedelta(seconds=5))
    assert queue.get(timeout=0) == "a"
    assert upcoming == T0 + timedelta(seconds=7)
    queue.fire_due(T0 + timedelta(seconds=11))
    assert queue.get(timeout=0) == "b"
    # The replaced 10 s timer of "a" is gone, not fired late.
    assert queue.get(timeout=0) is None
    assert queue.fire_due(T0 + timedelta(seconds=60)) is None


def test_disarming_cancels_a_timer() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.arm("a", T0 + timedelta(seconds=1))
    queue.arm("a", None)
    queue.fire_due(T0 + timedelta(seconds=2))
    assert queue.get(timeout=0) is None


def test_shutdown_releases_waiting_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(queue.get()))
    worker.start()
    queue.shutdown()
    worker.join(5)
    assert got == [None]
