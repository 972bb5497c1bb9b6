"""Routing, streaming and error answers over real HTTP, proxy ↔ backend processes."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from flexinfer_proxy.api_keys import ApiKeys
from flexinfer_proxy.app import Proxy, serve
from flexinfer_proxy.directory import InMemoryDirectory

from .harness import BackendProcess, RecordingSink, async_test, entry, running_proxy


def _tag() -> str:
    return uuid.uuid4().hex[:8]


@async_test
async def test_requests_go_to_the_backend_of_the_named_model(
    backends: dict[str, BackendProcess],
) -> None:
    alpha, beta = backends["alpha"], backends["beta"]
    async with running_proxy([entry("a", alpha.endpoint), entry("b", beta.endpoint)]) as p:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            for model, backend in (("a", "alpha"), ("b", "beta")):
                async with p.post(path, {"model": model, "tag": _tag()}) as response:
                    body = await response.json()
                    assert response.status == 200
                    assert response.headers["X-Backend"] == backend
                    assert (body["backend"], body["path"], body["model"]) == (
                        backend,
                        path,
                        model,
                    )


@async_test
async def test_status_headers_and_query_pass_through(backends: dict[str, BackendProcess]) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint)]) as p:
        async with p.session.post(
            f"{p.url}/v1/completions?api-version=2",
            json={"model": "a", "status": 418, "tag": _tag()},
            headers={"OpenAI-Organization": "org-1", "X-Trace": "t-1"},
        ) as response:
            body = await response.json()
        assert response.status == 418
        assert body["query"] == "api-version=2"
        assert (body["headers"]["OpenAI-Organization"], body["headers"]["X-Trace"]) == (
            "org-1",
            "t-1",
        )


CREDENTIALS = {
    "Authorization": "Bearer secret-token",
    "Proxy-Authorization": "Basic c2VjcmV0",
    "X-Api-Key": "secret-key",
    "Api-Key": "secret-azure-key",
    "Cookie": "session=secret",
}
FORGED = {
    "X-Forwarded-For": "203.0.113.9",
    "Forwarded": "for=203.0.113.9;proto=https",
    "X-Forwarded-Host": "admin.example",
    "X-Forwarded-Proto": "https",
    "X-Real-IP": "203.0.113.9",
}


@async_test
async def test_credentials_and_forged_forwarding_headers_never_reach_a_backend(
    backends: dict[str, BackendProcess],
) -> None:
    """Keys off: what a client authenticates with is not another tenant's to read, and
    the address a backend is told is the one the proxy saw (issue 20)."""
    headers = {**CREDENTIALS, **FORGED, "X-Trace": "t-1"}
    async with running_proxy([entry("a", backends["alpha"].endpoint)]) as p:
        payload = {"model": "a", "tag": _tag()}
        async with p.post("/v1/chat/completions", payload, headers=headers) as response:
            assert response.status == 200
            echoed = (await response.json())["headers"]
    seen = {name.lower(): value for name, value in echoed.items()}
    assert seen["x-trace"] == "t-1"
    leaked = {name for name in CREDENTIALS if name.lower() in seen}
    assert not leaked, f"credentials forwarded: {leaked}"
    assert seen["x-forwarded-for"] == "127.0.0.1", "replaced, not appended to"
    kept = {name for name in FORGED if name.lower() in seen and name != "X-Forwarded-For"}
    assert not kept, f"forwarding headers taken from the client: {kept}"


@async_test
async def test_a_stream_is_relayed_chunk_by_chunk(backends: dict[str, BackendProcess]) -> None:
    alpha = backends["alpha"]
    tag = _tag()
    async with running_proxy([entry("a", alpha.endpoint)]) as p:
        payload = {"model": "a", "stream": True, "hold": True, "tag": tag}
        async with p.post("/v1/chat/completions", payload) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            # The backend holds everything after its first event until released: the
            # first event can only reach us here if the proxy does not buffer.
            first = await response.content.readuntil(b"\n\n")
            assert json.loads(first.removeprefix(b"data: "))["index"] == 0
            await alpha.release(p.session, tag)
            rest = (await response.content.read()).decode()
        events = [e for e in rest.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert [json.loads(e.removeprefix("data: "))["index"] for e in events[:-1]] == [1, 2]


@async_test
async def test_unknown_model_is_a_404_naming_it(backends: dict[str, BackendProcess]) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint)]) as p:
        status, body = await p.chat("no-such-model")
        assert status == 404
        assert body["error"]["code"] == "model_not_found"
        assert body["error"]["param"] == "model"
        assert "'no-such-model'" in body["error"]["message"]
        assert p.metric("flexinfer_proxy_requests_total", model="", outcome="unknown_model") == 1


@async_test
async def test_other_routes_are_openai_shaped_404s(backends: dict[str, BackendProcess]) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint)]) as p:
        for method, path in (("POST", "/v1/images/generations"), ("GET", "/v1/chat/completions")):
            async with p.session.request(method, f"{p.url}{path}") as response:
                body = await response.json()
            assert response.status == 404
            assert body["error"]["code"] == "unsupported_route"
            assert path in body["error"]["message"]


@async_test
async def test_bad_json_and_missing_model_are_400s(backends: dict[str, BackendProcess]) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint)]) as p:
        async with p.session.post(
            f"{p.url}/v1/chat/completions",
            data=b"{not json",
            headers={"Content-Type": "application/json"},
        ) as response:
            body = await response.json()
        assert response.status == 400
        assert "not valid JSON" in body["error"]["message"]

        async with p.post("/v1/chat/completions", {"messages": []}) as response:
            body = await response.json()
        assert response.status == 400
        assert body["error"]["param"] == "model"
        assert "'model'" in body["error"]["message"]

        async with p.post("/v1/embeddings", {"model": 7}) as response:
            assert response.status == 400
            assert (await response.json())["error"]["param"] == "model"


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@async_test
async def test_an_unreachable_backend_is_a_502() -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}/v1"
    async with running_proxy([entry("down", endpoint)]) as p:
        status, body = await p.chat("down")
        assert status == 502
        assert body["error"]["code"] == "backend_unavailable"
        assert "'down'" in body["error"]["message"]
        assert (
            p.metric(
                "flexinfer_proxy_requests_total", model="test/down", outcome="backend_unavailable"
            )
            == 1
        )


@async_test
async def test_models_health_readiness_and_metrics_over_http(
    backends: dict[str, BackendProcess],
) -> None:
    entries = [entry("a", backends["alpha"].endpoint), entry("b", "http://x/v1", ready=False)]
    async with running_proxy(entries) as p:
        async with p.session.get(f"{p.url}/v1/models") as response:
            listing = await response.json()
        assert listing["object"] == "list"
        assert [(m["id"], m["object"]) for m in listing["data"]] == [
            ("a", "model"),
            ("b", "model"),
        ]
        assert [m["flexinfer"]["ready"] for m in listing["data"]] == [True, False]
        for path in ("/healthz", "/readyz"):
            async with p.session.get(f"{p.url}{path}") as response:
                assert response.status == 200

        await p.chat("a", tag=_tag())
        await p.proxy.signaller.flush()
        async with p.session.get(f"{p.url}/metrics") as response:
            text = await response.text()
        assert 'flexinfer_proxy_requests_total{model="test/a",outcome="served"} 1.0' in text
        assert "flexinfer_proxy_queued_requests" in text
        assert "flexinfer_proxy_queue_wait_seconds" in text
        written = 'model="test/a",result="written",signal="served"'
        assert f"flexinfer_proxy_demand_writes_total{{{written}}} 1.0" in text


class _Syncing(InMemoryDirectory):
    @property
    def synced(self) -> bool:
        return False


@async_test
async def test_before_the_first_list_an_unknown_model_is_a_503_not_a_404() -> None:
    proxy = Proxy(_Syncing(), RecordingSink(), registry=CollectorRegistry())
    runner, port = await serve(proxy, host="127.0.0.1", port=0)
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}"
            async with session.post(f"{url}/v1/chat/completions", json={"model": "m"}) as answer:
                body = await answer.json()
                assert answer.status == 503
                assert 10 <= int(answer.headers["Retry-After"]) <= 20
                assert body["error"]["code"] == "proxy_starting"
            async with session.get(f"{url}/readyz") as answer:
                assert answer.status == 503
    finally:
        await runner.cleanup()


@async_test
async def test_the_served_name_is_sent_to_the_backend_and_given_back(
    backends: dict[str, BackendProcess],
) -> None:
    served = entry("m", backends["alpha"].endpoint, served_name="org/m-7b-instruct")
    async with running_proxy([served]) as p:
        status, body = await p.chat("m", tag=_tag())
        assert status == 200
        assert body["received_model"] == "org/m-7b-instruct"
        assert body["model"] == "m", "the answer names the model the client asked for"
        # Streamed answers are relayed untouched: their chunks carry the served name.
        payload = {"model": "m", "stream": True, "tag": _tag()}
        async with p.post("/v1/chat/completions", payload) as response:
            first = await response.content.readuntil(b"\n\n")
            await response.read()
        assert json.loads(first.removeprefix(b"data: "))["model"] == "org/m-7b-instruct"


@async_test
async def test_a_service_label_reaches_the_member_holding_the_card(
    backends: dict[str, BackendProcess],
) -> None:
    holder = entry("m1", backends["alpha"].endpoint, service_labels=("chat",),
                   active_services=("chat",))  # fmt: skip
    other = entry("m2", backends["beta"].endpoint, service_labels=("chat",), priority=900)
    async with running_proxy([holder, other]) as p:
        status, body = await p.chat("chat", tag=_tag())
        assert status == 200
        assert (body["backend"], body["received_model"], body["model"]) == ("alpha", "m1", "chat")


@async_test
async def test_a_service_label_wakes_a_parked_member(backends: dict[str, BackendProcess]) -> None:
    parked = entry("m1", backends["alpha"].endpoint, ready=False, service_labels=("code",))
    async with running_proxy([parked]) as p:
        request = asyncio.create_task(p.chat("code", tag=_tag()))
        await p.queued("m1", 1)
        await p.proxy.signaller.flush()
        assert p.sink.marks_for("m1") == [p.clock.now()], "demand for the member, not the label"
        p.directory.set_ready("m1")
        status, body = await request
        assert (status, body["received_model"]) == (200, "m1")


@async_test
async def test_a_name_in_two_namespaces_needs_its_namespace(
    backends: dict[str, BackendProcess],
) -> None:
    twins = [
        entry("x", backends["alpha"].endpoint, namespace="team-a"),
        entry("x", backends["beta"].endpoint, namespace="team-b"),
    ]
    async with running_proxy(twins) as p:
        status, body = await p.chat("x")
        assert status == 409
        assert (body["error"]["code"], body["error"]["param"]) == ("ambiguous_model", "model")
        assert "'team-a/x'" in body["error"]["message"]
        assert "'team-b/x'" in body["error"]["message"]
        status, body = await p.chat("team-b/x", tag=_tag())
        assert (status, body["backend"], body["received_model"]) == (200, "beta", "x")
        assert p.metric("flexinfer_proxy_requests_total", model="", outcome="ambiguous_model") == 1


@async_test
async def test_a_tenant_cannot_capture_a_service_label_with_a_model_name(
    backends: dict[str, BackendProcess],
) -> None:
    """team-evil's Model `chat` against team-b's members labelled `chat` (issue 20)."""
    alpha, beta = backends["alpha"], backends["beta"]
    labelled = ("chat",)
    entries = [
        entry("small", beta.endpoint, namespace="team-b", service_labels=labelled,
              active_services=labelled),
        entry("chat", alpha.endpoint, namespace="team-evil"),
    ]  # fmt: skip
    tag = _tag()
    async with running_proxy(entries) as p:
        status, body = await p.chat("chat", tag=tag)
        assert status == 409
        assert (body["error"]["code"], body["error"]["param"]) == ("ambiguous_model", "model")
        assert "'team-b/chat'" in body["error"]["message"]
        assert "'team-evil/chat'" in body["error"]["message"]
        assert tag not in await alpha.arrivals(p.session), "nothing reached team-evil"
        status, body = await p.chat("team-b/chat", tag=_tag())
        assert (status, body["backend"], body["received_model"]) == (200, "beta", "small")


@async_test
async def test_models_lists_what_can_be_routed_with_its_state(
    backends: dict[str, BackendProcess],
) -> None:
    alpha = backends["alpha"].endpoint
    entries = [
        entry("ready", alpha),
        entry("parked", alpha, ready=False),
        entry("queued", alpha, ready=False),
        entry("twin", alpha, namespace="team-a"),
        entry("twin", alpha, namespace="team-b", service_labels=("chat",)),
    ]
    async with running_proxy(entries) as p:
        waiting = asyncio.create_task(p.chat("queued"))
        await p.queued("queued", 1)
        async with p.session.get(f"{p.url}/v1/models") as response:
            listing = await response.json()
        waiting.cancel()
    cards = {card["id"]: card["flexinfer"] for card in listing["data"]}
    assert {name: card["state"] for name, card in cards.items()} == {
        "parked": "parked",
        "queued": "queued",
        "ready": "ready",
        "team-a/twin": "ready",
        "team-b/twin": "ready",
    }
    assert cards["team-b/twin"]["serviceLabels"] == ["chat"]


@async_test
async def test_api_keys_let_in_only_their_bearers(backends: dict[str, BackendProcess]) -> None:
    keys = ApiKeys.from_entries({"one": "key-one", "two": "key-two namespaces=*"})
    async with running_proxy([entry("a", backends["alpha"].endpoint)], api_keys=keys) as p:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "key-one"}):
            async with p.post("/v1/chat/completions", {"model": "a"}, headers=headers) as answer:
                body = await answer.json()
                assert answer.status == 401, headers
                assert answer.headers["WWW-Authenticate"] == "Bearer"
                assert body["error"]["code"] == "invalid_api_key"
        for key in ("key-one", "key-two"):
            good = {"Authorization": f"Bearer {key}"}
            async with p.post("/v1/chat/completions", {"model": "a"}, headers=good) as answer:
                assert answer.status == 200
                assert (await answer.json())["authorization"] is None, "the key stays with us"
        async with p.session.get(f"{p.url}/v1/models") as answer:
            assert answer.status == 401
        async with p.session.get(f"{p.url}/healthz") as answer:
            assert answer.status == 200
        assert p.metric("flexinfer_proxy_requests_total", model="", outcome="unauthorized") == 4


@async_test
async def test_a_key_reaches_only_its_namespaces_models(
    backends: dict[str, BackendProcess],
) -> None:
    """A key scoped to team-b neither reaches nor sees team-evil's models, and a name
    that would be ambiguous for an unscoped key is team-b's for it (issue 20)."""
    alpha, beta = backends["alpha"], backends["beta"]
    labelled = ("chat",)
    entries = [
        entry("small", beta.endpoint, namespace="team-b", service_labels=labelled,
              active_services=labelled),
        entry("chat", alpha.endpoint, namespace="team-evil"),
        entry("solo", alpha.endpoint, namespace="team-evil"),
    ]  # fmt: skip
    keys = ApiKeys.from_entries({"admin": "k-admin", "b": "k-b namespaces=team-b,team-c"})
    team_b = {"Authorization": "Bearer k-b"}
    admin = {"Authorization": "Bearer k-admin"}
    async with running_proxy(entries, api_keys=keys) as p:

        async def chat(model: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
            payload = {"model": model, "tag": _tag()}
            async with p.post("/v1/chat/completions", payload, headers=headers) as answer:
                return answer.status, await answer.json()

        status, body = await chat("chat", team_b)
        assert (status, body["backend"], body["received_model"]) == (200, "beta", "small")
        for name in ("team-evil/chat", "solo", "team-evil/solo"):
            status, body = await chat(name, team_b)
            assert (status, body["error"]["code"]) == (404, "model_not_found"), name
        async with p.session.get(f"{p.url}/v1/models", headers=team_b) as answer:
            assert [m["id"] for m in (await answer.json())["data"]] == ["small"]
        assert (await chat("chat", admin))[0] == 409, "the admin's key reaches both"
        assert (await chat("team-evil/solo", admin))[0] == 200


@async_test
async def test_until_the_keys_are_read_requests_wait_and_readyz_says_so(
    backends: dict[str, BackendProcess],
) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint)], api_keys=ApiKeys()) as p:
        headers = {"Authorization": "Bearer anything"}
        async with p.post("/v1/chat/completions", {"model": "a"}, headers=headers) as answer:
            assert answer.status == 503
            assert "Retry-After" in answer.headers
        async with p.session.get(f"{p.url}/readyz") as answer:
            assert answer.status == 503


@async_test
async def test_metrics_can_have_a_port_of_their_own(backends: dict[str, BackendProcess]) -> None:
    async with running_proxy([entry("a", backends["alpha"].endpoint)], metrics_port=0) as p:
        async with p.session.get(f"{p.url}/metrics") as answer:
            assert answer.status == 404
            assert (await answer.json())["error"]["code"] == "not_found"
        assert p.proxy.metrics_port is not None
        async with p.session.get(f"http://127.0.0.1:{p.proxy.metrics_port}/metrics") as answer:
            assert answer.status == 200
            assert "flexinfer_proxy_requests_total" in await answer.text()
