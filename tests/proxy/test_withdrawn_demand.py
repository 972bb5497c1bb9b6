"""A load nobody waits for any more stops: proxy process, controller, real cluster.

A Model's pod (run by kwok) takes ten minutes to become Ready, a load far longer
than the test. A request through the proxy process queues and writes the Model's
demand; the controller scales it up and its pod starts loading. The client then
goes away: the proxy puts `lastActiveTime` back to what it was (absent here), and
the controller, reading no demand for the loading model, scales it back to 0
(docs/election.md 1.3, 1.4). Before, the load went on for nobody: the proxy's demand
stood for the demand window, and a Loading leader was kept at one replica whatever
its demand.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from flexinfer_devcluster.localcluster import LocalCluster

from ..k8s.harness import Cluster, controller
from .harness import BackendProcess, async_test, eventually, proxy_process

pytestmark = pytest.mark.k8s


@async_test
async def test_a_load_whose_every_waiting_client_left_is_stopped(
    local_cluster: LocalCluster, namespace: str, backends: dict[str, BackendProcess]
) -> None:
    c = Cluster(local_cluster, namespace)
    await asyncio.to_thread(c.add_model, "slow-load", group="withdrawn", ready_delay="10m")
    endpoints = {"slow-load": backends["alpha"].endpoint}
    with (
        controller(local_cluster, namespace),
        proxy_process(local_cluster.kubeconfig, namespace, endpoints=endpoints) as proxy,
    ):
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                async with session.get(f"{proxy}/readyz") as response:
                    return response.status == 200

            await eventually(ready, what="the proxy's initial lists", attempts=300, interval=0.2)

            async def ask() -> None:
                payload = {"model": "slow-load", "messages": []}
                async with session.post(f"{proxy}/v1/chat/completions", json=payload) as reply:
                    await reply.read()

            waiting = asyncio.create_task(ask())

            def loading() -> bool:
                status = c.status("slow-load")
                return c.replicas("slow-load") == 1 and status.get("phase") == "Loading"

            await eventually(
                lambda: asyncio.to_thread(loading),
                what="the model's load to start",
                attempts=300,
                interval=0.2,
            )
            assert c.status("slow-load").get("lastActiveTime")

            waiting.cancel()  # the client goes away
            with contextlib.suppress(asyncio.CancelledError):
                await waiting

            def stopped() -> bool:
                status = c.status("slow-load")
                return c.replicas("slow-load") == 0 and "lastActiveTime" not in status

            await eventually(
                lambda: asyncio.to_thread(stopped),
                what="the demand withdrawn and the load stopped",
                attempts=300,
                interval=0.2,
            )
