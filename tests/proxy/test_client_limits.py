"""Per-client limits over real HTTP: requests in progress and requests queued, per API
key, or per address when keys are off (`--max-concurrent-per-client`,
`--max-queued-per-client`)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from flexinfer_proxy.api_keys import ApiKeys
from flexinfer_proxy.app import ProxyConfig

from .harness import BackendProcess, RunningProxy, async_test, entry, running_proxy


def _tag() -> str:
    return uuid.uuid4().hex[:8]


@contextlib.asynccontextmanager
async def _session_from(address: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A client on another loopback address: to the proxy, another client."""
    connector = aiohttp.TCPConnector(local_addr=(address, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def _chat(
    session: aiohttp.ClientSession, p: RunningProxy, model: str, **headers: str
) -> tuple[int, dict[str, Any], Mapping[str, str]]:
    payload = {"model": model, "tag": _tag()}
    async with session.post(f"{p.url}/v1/chat/completions", json=payload, headers=headers) as r:
        return r.status, await r.json(), r.headers


@async_test
async def test_one_address_has_at_most_its_share_of_requests_in_progress(
    backends: dict[str, BackendProcess],
) -> None:
    alpha = backends["alpha"]
    config = ProxyConfig(max_concurrent_per_client=2, max_queued_per_client=0)
    async with running_proxy([entry("m", alpha.endpoint)], config=config) as p:
        held: list[tuple[str, aiohttp.ClientResponse]] = []
        for _ in range(2):
            tag = _tag()
            payload = {"model": "m", "stream": True, "hold": True, "tag": tag}
            response = await p.session.post(f"{p.url}/v1/chat/completions", json=payload)
            await response.content.readuntil(b"\n\n")  # relayed, and held by the backend
            held.append((tag, response))

        status, body, headers = await _chat(p.session, p, "m")
        assert (status, body["error"]["code"]) == (429, "client_concurrency_limit")
        assert "--max-concurrent-per-client" in body["error"]["message"]
        assert int(headers["Retry-After"]) >= 10
        outcome = {"model": "", "outcome": "client_concurrency_limit"}
        assert p.metric("flexinfer_proxy_requests_total", **outcome) == 1

        async with _session_from("127.0.0.2") as other:
            assert (await _chat(other, p, "m"))[0] == 200, "another address is not limited"

        for tag, response in held:
            await alpha.release(p.session, tag)
            await response.read()
            response.release()
        assert (await _chat(p.session, p, "m"))[0] == 200, "the share is given back"
        assert p.proxy.limits.active("127.0.0.1") == 0


@async_test
async def test_one_key_has_at_most_its_share_of_queued_requests(
    backends: dict[str, BackendProcess],
) -> None:
    keys = ApiKeys.from_entries({"one": "k-one", "two": "k-two"})
    config = ProxyConfig(max_queued_per_client=1, max_concurrent_per_client=0)
    parked = entry("m", backends["alpha"].endpoint, ready=False)
    async with running_proxy([parked], config=config, api_keys=keys) as p:
        one, two = "Bearer k-one", "Bearer k-two"
        first = asyncio.create_task(_chat(p.session, p, "m", Authorization=one))
        await p.queued("m", 1)

        status, body, headers = await _chat(p.session, p, "m", Authorization=one)
        assert (status, body["error"]["code"]) == (429, "client_queue_limit")
        assert "--max-queued-per-client" in body["error"]["message"]
        assert "Retry-After" in headers
        outcome = {"model": "test/m", "outcome": "client_queue_limit"}
        assert p.metric("flexinfer_proxy_requests_total", **outcome) == 1

        second = asyncio.create_task(_chat(p.session, p, "m", Authorization=two))
        await p.queued("m", 2)  # the same address, another key: its own share

        p.directory.set_ready("m")
        assert [(await task)[0] for task in (first, second)] == [200, 200]
        assert p.proxy.limits.queued("key one") == 0
