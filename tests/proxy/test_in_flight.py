"""Requests in flight, over real HTTP (docs/election.md 1.6).

The proxy counts a request in flight from the moment it sends it to the backend until
its answer (a stream included) has ended, and reports each Model's count through one
coalesced, rate-limited writer; a drop to 0 is written at once. A Model whose phase is
`Draining` takes no new requests (they wait in its queue and signal demand, as for any
model that is not Ready) while the streams it has run to their end.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import attrs

from flexinfer_proxy.app import ProxyConfig

from .harness import BackendProcess, RecordingSink, async_test, entry, eventually, running_proxy


def _held(model: str) -> tuple[str, dict[str, object]]:
    tag = uuid.uuid4().hex
    return tag, {"model": model, "stream": True, "hold": True, "tag": tag}


@async_test
async def test_requests_in_flight_are_counted_and_reported_coalesced() -> None:
    backend = BackendProcess("counted")
    gate = asyncio.Event()
    sink = RecordingSink(in_flight_gate=gate)
    config = ProxyConfig(in_flight_interval=timedelta(milliseconds=100))
    try:
        async with running_proxy([entry("m", backend.endpoint)], sink=sink, config=config) as p:
            streams = []
            tags = []
            for _ in range(3):
                tag, payload = _held("m")
                response = await p.post("/v1/chat/completions", payload).__aenter__()
                await response.content.readuntil(b"\n\n")  # its first event: in flight
                streams.append(response)
                tags.append(tag)
            assert p.proxy.in_flight.count(p.directory.lookup("test/m")) == 3  # type: ignore[arg-type]
            # The first write (1) is still in flight at the API server: the counts
            # after it coalesce, and the latest wins (3, never 2).
            assert sink.in_flight_for("m") == [1]
            gate.set()
            await eventually(lambda: sink.in_flight_for("m") == [1, 3], what="3 reported")
            for tag, response in zip(tags, streams, strict=True):
                await backend.release(p.session, tag)
                rest = await response.content.read()
                assert rest.endswith(b"data: [DONE]\n\n")
                response.release()
            await eventually(lambda: sink.in_flight_for("m")[-1:] == [0], what="0 reported")
            assert 0 not in sink.in_flight_for("m")[:-1]
    finally:
        backend.stop()


@async_test
async def test_a_change_to_or_from_zero_is_written_at_once_whatever_the_interval() -> None:
    backend = BackendProcess("dropped")
    gate = asyncio.Event()
    gate.set()
    sink = RecordingSink(in_flight_gate=gate)
    # Longer than the test may take: a write held back by it could never arrive in time.
    config = ProxyConfig(in_flight_interval=timedelta(seconds=30))
    try:
        async with running_proxy([entry("m", backend.endpoint)], sink=sink, config=config) as p:
            tag, payload = _held("m")
            async with p.post("/v1/chat/completions", payload) as stream:
                await stream.content.readuntil(b"\n\n")
                await eventually(lambda: sink.in_flight_for("m") == [1], what="1 reported")
                gate.clear()  # the API server is slow: the next write (0) hangs
                await backend.release(p.session, tag)
                await stream.content.read()
            await eventually(lambda: sink.in_flight_for("m") == [1, 0], what="0 sent")
            # A new request while that 0 is being written: right after it, 1 goes out,
            # well inside the 30 s interval.
            tag, payload = _held("m")
            async with p.post("/v1/chat/completions", payload) as stream:
                await stream.content.readuntil(b"\n\n")
                gate.set()
                await eventually(lambda: sink.in_flight_for("m") == [1, 0, 1], what="1 again")
                await backend.release(p.session, tag)
                await stream.content.read()
            await eventually(lambda: sink.in_flight_for("m") == [1, 0, 1, 0], what="0 again")
    finally:
        backend.stop()


@async_test
async def test_a_draining_model_holds_new_requests_while_its_stream_runs_to_the_end() -> None:
    backend = BackendProcess("draining-model")
    try:
        async with running_proxy([entry("m", backend.endpoint)]) as p:
            tag, payload = _held("m")
            async with p.post("/v1/chat/completions", payload) as stream:
                first = await stream.content.readuntil(b"\n\n")
                assert json.loads(first.removeprefix(b"data: "))["index"] == 0
                # The controller says the model drains: it has lost the card.
                drained = attrs.evolve(p.directory.lookup("test/m"), ready=False, phase="Draining")
                p.directory.put(drained)  # type: ignore[arg-type]
                marks_before = len(p.sink.marks_for("m"))
                waiting = asyncio.create_task(p.chat("m", tag=uuid.uuid4().hex))
                await p.queued("m", 1)  # held, not sent to the draining server
                assert len(p.sink.marks_for("m")) > marks_before  # and it signals demand
                assert len(await backend.arrivals(p.session)) == 1
                # The stream in flight continues to its end.
                await backend.release(p.session, tag)
                rest = await stream.content.read()
            events = [e for e in rest.decode().split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            assert not waiting.done()
            # Once a model is Ready again (here the same one), the held request is served.
            p.directory.set_ready("m", True)
            status, body = await waiting
            assert status == 200, body
            assert len(await backend.arrivals(p.session)) == 2
    finally:
        backend.stop()
