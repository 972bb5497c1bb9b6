"""Queueing while a model is not Ready, draining, giving up, and demand signals."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from flexinfer_proxy.app import ProxyConfig
from flexinfer_proxy.demand import CONFLICTED, SET_BY_OTHER, MarkOutcome, QueueReport
from flexinfer_proxy.directory import ModelKind

from .harness import (
    BackendProcess,
    RecordingSink,
    RunningProxy,
    async_test,
    entry,
    eventually,
    running_proxy,
)

SHORT_WAIT = ProxyConfig(min_queue_wait=timedelta(milliseconds=200))
# One connection per backend: the backend then sees requests exactly in dispatch
# order (on parallel connections its handlers may start slightly out of order).
ONE_AT_A_TIME = ProxyConfig(max_per_backend=1)


def _tags(count: int) -> list[str]:
    prefix = uuid.uuid4().hex[:6]
    return [f"{prefix}-{i}" for i in range(count)]


async def _queue_requests(
    p: RunningProxy, model: str, tags: list[str]
) -> list[asyncio.Task[tuple[int, dict[str, Any]]]]:
    """Send one request per tag, each only after the previous one is queued."""
    tasks = []
    for position, tag in enumerate(tags, start=1):
        tasks.append(asyncio.create_task(p.chat(model, tag=tag)))
        await p.queued(model, position)
    return tasks


@async_test
async def test_queued_requests_drain_oldest_first_once_ready(
    backends: dict[str, BackendProcess],
) -> None:
    alpha = backends["alpha"]
    tags = _tags(5)
    async with running_proxy([entry("a", alpha.endpoint, ready=False)], config=ONE_AT_A_TIME) as p:
        tasks = await _queue_requests(p, "a", tags)
        assert p.metric("flexinfer_proxy_queued_requests", model="test/a") == 5
        assert not any(t.done() for t in tasks)

        p.directory.set_ready("a")
        results = await asyncio.gather(*tasks)

        assert [status for status, _ in results] == [200] * 5
        arrivals = [t for t in await alpha.arrivals(p.session) if t in tags]
        assert arrivals == tags
        assert p.depth("a") == 0
        assert p.metric("flexinfer_proxy_queued_requests", model="test/a") == 0
        assert p.metric("flexinfer_proxy_queue_wait_seconds_count", model="test/a") == 5


@async_test
async def test_new_requests_wait_behind_the_queue_while_it_drains(
    backends: dict[str, BackendProcess],
) -> None:
    alpha = backends["alpha"]
    tags = _tags(3)
    async with running_proxy([entry("a", alpha.endpoint, ready=False)], config=ONE_AT_A_TIME) as p:
        tasks = await _queue_requests(p, "a", tags[:2])
        # Ready, but the drain has not run yet: the newcomer must not jump the line.
        p.directory.put(entry("a", alpha.endpoint, ready=True))
        tasks.append(asyncio.create_task(p.chat("a", tag=tags[2])))
        await asyncio.gather(*tasks)
        assert [t for t in await alpha.arrivals(p.session) if t in tags] == tags


@async_test
async def test_a_drain_stops_when_the_model_stops_being_ready(
    backends: dict[str, BackendProcess],
) -> None:
    alpha = backends["alpha"]
    async with running_proxy([entry("a", alpha.endpoint, ready=False)]) as p:
        tasks = await _queue_requests(p, "a", _tags(2))
        # Ready and not Ready again before the drain task got a turn: it admits nobody.
        p.directory.set_ready("a")
        p.directory.set_ready("a", False)
        for _ in range(20):
            await asyncio.sleep(0)
        assert p.depth("a") == 2
        assert not any(t.done() for t in tasks)
        p.directory.set_ready("a")
        assert [s for s, _ in await asyncio.gather(*tasks)] == [200, 200]


@async_test
async def test_waiting_past_the_limit_is_a_503_with_retry_after(
    backends: dict[str, BackendProcess],
) -> None:
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=SHORT_WAIT
    ) as p:
        async with p.post("/v1/chat/completions", {"model": "a"}) as response:
            body = await response.json()
        assert response.status == 503
        # The wait still expected: nothing measured yet, so the 30 s prior (the
        # manual clock did not move), plus up to as much again of jitter.
        assert 30 <= int(response.headers["Retry-After"]) <= 60
        assert body["error"]["code"] == "model_not_ready"
        assert "'a'" in body["error"]["message"]
        assert p.depth("a") == 0
        outcome = {"model": "test/a", "outcome": "queue_timeout"}
        assert p.metric("flexinfer_proxy_requests_total", **outcome) == 1


@async_test
async def test_the_limit_is_at_least_the_cold_start_timeout(
    backends: dict[str, BackendProcess],
) -> None:
    slow = entry("a", backends["alpha"].endpoint, ready=False, cold_start=timedelta(minutes=5))
    async with running_proxy([slow], config=SHORT_WAIT) as p:
        task = asyncio.create_task(p.chat("a", tag="cold"))
        await p.queued("a", 1)
        # Far past the 200 ms minimum, still queued: give the loop plenty of turns.
        for _ in range(100):
            await asyncio.sleep(0.01)
            if task.done():
                break
        assert not task.done()
        p.directory.set_ready("a")
        assert (await task)[0] == 200


@async_test
async def test_a_client_that_leaves_is_taken_out_of_the_queue(
    backends: dict[str, BackendProcess],
) -> None:
    member = entry(
        "g",
        backends["alpha"].endpoint,
        ready=False,
        kind=ModelKind.MODEL_DEPLOYMENT,
        gpu_group="grp",
    )
    async with running_proxy([member]) as p:
        task = asyncio.create_task(p.chat("g", tag="leaver"))
        await p.queued("g", 1)
        task.cancel()
        await p.queued("g", 0)
        await eventually(
            lambda: (
                p.metric(
                    "flexinfer_proxy_requests_total", model="test/g", outcome="client_disconnected"
                )
                == 1
            ),
            what="the disconnect to be counted",
        )
        await p.proxy.signaller.flush()
        reports = p.sink.reports_for("g")
        assert reports[-1] is None, "the member's demand must be cleared"


@async_test
async def test_demand_is_written_once_per_burst(backends: dict[str, BackendProcess]) -> None:
    alpha = backends["alpha"]
    async with running_proxy([entry("a", alpha.endpoint, ready=False)]) as p:
        tasks = [asyncio.create_task(p.chat("a", tag=t)) for t in _tags(4)]
        await p.queued("a", 4)
        await p.proxy.signaller.flush()
        assert p.sink.marks_for("a") == [p.clock.now()]

        p.directory.set_ready("a")
        await asyncio.gather(*tasks)
        await p.proxy.signaller.flush()
        # Served right after the demand write, inside the minute: no second write.
        assert len(p.sink.marks_for("a")) == 1


@async_test
async def test_a_ready_model_is_refreshed_at_most_once_a_minute(
    backends: dict[str, BackendProcess],
) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint)]) as p:
        start = p.clock.now()
        for _ in range(3):
            assert (await p.chat("a"))[0] == 200
        p.clock.advance(timedelta(seconds=59))
        assert (await p.chat("a"))[0] == 200
        await p.proxy.signaller.flush()
        assert p.sink.marks_for("a") == [start]

        later = p.clock.advance(timedelta(seconds=1))
        assert (await p.chat("a"))[0] == 200
        assert (await p.chat("a"))[0] == 200
        await p.proxy.signaller.flush()
        assert p.sink.marks_for("a") == [start, later]


@async_test
async def test_a_gpugroup_member_reports_its_queue_and_clears_it(
    backends: dict[str, BackendProcess],
) -> None:
    alpha = backends["alpha"]
    member = entry(
        "g", alpha.endpoint, ready=False, kind=ModelKind.MODEL_DEPLOYMENT, gpu_group="grp"
    )
    async with running_proxy([member]) as p:
        first_arrival = p.clock.now()
        tasks = [asyncio.create_task(p.chat("g", tag="g1"))]
        await p.queued("g", 1)
        p.clock.advance(timedelta(seconds=5))
        tasks.append(asyncio.create_task(p.chat("g", tag="g2")))
        await p.queued("g", 2)
        await p.proxy.signaller.flush()
        assert p.sink.reports_for("g")[-1] == QueueReport(queued=2, oldest_waiting=first_arrival)
        assert p.sink.marks_for("g") == [], "queued demand of a member is the annotation only"

        p.directory.set_ready("g")
        await asyncio.gather(*tasks)
        await p.proxy.in_flight.close()  # the served requests' count, back to 0
        await p.proxy.signaller.flush()
        assert p.sink.reports_for("g")[-1] is None
        # While they were answered, the annotation said so (docs/election.md 1.6).
        assert any(r is not None and r.in_flight > 0 for r in p.sink.reports_for("g"))
        # Served requests still refresh the member's lastAccessTime.
        assert len(p.sink.marks_for("g")) == 1


@async_test
async def test_demand_is_refreshed_while_requests_stay_queued(
    backends: dict[str, BackendProcess],
) -> None:
    config = ProxyConfig(refresh_interval=timedelta(milliseconds=20))
    model = entry("a", backends["alpha"].endpoint, ready=False)
    member = entry(
        "g",
        backends["beta"].endpoint,
        ready=False,
        kind=ModelKind.MODEL_DEPLOYMENT,
        gpu_group="grp",
    )
    async with running_proxy([model, member], config=config) as p:
        tasks = [asyncio.create_task(p.chat(name)) for name in ("a", "g")]
        await eventually(lambda: len(p.sink.marks_for("a")) >= 3, what="repeated demand")
        await eventually(lambda: len(p.sink.reports_for("g")) >= 3, what="repeated reports")
        assert {r.queued for r in p.sink.reports_for("g") if r is not None} == {1}
        p.directory.set_ready("a")
        p.directory.set_ready("g")
        await asyncio.gather(*tasks)


@async_test
async def test_shutting_down_answers_queued_requests_with_a_503(
    backends: dict[str, BackendProcess],
) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint, ready=False)]) as p:
        waiting = asyncio.create_task(p.chat("a"))
        await p.queued("a", 1)
        stopping = asyncio.create_task(p.stop())
        status, body = await waiting
        await stopping
        assert status == 503
        assert body["error"]["code"] == "proxy_restarting"
        outcome = {"model": "test/a", "outcome": "proxy_closing"}
        assert p.metric("flexinfer_proxy_requests_total", **outcome) == 1


@async_test
async def test_a_long_answer_does_not_hold_up_the_drain(
    backends: dict[str, BackendProcess],
) -> None:
    alpha = backends["alpha"]
    tags = _tags(3)
    async with running_proxy([entry("a", alpha.endpoint, ready=False)], config=ONE_AT_A_TIME) as p:

        async def stream(tag: str) -> str:
            payload = {"model": "a", "stream": True, "hold": True, "tag": tag}
            async with p.post("/v1/chat/completions", payload) as response:
                return (await response.content.read()).decode()

        tasks = []
        for position, tag in enumerate(tags, start=1):
            tasks.append(asyncio.create_task(stream(tag)))
            await p.queued("a", position)
        p.directory.set_ready("a")
        # The first answer is held open by the backend, yet every request left the
        # proxy's queue: the rest wait for the backend's single connection, in order.
        await p.queued("a", 0)
        assert not any(t.done() for t in tasks)
        for tag in tags:
            await alpha.release(p.session, tag)
        bodies = await asyncio.gather(*tasks)
        assert all(body.endswith("data: [DONE]\n\n") for body in bodies)
        assert [t for t in await alpha.arrivals(p.session) if t in tags] == tags


@async_test
async def test_conflicts_are_counted_and_a_write_that_did_not_count_is_retried(
    backends: dict[str, BackendProcess],
) -> None:
    sink = RecordingSink(outcomes=[MarkOutcome(CONFLICTED, 3), MarkOutcome(SET_BY_OTHER, 3)])
    async with running_proxy([entry("a", backends["alpha"].endpoint)], sink=sink) as p:
        # Not recorded: the next request (same minute) tries again; that one counts.
        for _ in range(3):
            assert (await p.chat("a"))[0] == 200
            await p.proxy.signaller.flush()
        assert len(sink.marks_for("a")) == 2
        assert p.metric("flexinfer_proxy_demand_conflicts_total", model="test/a") == 6
        for result in (CONFLICTED, SET_BY_OTHER):
            labels = {"model": "test/a", "signal": "served", "result": result}
            assert p.metric("flexinfer_proxy_demand_writes_total", **labels) == 1
