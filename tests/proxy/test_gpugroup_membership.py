"""A GPUGroup member that sets no `gpuGroupRef` is served: proxy, controller, real cluster.

The GPUGroup lists two ModelDeployments that do not name it. The proxy and the
controller both decide membership by the core's rule (the group that lists it), so
a request through the proxy process is queued and reported on the group, the
in-process controller renders each member and swaps it in (kwok runs its pod), and
the request is answered by that member's backend (an `--endpoint` of the proxy).
Before, the proxy looked only at `gpuGroupRef`: it took such a member for a
standalone ModelDeployment, the controller (for which it was a member) never scaled
it, and the request ended in a 503 after its queue wait.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_kube.resources import GPU_GROUPS, MODEL_DEPLOYMENTS

from ..k8s.harness import Cluster, PodTimeline, controller, on_kwok
from .harness import BackendProcess, async_test, eventually, proxy_process

pytestmark = pytest.mark.k8s

GROUP = "listed-only"
MEMBERS = ("listed-a", "listed-b")
# How long a request may wait in the proxy: far longer than a swap takes here, short
# enough that a member never swapped in fails the test with a 503, not a timeout.
QUEUE_WAIT_SECONDS = 20


def _create_group_and_members(c: Cluster) -> None:
    for name in MEMBERS:
        c.api.create(
            MODEL_DEPLOYMENTS,
            c.namespace,
            {
                "apiVersion": "ai.flexinfer/v1alpha1",
                "kind": "ModelDeployment",
                "metadata": {"name": name},
                # No gpuGroupRef: the GPUGroup below lists it, and that is enough.
                "spec": {
                    "backend": "vllm",
                    "model": f"test/{name}",
                    "idleTimeoutSeconds": 300,
                    "coldStartTimeoutSeconds": QUEUE_WAIT_SECONDS,
                    **on_kwok(),
                },
            },
        )
    c.api.create(GPU_GROUPS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
        "metadata": {"name": GROUP},
        "spec": {
            "models": [{"name": name, "priority": 100} for name in MEMBERS],
            "scalingPolicy": {"preemptionPolicy": "Graceful", "drainTimeoutSeconds": 60},
            # Swap on the first queued request, at once.
            "antiThrashing": {
                "enabled": True,
                "requestQueueThreshold": 1,
                "hysteresisWindowSeconds": 0,
                "minimumRunDurationSeconds": 0,
                "cooldownAfterPreemptionSeconds": 0,
            },
        },
    })  # fmt: skip


def _group_status(c: Cluster) -> dict[str, Any]:
    return dict(c.api.get(GPU_GROUPS, c.namespace, GROUP).get("status") or {})


@async_test
async def test_a_listed_member_without_gpu_group_ref_is_swapped_in_on_a_request(
    local_cluster: LocalCluster, namespace: str, backends: dict[str, BackendProcess]
) -> None:
    c = Cluster(local_cluster, namespace)
    await asyncio.to_thread(_create_group_and_members, c)
    timeline = PodTimeline(c)
    endpoints = {MEMBERS[0]: backends["alpha"].endpoint, MEMBERS[1]: backends["beta"].endpoint}
    with (
        controller(local_cluster, namespace),
        proxy_process(
            local_cluster.kubeconfig,
            namespace,
            endpoints=endpoints,
            min_queue_wait=f"{QUEUE_WAIT_SECONDS}s",
        ) as proxy,
    ):
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                async with session.get(f"{proxy}/readyz") as response:
                    return response.status == 200

            await eventually(ready, what="the proxy's initial lists", attempts=300, interval=0.2)

            async def ask(model: str) -> tuple[int, dict[str, Any]]:
                payload = {"model": model, "messages": [], "tag": model}
                async with session.post(f"{proxy}/v1/chat/completions", json=payload) as reply:
                    return reply.status, await reply.json()

            # Nothing runs yet: the request waits in the proxy's queue, the group starts
            # the member, and the request reaches its backend once its pod is ready.
            status, body = await ask(MEMBERS[0])
            assert status == 200, body
            assert (body["backend"], body["model"]) == ("alpha", MEMBERS[0])
            started = await asyncio.to_thread(_group_status, c)
            assert (started["activeModel"], started["swapCount"]) == (MEMBERS[0], 1)

            # The other member is asked for while the first holds the card: swapped in.
            status, body = await ask(MEMBERS[1])
            assert status == 200, body
            assert (body["backend"], body["model"]) == ("beta", MEMBERS[1])
            swapped = await asyncio.to_thread(_group_status, c)
            assert (swapped["activeModel"], swapped["swapCount"]) == (MEMBERS[1], 2)
            rows = {row["name"]: row for row in swapped["modelStatuses"]}
            assert rows[MEMBERS[0]]["preemptedBy"] == MEMBERS[1]
            assert await asyncio.to_thread(c.replicas, MEMBERS[0]) == 0
    timeline.stop()
    assert timeline.created_apps()[:2] == list(MEMBERS)
    assert timeline.violations == []
