"""A scenario played two ways gives the same swaps: `flexinfer_core.simulate`, and the
local cluster with the controller, the real proxy and clients that ask again after a 503.

`examples/scenarios/waiting-request.yaml` (in seconds, so a replay takes about a
minute) is simulated, then replayed: its Models on kwok nodes (ready after its
`loadTime`, gone `terminationTime` after deletion), the controller in-process with the
scenario's policy, the proxy in-process (`Proxy` over `KubeDirectory` and
`KubeDemandSink`, its queue wait and refresh interval from the scenario, each model's
endpoint a fake backend since kwok's pods serve nothing), and one client per request
at its offset, asking again `clients.retryAfter` after each 503 `model_not_ready`, at
most `clients.retries` times. The holders of the card, in order, must be the
simulator's, and each request must end the same way (served or given up). The
scenario keeps every decision seconds away from the next, so the cluster's latency
(a second or two on a loaded machine) cannot reorder them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer_cli.scenario import Scenario, load_scenario
from flexinfer_core import format_duration
from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_kube.kubeapi import KubeApi
from flexinfer_kube.resources import MODELS
from flexinfer_proxy.app import Proxy, ProxyConfig, serve
from flexinfer_proxy.kube_demand import KubeDemandSink
from flexinfer_proxy.kube_directory import KubeDirectory
from tests.k8s.harness import Cluster, controller, model_body
from tests.k8s.harness import cluster as cluster
from tests.k8s.harness import crds as crds
from tests.k8s.harness import kubectl as kubectl
from tests.proxy.harness import BackendProcess, eventually

pytestmark = pytest.mark.k8s

SCENARIO = Path(__file__).resolve().parents[2] / "examples/scenarios/waiting-request.yaml"


def test_the_simulator_and_the_cluster_swap_alike(
    local_cluster: LocalCluster, cluster: Cluster
) -> None:
    scenario = load_scenario(SCENARIO)
    timeline = scenario.simulate()
    simulated = [leader for _, leader in timeline.holders if leader is not None]
    simulated_served = [o.served_at is not None for o in timeline.requests]
    # The scenario is worth replaying: the card changes hands because chat kept asking
    # (chat first holds it with no pods, as nobody is asked for).
    assert simulated == ["chat", "coder", "chat"], simulated
    assert simulated_served == [True, True, True]

    for model in scenario.models:
        cluster.api.create(MODELS, cluster.namespace, _model_body(model.name, scenario))
    backends = {m.name: BackendProcess(m.name) for m in scenario.models}
    try:
        with controller(local_cluster, cluster.namespace, policy=scenario.policy):
            holders, served = asyncio.run(_replay(local_cluster, cluster, scenario, backends))
    finally:
        for backend in backends.values():
            backend.stop()
    assert holders == simulated, (holders, simulated)
    assert served == simulated_served, (served, simulated_served)


def _model_body(name: str, scenario: Scenario) -> dict[str, Any]:
    model = next(m for m in scenario.models if m.name == name)
    cooldown = model.swap_cooldown or scenario.policy.default_swap_cooldown
    body = model_body(
        name,
        group=model.group,
        priority=model.priority,
        swap_cooldown=format_duration(cooldown),
        idle_timeout=format_duration(model.serverless.idle_timeout),
        min_replicas=model.serverless.min_replicas,
        ready_delay=format_duration(scenario.load_time),
        terminate_delay=format_duration(scenario.termination_time),
    )
    body["spec"]["serverless"]["coldStartTimeout"] = format_duration(
        model.serverless.cold_start_timeout
    )
    return body


async def _replay(
    local: LocalCluster,
    cluster: Cluster,
    scenario: Scenario,
    backends: dict[str, BackendProcess],
) -> tuple[list[str], list[bool]]:
    """Play the scenario's requests in real time; the holders seen, and what each
    request came to (served, or given up after its last retry)."""
    holders: list[str] = []
    async with _proxy(local, cluster.namespace, scenario, backends) as url:
        watcher = asyncio.create_task(_watch_holders(cluster, holders))
        start = time.monotonic()
        async with aiohttp.ClientSession() as session:
            served = await asyncio.gather(
                *(
                    _client(
                        session,
                        url,
                        request.model,
                        start + _seconds(request.at - scenario.start),
                        scenario=scenario,
                    )
                    for request in scenario.requests
                )
            )
            # The rest of the run: the card must stay where the simulator left it.
            await _sleep_until(start + _seconds(scenario.until - scenario.start))
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return holders, list(served)


@contextlib.asynccontextmanager
async def _proxy(
    local: LocalCluster, namespace: str, scenario: Scenario, backends: dict[str, BackendProcess]
) -> AsyncIterator[str]:
    api = KubeApi(local.new_api_client())
    directory = KubeDirectory(
        api,
        namespaces=[namespace],
        endpoint_overrides={name: b.endpoint for name, b in backends.items()},
    )
    proxy = Proxy(
        directory,
        KubeDemandSink(api),
        config=ProxyConfig(
            min_queue_wait=scenario.proxy.min_queue_wait,
            refresh_interval=scenario.proxy.refresh_interval,
        ),
    )
    runner, port = await serve(proxy, host="127.0.0.1", port=0)
    try:
        # The replay starts once the proxy knows every model (and the controller has
        # written each one's status: the group is parked, nobody holds the card).
        keys = [f"{namespace}/{m.name}" for m in scenario.models]
        await eventually(
            lambda: directory.synced
            and all((e := directory.lookup(k)) is not None and e.phase for k in keys),
            what="the proxy to list every model with its status",
            attempts=600,
            interval=0.1,
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _client(
    session: aiohttp.ClientSession, url: str, model: str, at: float, *, scenario: Scenario
) -> bool:
    """One client's request: sent at `at`, asked again after each 503 `model_not_ready`."""
    await _sleep_until(at)
    for attempt in range(scenario.clients.retries + 1):
        async with session.post(
            f"{url}/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        ) as response:
            body = await response.json()
            if response.status == 200:
                return True
            assert response.status == 503, (response.status, body)
            assert body["error"]["code"] == "model_not_ready", body
            assert int(response.headers["Retry-After"]) >= 1
        if attempt < scenario.clients.retries:
            await asyncio.sleep(_seconds(scenario.clients.retry_after))
    return False


async def _watch_holders(cluster: Cluster, holders: list[str]) -> None:
    """Record each new Active member of the group, as the controller writes it. A swap
    writes two statuses one after the other: a listing between them (two Active, or
    none) is not a holder."""
    while True:
        items = await asyncio.to_thread(cluster.api.list, MODELS, cluster.namespace)
        active = [
            item["metadata"]["name"]
            for item in items.get("items") or []
            if ((item.get("status") or {}).get("sharedGroup") or {}).get("state") == "Active"
        ]
        if len(active) == 1 and (not holders or holders[-1] != active[0]):
            holders.append(active[0])
        await asyncio.sleep(0.2)


async def _sleep_until(at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))


def _seconds(delta: timedelta) -> float:
    return delta.total_seconds()
