"""The per-backend cap: strict first come, first served; no newcomer jumps the line."""

from __future__ import annotations

import asyncio

from flexinfer_proxy.backend_slots import BackendSlots

from .harness import async_test, eventually


async def _hold(slots: BackendSlots, name: str, log: list[str], release: asyncio.Event) -> None:
    async with slots.slot("b", on_queued=lambda: log.append(f"queued {name}")):
        log.append(f"got {name}")
        await release.wait()
    log.append(f"done {name}")


@async_test
async def test_freed_slots_go_to_the_head_of_the_line() -> None:
    slots = BackendSlots(1)
    log: list[str] = []
    gates = {name: asyncio.Event() for name in "abcd"}
    tasks = {}
    for name in "abc":
        tasks[name] = asyncio.create_task(_hold(slots, name, log, gates[name]))
        await eventually(lambda n=name: f"got {n}" in log or f"queued {n}" in log, what=name)
    assert log == ["got a", "queued b", "queued c"]

    gates["a"].set()
    # A newcomer arriving as the slot is freed must not take it from b.
    tasks["d"] = asyncio.create_task(_hold(slots, "d", log, gates["d"]))
    await eventually(lambda: "got b" in log, what="b's turn")
    await eventually(lambda: "queued d" in log, what="d to queue")
    for name in "bcd":
        gates[name].set()
    await asyncio.gather(*tasks.values())
    got = [line for line in log if line.startswith("got")]
    assert got == ["got a", "got b", "got c", "got d"]
    assert (slots.busy("b"), slots.waiting("b")) == (0, 0)


@async_test
async def test_leaving_the_line_or_a_handed_slot_passes_it_on() -> None:
    slots = BackendSlots(1)
    log: list[str] = []
    gates = {name: asyncio.Event() for name in "abc"}
    a = asyncio.create_task(_hold(slots, "a", log, gates["a"]))
    await eventually(lambda: "got a" in log, what="a")
    b = asyncio.create_task(_hold(slots, "b", log, gates["b"]))
    c = asyncio.create_task(_hold(slots, "c", log, gates["c"]))
    await eventually(lambda: slots.waiting("b") == 2, what="b and c waiting")

    b.cancel()  # leaves the line before its turn
    await eventually(lambda: slots.waiting("b") == 1, what="b gone from the line")
    gates["a"].set()
    await eventually(lambda: "got c" in log, what="c's turn")
    gates["c"].set()
    await asyncio.gather(a, c)
    assert "got b" not in log
    assert (slots.busy("b"), slots.waiting("b")) == (0, 0)


@async_test
async def test_a_waiter_cancelled_as_its_turn_comes_releases_the_slot() -> None:
    slots = BackendSlots(1)
    log: list[str] = []
    gates = {name: asyncio.Event() for name in "abc"}
    waiters: dict[str, asyncio.Task[None]] = {}

    async def hold_then_cancel_b() -> None:
        async with slots.slot("b", on_queued=lambda: None):
            log.append("got a")
            await gates["a"].wait()
        # Same step as the hand-over: b's turn is resolved but b has not run yet.
        waiters["b"].cancel()

    a = asyncio.create_task(hold_then_cancel_b())
    await eventually(lambda: "got a" in log, what="a")
    for name in "bc":
        waiters[name] = asyncio.create_task(_hold(slots, name, log, gates[name]))
    await eventually(lambda: slots.waiting("b") == 2, what="b and c waiting")

    gates["a"].set()
    await eventually(lambda: "got c" in log, what="c to get the slot b gave up")
    gates["c"].set()
    await asyncio.gather(a, waiters["c"])
    assert waiters["b"].cancelled()
    assert "got b" not in log
    assert (slots.busy("b"), slots.waiting("b")) == (0, 0)


@async_test
async def test_no_cap_means_no_waiting() -> None:
    slots = BackendSlots(0)
    queued: list[str] = []
    async with (
        slots.slot("b", on_queued=lambda: queued.append("x")),
        slots.slot("b", on_queued=lambda: queued.append("y")),
    ):
        pass
    assert queued == []
