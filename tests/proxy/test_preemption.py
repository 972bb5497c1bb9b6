"""In-flight streams of a model that is preempted: they finish, or end with an error event.

When the controller preempts a model it scales its Deployment to 0; the kubelet
sends SIGTERM to the serving pod and SIGKILL after its grace period. A server that
drains on SIGTERM (as the fake backend does, like uvicorn-based vLLM) lets a stream
in progress finish, and the proxy relays it to the end although the model is no
longer Ready. A server killed mid-answer ends the client's stream with a final
`data: {"error": ...}` event (which OpenAI clients raise) and no `[DONE]`.
"""

from __future__ import annotations

import json
import signal
import uuid

import aiohttp

from .harness import BackendProcess, async_test, entry, running_proxy


def _events(raw: bytes) -> list[str]:
    return [event for event in raw.decode().split("\n\n") if event]


@async_test
async def test_a_stream_in_progress_finishes_when_its_backend_drains_on_sigterm() -> None:
    backend = BackendProcess("draining")
    try:
        async with running_proxy([entry("m", backend.endpoint)]) as p:
            payload = {"model": "m", "stream": True, "pause": 1.0, "tag": uuid.uuid4().hex}
            async with p.post("/v1/chat/completions", payload) as response:
                first = await response.content.readuntil(b"\n\n")
                assert json.loads(first.removeprefix(b"data: "))["index"] == 0
                p.directory.set_ready("m", False)  # preempted: the model is parked
                backend.signal(signal.SIGTERM)  # the kubelet stops its pod
                rest = await response.content.read()
        events = _events(rest)
        assert events[-1] == "data: [DONE]"
        assert [json.loads(e.removeprefix("data: "))["index"] for e in events[:-1]] == [1, 2]
        assert p.metric("flexinfer_proxy_requests_total", model="test/m", outcome="served") == 1
    finally:
        backend.stop()


@async_test
async def test_a_stream_whose_backend_is_killed_ends_with_an_error_event() -> None:
    backend = BackendProcess("killed")
    try:
        async with running_proxy([entry("m", backend.endpoint)]) as p:
            payload = {"model": "m", "stream": True, "hold": True, "tag": uuid.uuid4().hex}
            async with p.post("/v1/chat/completions", payload) as response:
                received = await response.content.readuntil(b"\n\n")
                p.directory.set_ready("m", False)
                backend.signal(signal.SIGKILL)  # the grace period ran out
                try:
                    async for chunk in response.content.iter_any():
                        received += chunk
                except aiohttp.ClientPayloadError:
                    pass  # and then the stream is cut: no clean end either
        events = _events(received)
        assert json.loads(events[0].removeprefix("data: "))["index"] == 0
        error = json.loads(events[-1].removeprefix("data: "))["error"]
        assert (error["code"], error["type"]) == ("stream_cut", "server_error")
        assert "data: [DONE]" not in events
        assert p.metric("flexinfer_proxy_requests_total", model="test/m", outcome="stream_cut") == 1
    finally:
        backend.stop()
