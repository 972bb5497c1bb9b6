"""`python -m flexinfer_proxy` end to end: real control plane, real backend, real HTTP.

A request for a Model that is not Ready waits while the proxy records the demand in
the cluster; when the Model's phase turns Ready the request reaches the backend.
A GPUGroup member's queue shows up as its demand annotation and is cleared on drain.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from flexinfer_devcluster.localcluster import LocalCluster

from ..k8s.kubectl import Kubectl
from .harness import BackendProcess, async_test, eventually, proxy_process
from .test_kube import apply, model, model_deployment

pytestmark = pytest.mark.k8s


@pytest.fixture()
def proxy(
    local_cluster: LocalCluster, namespace: str, backends: dict[str, BackendProcess]
) -> Iterator[str]:
    endpoint = backends["alpha"].endpoint
    with proxy_process(
        local_cluster.kubeconfig,
        namespace,
        endpoints={"e2e-model": endpoint, "e2e-member": endpoint},
    ) as url:
        yield url


async def _until(probe: Any, *, what: str) -> Any:
    return await eventually(probe, what=what, attempts=300, interval=0.2)


def _get(kubectl: Kubectl, namespace: str, resource: str) -> dict[str, Any]:
    return kubectl.json("get", "-n", namespace, resource)


@async_test
async def test_a_queued_request_signals_demand_and_is_served_once_ready(
    kubectl: Kubectl, namespace: str, proxy: str
) -> None:
    await asyncio.to_thread(apply, kubectl, namespace, model("e2e-model"))
    async with aiohttp.ClientSession() as session:

        async def ready() -> bool:
            async with session.get(f"{proxy}/readyz") as response:
                return response.status == 200

        async def known() -> bool:
            async with session.get(f"{proxy}/v1/models") as response:
                ids = [m["id"] for m in (await response.json())["data"]]
                return "e2e-model" in ids

        await _until(ready, what="the proxy's initial lists")
        await _until(known, what="the proxy to see the Model")

        async def chat() -> tuple[int, dict[str, Any]]:
            payload = {"model": "e2e-model", "messages": [], "tag": "e2e"}
            async with session.post(f"{proxy}/v1/chat/completions", json=payload) as response:
                return response.status, await response.json()

        request = asyncio.create_task(chat())

        async def demanded() -> bool:
            obj = await asyncio.to_thread(_get, kubectl, namespace, "model/e2e-model")
            return bool((obj.get("status") or {}).get("lastActiveTime"))

        await _until(demanded, what="lastActiveTime on the Model")
        assert not request.done()

        await asyncio.to_thread(
            kubectl.patch_status, namespace, "model/e2e-model", {"status": {"phase": "Ready"}}
        )
        status, body = await request
        assert status == 200
        assert (body["backend"], body["model"]) == ("alpha", "e2e-model")

        async with session.get(f"{proxy}/metrics") as response:
            metrics = await response.text()
        served = f'flexinfer_proxy_requests_total{{model="{namespace}/e2e-model",outcome="served"}}'
        assert f"{served} 1.0" in metrics


@async_test
async def test_a_gpugroup_members_queue_is_reported_and_cleared(
    kubectl: Kubectl, namespace: str, proxy: str
) -> None:
    group = {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPUGroup",
        "metadata": {"name": "e2e-group"},
        "spec": {"models": [{"name": "e2e-member"}]},
    }
    await asyncio.to_thread(apply, kubectl, namespace, group)
    await asyncio.to_thread(
        apply, kubectl, namespace, model_deployment("e2e-member", gpuGroupRef="e2e-group")
    )
    key = "demand.ai.flexinfer/e2e-member"

    async def annotation() -> dict[str, Any] | None:
        obj = await asyncio.to_thread(_get, kubectl, namespace, "gpugroup/e2e-group")
        value = (obj["metadata"].get("annotations") or {}).get(key)
        return json.loads(value) if value else None

    async with aiohttp.ClientSession() as session:

        async def known() -> bool:
            async with session.get(f"{proxy}/v1/models") as response:
                return "e2e-member" in [m["id"] for m in (await response.json())["data"]]

        await _until(known, what="the proxy to see the ModelDeployment")
        payload = {"model": "e2e-member", "tag": "member"}
        request = asyncio.create_task(session.post(f"{proxy}/v1/completions", json=payload))
        report = await _until(annotation, what="the member's demand annotation")
        assert report["queued"] == 1
        assert {"oldestWaiting", "reportedAt"} <= set(report)

        await asyncio.to_thread(
            kubectl.patch_status,
            namespace,
            "modeldeployment/e2e-member",
            {"status": {"readyReplicas": 1}},
        )
        response = await request
        assert response.status == 200
        assert (await response.json())["model"] == "e2e-member"
        response.release()

        async def cleared() -> bool:
            return await annotation() is None

        await _until(cleared, what="the annotation to be removed")
