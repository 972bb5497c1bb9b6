"""Queue positions, wait estimates from measured swaps, waiting streams, withdrawn demand.

Over real HTTP against the fake backends. Every duration the proxy measures is read
from the harness's `ManualClock`, so the estimates below are exact: the tests move
the clock, never wait for it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import attrs
import pytest
from prometheus_client import CollectorRegistry

from flexinfer_kube.clock import ManualClock
from flexinfer_proxy.app import ProxyConfig
from flexinfer_proxy.demand import DemandSignaller
from flexinfer_proxy.directory import InMemoryDirectory, ModelKind
from flexinfer_proxy.metrics import ProxyMetrics
from flexinfer_proxy.queues import RequestQueues, WaitResult
from flexinfer_proxy.swap_times import (
    CAUTIOUS,
    MIN_REMAINING_SECONDS,
    SwapTimes,
    nearest_rank,
)

from .harness import (
    BackendProcess,
    RecordingSink,
    RunningProxy,
    async_test,
    entry,
    eventually,
    running_proxy,
)

START = datetime(2026, 1, 1, tzinfo=UTC)
POSITION = "x-flexinfer-queue-position"
WAIT = "x-flexinfer-wait-seconds"


# -- the estimator ---------------------------------------------------------------------


def test_the_estimate_is_the_prior_until_a_swap_is_measured() -> None:
    times = SwapTimes(prior=42.0, samples=5)
    assert times.estimate("ns/m") == 42.0
    times.observe("ns/m", 7.0, ended_at=START)
    assert times.estimate("ns/m") == 7.0
    assert times.estimate("ns/other") == 42.0


def test_the_estimates_are_nearest_rank_percentiles_of_the_last_n() -> None:
    times = SwapTimes(samples=10)
    for seconds in (100.0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10):  # 100 is pushed out
        times.observe("ns/m", seconds, ended_at=START)
    assert times.observed("ns/m") == 10
    assert times.estimate("ns/m", percentile=CAUTIOUS) == 9.0  # 9 of the 10 are at or below 9
    assert times.estimate("ns/m") == 5.0  # the median (TYPICAL): 5 of the 10
    times.observe("ns/m", 50.0, ended_at=START)  # 1 falls out: 2..10, 50
    assert times.estimate("ns/m", percentile=CAUTIOUS) == 10.0
    assert times.estimate("ns/m") == 6.0
    assert nearest_rank([3.0, 1.0, 2.0], 0.9) == 3.0
    assert nearest_rank([3.0, 1.0, 2.0], 0.5) == 2.0
    assert nearest_rank([5.0], 0.9) == 5.0


def test_a_few_swaps_a_probe_period_longer_move_the_told_wait_not_the_retry_after() -> None:
    # Swaps of 2.3 s, and on a busy node now and then one a 2 s probe period longer:
    # the 90th percentile lands on those; the median stays with the usual swap.
    times = SwapTimes()
    for seconds in (2.3, 2.2, 4.3, 2.3, 2.4, 2.3, 2.2, 4.4, 2.3, 2.3):
        times.observe("ns/m", seconds, ended_at=START)
    assert times.estimate("ns/m") == 2.3
    assert times.estimate("ns/m", percentile=CAUTIOUS) == 4.3


def test_a_node_of_its_own_once_seen_else_the_models_swaps() -> None:
    times = SwapTimes(prior=99.0)
    times.observe("ns/m", 10.0, ended_at=START, node="gpu-a")
    assert times.estimate("ns/m", node="gpu-a") == 10.0
    assert times.estimate("ns/m", node="gpu-b") == 10.0  # not seen there: any node
    times.observe("ns/m", 30.0, ended_at=START, node="gpu-b")
    assert times.estimate("ns/m", node="gpu-b") == 30.0
    assert times.estimate("ns/m", node="gpu-a") == 10.0


def test_the_remaining_wait_is_the_estimate_less_the_time_run_never_below_the_floor() -> None:
    times = SwapTimes(prior=20.0)
    assert times.remaining("ns/m", started=START, now=START + timedelta(seconds=5)) == 15.0
    late = START + timedelta(seconds=25)
    assert times.remaining("ns/m", started=START, now=late) == MIN_REMAINING_SECONDS


def test_the_estimators_bounds_are_enforced() -> None:
    with pytest.raises(ValueError, match="prior"):
        SwapTimes(prior=0)
    with pytest.raises(ValueError, match="prior"):
        SwapTimes(prior=3601)
    with pytest.raises(ValueError, match="samples"):
        SwapTimes(samples=0)
    with pytest.raises(ValueError, match="samples"):
        SwapTimes(samples=1001)


def test_recent_swaps_are_kept_for_the_live_page_bounded() -> None:
    times = SwapTimes()
    for index in range(150):
        times.observe("ns/m", float(index), ended_at=START)
    recent = times.recent()
    assert len(recent) == 100
    assert recent[-1].seconds == 149.0 and recent[0].seconds == 50.0


# -- headers and Retry-After -------------------------------------------------------------


async def _chat(p: RunningProxy, model: str, **body: Any) -> tuple[int, Any, dict[str, Any]]:
    async with p.post("/v1/chat/completions", {"model": model, **body}) as response:
        return response.status, response.headers, await response.json()


@async_test
async def test_a_held_request_is_told_its_position_and_wait_and_swaps_are_measured(
    backends: dict[str, BackendProcess],
) -> None:
    config = ProxyConfig(swap_time_prior=30.0)
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=config
    ) as p:
        first = asyncio.create_task(_chat(p, "a", tag="first"))
        await p.queued("a", 1)
        p.clock.advance(timedelta(seconds=10))
        second = asyncio.create_task(_chat(p, "a", tag="second"))
        await p.queued("a", 2)
        p.clock.advance(timedelta(seconds=2))
        p.directory.set_ready("a")
        (s1, h1, _), (s2, h2, _) = await asyncio.gather(first, second)
        assert (s1, h1[POSITION], h1[WAIT]) == (200, "1", "30.0")
        # Joined 10 s into the swap: 20 s of the prior's 30 were left.
        assert (s2, h2[POSITION], h2[WAIT]) == (200, "2", "20.0")
        # The swap took 12 s of the manual clock: the next estimate.
        assert p.proxy.swap_times.estimate("test/a") == 12.0

        status, headers, _ = await _chat(p, "a")
        assert status == 200 and POSITION not in headers and WAIT not in headers

        p.directory.set_ready("a", False)
        third = asyncio.create_task(_chat(p, "a", tag="third"))
        await p.queued("a", 1)
        p.directory.set_ready("a")
        status, headers, _ = await third
        assert (headers[POSITION], headers[WAIT]) == ("1", "12.0")


@async_test
async def test_swaps_are_kept_by_the_node_the_model_became_ready_on(
    backends: dict[str, BackendProcess],
) -> None:
    config = ProxyConfig(swap_time_prior=30.0)
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=config
    ) as p:

        def parked(node: str | None) -> None:
            """`a` scaled to 0, its status naming `node` (where it last served)."""
            p.directory.put(attrs.evolve(p.directory.lookup("test/a"), ready=False, node=node))

        async def swap(seconds: float, *, on: str) -> None:
            """A request waits `seconds` while `a` loads, then it is Ready on `on`."""
            parked(p.directory.lookup("test/a").node)
            waiting = asyncio.create_task(_chat(p, "a"))
            await p.queued("a", 1)
            p.clock.advance(timedelta(seconds=seconds))
            p.directory.put(attrs.evolve(p.directory.lookup("test/a"), ready=True, node=on))
            assert (await waiting)[0] == 200

        # Never placed: the prior, whatever node.
        assert p.proxy.queues.estimate_wait("test/a") == 30.0
        await swap(10.0, on="gpu-a")
        await swap(40.0, on="gpu-b")  # expected on gpu-a, placed on gpu-b
        await swap(40.0, on="gpu-b")
        assert p.proxy.swap_times.observed("test/a", node="gpu-a") == 1
        assert p.proxy.swap_times.observed("test/a", node="gpu-b") == 2

        parked("gpu-a")
        assert p.proxy.queues.estimate_wait("test/a") == 10.0  # gpu-a's own swaps
        parked("gpu-b")
        assert p.proxy.queues.estimate_wait("test/a") == 40.0
        # A node not seen yet, or none named: its swaps on any node (10, 40, 40).
        parked("gpu-c")
        assert p.proxy.queues.estimate_wait("test/a") == 40.0
        parked(None)
        assert p.proxy.queues.estimate_wait("test/a") == 40.0
        # What a waiting request is told comes from the same key.
        parked("gpu-a")
        waiting = asyncio.create_task(_chat(p, "a"))
        await p.queued("a", 1)
        p.directory.put(attrs.evolve(p.directory.lookup("test/a"), ready=True, node="gpu-a"))
        assert (await waiting)[1][WAIT] == "10.0"


# Taking turns, g2 asked for 10 s into g1's 30 s swap waits the 20 s left, then its own
# 8 s; in a packed GPUGroup (docs/election.md 3, "Packing") members that fit start side
# by side, so g2 is told the rest of its own swap only.
@pytest.mark.parametrize(
    ("side_by_side", "told"),
    [(False, 28.0), (True, 8.0)],
    ids=["taking-turns", "packed-side-by-side"],
)
@async_test
async def test_a_member_waits_behind_the_swap_of_a_member_asked_for_earlier_unless_packed(
    backends: dict[str, BackendProcess], side_by_side: bool, told: float
) -> None:
    def member(name: str) -> Any:
        return entry(
            name,
            backends["alpha"].endpoint,
            ready=False,
            kind=ModelKind.MODEL_DEPLOYMENT,
            gpu_group="grp",
            side_by_side=side_by_side,
        )

    config = ProxyConfig(swap_time_prior=30.0)
    async with running_proxy([member("g1"), member("g2")], config=config) as p:
        p.proxy.swap_times.observe("test/g2", 8.0, ended_at=START)
        first = asyncio.create_task(_chat(p, "g1"))
        await p.queued("g1", 1)
        p.clock.advance(timedelta(seconds=10))
        second = asyncio.create_task(_chat(p, "g2"))
        await p.queued("g2", 1)
        assert p.proxy.queues.estimate_wait("test/g2") == told
        waiting = {(w.model, w.position): w.estimate_seconds for w in p.proxy.queues.waiting()}
        assert waiting == {("test/g1", 1): 30.0, ("test/g2", 1): told}
        p.directory.set_ready("g1")
        p.directory.set_ready("g2")
        (_, h1, _), (_, h2, _) = await asyncio.gather(first, second)
        assert h1[WAIT] == "30.0" and h2[WAIT] == str(told)


@async_test
async def test_retry_after_of_a_timed_out_wait_comes_from_the_estimate_within_its_bound(
    backends: dict[str, BackendProcess],
) -> None:
    short = timedelta(milliseconds=100)
    config = ProxyConfig(min_queue_wait=short, swap_time_prior=200.0)
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=config
    ) as p:
        status, headers, body = await _chat(p, "a")
        assert status == 503 and body["error"]["code"] == "model_not_ready"
        # 200 s expected (the manual clock did not move), plus up to as much jitter.
        assert 200 <= int(headers["Retry-After"]) <= 400
        assert (headers[POSITION], headers[WAIT]) == ("1", "200.0")

    # Measured swaps: the told wait is their median, Retry-After their 90th percentile.
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=config
    ) as p:
        for seconds in (10.0, 10.0, 10.0, 10.0, 40.0):
            p.proxy.swap_times.observe("test/a", seconds, ended_at=START)
        status, headers, _ = await _chat(p, "a")
        assert status == 503 and headers[WAIT] == "10.0"
        assert 40 <= int(headers["Retry-After"]) <= 80

    bounded = ProxyConfig(min_queue_wait=short, swap_time_prior=200.0, max_retry_after_seconds=50)
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=bounded
    ) as p:
        status, headers, _ = await _chat(p, "a")
        assert status == 503 and 50 <= int(headers["Retry-After"]) <= 100


# -- waiting streams -------------------------------------------------------------------

STREAMING = ProxyConfig(wait_comment_interval=0.02, swap_time_prior=30.0)


async def _lines_until(response: aiohttp.ClientResponse, count: int) -> list[str]:
    """Read the stream's lines until `count` waiting comments have arrived."""
    lines: list[str] = []
    while sum(line.startswith(": waiting") for line in lines) < count:
        line = await response.content.readline()
        assert line, f"the stream ended early: {lines}"
        lines.append(line.decode())
    return lines


def _last_error(text: str) -> dict[str, Any]:
    """The `error` of a stream's last event, which must be a `data:` one."""
    last = text.strip().split("\n\n")[-1]
    assert last.startswith("data: "), text
    error: dict[str, Any] = json.loads(last.removeprefix("data: "))["error"]
    return error


@async_test
async def test_a_waiting_stream_gets_comments_then_the_answer_in_the_same_stream(
    backends: dict[str, BackendProcess],
) -> None:
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=STREAMING
    ) as p:
        payload = {"model": "a", "stream": True}
        async with p.post("/v1/chat/completions", payload) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert (response.headers[POSITION], response.headers[WAIT]) == ("1", "30.0")
            before = await _lines_until(response, 2)
            assert ": waiting for a, position 1, about 30 s\n" in before
            p.directory.set_ready("a")
            rest = (await response.content.read()).decode()
        assert not any(line.startswith("data:") for line in before)
        events = [e for e in rest.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[0].removeprefix("data: "))["backend"] == "alpha"
        served = {"model": "test/a", "outcome": "served"}
        assert p.metric("flexinfer_proxy_requests_total", **served) == 1


@async_test
async def test_a_waiting_stream_refused_after_its_200_ends_with_an_error_event(
    backends: dict[str, BackendProcess],
) -> None:
    config = ProxyConfig(wait_comment_interval=0.02, min_queue_wait=timedelta(milliseconds=300))
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=config
    ) as p:
        async with p.post("/v1/chat/completions", {"model": "a", "stream": True}) as response:
            assert response.status == 200
            text = (await response.content.read()).decode()  # a clean end, no cut
        assert text.startswith(": waiting for a")
        error = _last_error(text)
        assert error["code"] == "model_not_ready"
        timed_out = {"model": "test/a", "outcome": "queue_timeout"}
        assert p.metric("flexinfer_proxy_requests_total", **timed_out) == 1

        # The proxy closing on a waiting stream: the same, with its own code.
        async with p.post("/v1/chat/completions", {"model": "a", "stream": True}) as response:
            await _lines_until(response, 1)
            stopping = asyncio.create_task(p.stop())
            text = (await response.content.read()).decode()
            await stopping
        error = _last_error(text)
        assert error["code"] == "proxy_restarting"


@async_test
async def test_a_backend_error_after_a_waiting_streams_200_is_an_error_event(
    backends: dict[str, BackendProcess],
) -> None:
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=STREAMING
    ) as p:
        payload = {"model": "a", "stream": True, "status": 500}
        async with p.post("/v1/chat/completions", payload) as response:
            await _lines_until(response, 1)
            p.directory.set_ready("a")
            text = (await response.content.read()).decode()
        error = _last_error(text)
        assert error["code"] == "backend_error" and "500" in error["message"]


@async_test
async def test_a_stream_whose_model_is_ready_gets_the_backends_own_head(
    backends: dict[str, BackendProcess],
) -> None:
    ready = entry("a", backends["alpha"].endpoint)
    payload = {"model": "a", "stream": True}
    async with (
        running_proxy([ready], config=STREAMING) as p,
        p.post("/v1/chat/completions", payload) as response,
    ):
        assert response.headers["X-Backend"] == "alpha"
        assert not (await response.content.read()).startswith(b":")


# -- withdrawn demand ---------------------------------------------------------------------


@async_test
async def test_when_every_waiting_client_leaves_the_models_demand_is_put_back(
    backends: dict[str, BackendProcess],
) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint, ready=False)]) as p:
        before = p.clock.now() - timedelta(hours=1)
        p.sink.replaced = before  # what lastActiveTime said before the burst
        leavers = [asyncio.create_task(p.chat("a")) for _ in range(2)]
        await p.queued("a", 2)
        await p.proxy.signaller.flush()
        marked = p.sink.marks_for("a")
        assert marked == [p.clock.now()]
        leavers[0].cancel()
        await p.queued("a", 1)
        await p.proxy.signaller.flush()
        assert p.sink.withdrawals == [], "one client still waits"
        leavers[1].cancel()
        await p.queued("a", 0)
        await eventually(lambda: p.sink.withdrawals, what="the demand withdrawn")
        assert p.sink.withdrawals == [("a", marked[0], before)]
        withdrawn = {"model": "test/a", "signal": "withdrawn", "result": "written"}
        await eventually(
            lambda: p.metric("flexinfer_proxy_demand_writes_total", **withdrawn) == 1,
            what="the withdrawal counted",
        )
        # A new request is new demand: written again at once.
        again = asyncio.create_task(p.chat("a"))
        await p.queued("a", 1)
        await p.proxy.signaller.flush()
        assert len(p.sink.marks_for("a")) == 2
        p.directory.set_ready("a")
        assert (await again)[0] == 200


@async_test
async def test_demand_stays_when_clients_timed_out(
    backends: dict[str, BackendProcess],
) -> None:
    config = ProxyConfig(min_queue_wait=timedelta(milliseconds=100))
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=config
    ) as p:
        assert (await p.chat("a"))[0] == 503  # told to come back: its demand stands
        await p.proxy.signaller.flush()
        assert p.sink.withdrawals == []


@async_test
async def test_demand_stays_when_a_request_of_the_burst_was_let_go() -> None:
    directory = InMemoryDirectory([entry("b", "http://127.0.0.1:9/v1", ready=False)])
    sink = RecordingSink()
    clock = ManualClock()
    metrics = ProxyMetrics(CollectorRegistry())
    signaller = DemandSignaller(sink, clock=clock, metrics=metrics)
    # A long grace: the drain waits for the first request to say it was dispatched.
    queues = RequestQueues(directory, signaller, clock=clock, metrics=metrics, dispatch_grace=30)
    entry_b = directory.lookup("test/b")
    assert entry_b is not None
    first, second = queues.enqueue(entry_b), queues.enqueue(entry_b)
    waits = [asyncio.create_task(queues.wait(t, limit=30)) for t in (first, second)]
    directory.set_ready("b")
    assert await waits[0] is WaitResult.ADMITTED
    # The model is lost again before the second was let go; then its client leaves.
    directory.set_ready("b", False)
    first.dispatched()
    waits[1].cancel()
    await eventually(lambda: queues.depth("test/b") == 0, what="the second gone")
    await signaller.flush()
    assert sink.withdrawals == [], "the burst had a served request: its demand was real"
    await queues.close()
    await signaller.close()


@async_test
async def test_a_members_demand_annotation_goes_with_its_last_leaving_client(
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
        leaver = asyncio.create_task(p.chat("g"))
        await p.queued("g", 1)
        leaver.cancel()
        await p.queued("g", 0)
        await p.proxy.signaller.flush()
        assert p.sink.reports_for("g")[-1] is None
        assert p.sink.withdrawals == [], "a member's demand is its annotation alone"
        assert p.proxy.queues.estimate_wait("test/g") == 30.0, "no swap timed for nobody"


# -- histograms ------------------------------------------------------------------------


@async_test
async def test_queue_wait_and_time_to_first_byte_are_observed_per_model(
    backends: dict[str, BackendProcess],
) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint, ready=False)]) as p:
        waiting = asyncio.create_task(p.chat("a"))
        await p.queued("a", 1)
        p.directory.set_ready("a")
        assert (await waiting)[0] == 200
        assert (await p.chat("a"))[0] == 200
        labels = {"model": "test/a"}
        assert p.metric("flexinfer_proxy_time_to_first_byte_seconds_count", **labels) == 2
        assert p.metric("flexinfer_proxy_queue_wait_seconds_count", **labels) == 1
        bucket = {"model": "test/a", "le": "1800.0"}
        assert p.metric("flexinfer_proxy_time_to_first_byte_seconds_bucket", **bucket) == 2


@async_test
async def test_a_stream_whose_wait_ends_within_the_interval_gets_the_backends_head(
    backends: dict[str, BackendProcess],
) -> None:
    config = ProxyConfig(wait_comment_interval=60.0, swap_time_prior=30.0)
    waiting = entry("a", backends["alpha"].endpoint, ready=False)
    async with running_proxy([waiting], config=config) as p:

        async def stream() -> tuple[Any, bytes]:
            async with p.post("/v1/chat/completions", {"model": "a", "stream": True}) as response:
                return response.headers, await response.content.read()

        task = asyncio.create_task(stream())
        await p.queued("a", 1)
        p.directory.set_ready("a")
        headers, body = await task
        assert headers["X-Backend"] == "alpha", "the backend's own head"
        assert (headers[POSITION], headers[WAIT]) == ("1", "30.0")
        assert not body.startswith(b":") and body.endswith(b"data: [DONE]\n\n")


@async_test
async def test_retry_after_of_a_full_queue_comes_from_the_estimate(
    backends: dict[str, BackendProcess],
) -> None:
    config = ProxyConfig(max_queue=1, swap_time_prior=200.0)
    async with running_proxy(
        [entry("a", backends["alpha"].endpoint, ready=False)], config=config
    ) as p:
        first = asyncio.create_task(p.chat("a"))
        await p.queued("a", 1)
        status, headers, body = await _chat(p, "a")
        assert status == 503 and body["error"]["code"] == "queue_full"
        assert 200 <= int(headers["Retry-After"]) <= 400
        p.directory.set_ready("a")
        assert (await first)[0] == 200
