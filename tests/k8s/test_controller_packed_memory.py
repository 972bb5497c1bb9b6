"""A packed group on the local cluster: three Models share one card through the group's
ResourceClaim (the fake DRA driver's devices, allocated by the real scheduler), and a
pod watch checks break-before-make by memory (docs/election.md 1.7): the footprints of
the members with live pods never exceed the budget, at any moment.

The same scenario runs with the controller's two guards taken away one at a time: the
decision's memory gate (`flexinfer_core.packing.memory_gate`, read from the controller's
cache) and the last check before a scale-up on a live pod list (`write_plan.Interlock`).
Either one alone keeps the budget; with both gone the watch sees it exceeded, which shows
that the watch can fail.
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import timedelta
from typing import Any

import pytest

from flexinfer_core.snapshot import ModelState
from flexinfer_devcluster import gpudriver
from flexinfer_devcluster.policy import dev_policy
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_k8s.write_plan import Interlock
from flexinfer_kube.resources import RESOURCE_CLAIMS
from tests.polling import wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    MemoryTimeline,
    cluster,
    controller,
    crds,
    kubectl,
)

pytestmark = pytest.mark.k8s

SHARED_CARD = RenderSettings(policy=dev_policy(), gpu_device_class=gpudriver.DEVICE_CLASS)
CLAIM = "flexinfer-gpu-shared-g"
BUDGET = 24  # GiB
FOOTPRINTS = {"chat": 8, "embed": 8, "big": 16}
PRIORITIES = {"chat": 100, "embed": 100, "big": 300}


def _always_fits(
    name: str, *, members: Iterable[ModelState], running: Collection[str], budget: int | None
) -> tuple[bool, str]:
    return True, ""


def _never_waits(self: Interlock, name: str, occupied: Any) -> str:
    return ""


def condition(c: Cluster, name: str, kind: str) -> dict[str, str]:
    conditions = c.status(name).get("conditions") or []
    return next((x for x in conditions if x["type"] == kind), {})


@pytest.mark.parametrize(
    "broken",
    ["", "decision", "decision+interlock"],
    ids=["guarded", "interlock-alone", "unguarded"],
)
def test_a_packed_group_never_holds_more_than_its_budget(
    local_cluster: object, cluster: Cluster, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    c = cluster
    if "decision" in broken:
        monkeypatch.setattr("flexinfer_core.group.memory_gate", _always_fits)
    if "interlock" in broken:
        monkeypatch.setattr(Interlock, "waits_for", _never_waits)
    timeline = MemoryTimeline(c, footprints=FOOTPRINTS, budget=BUDGET)
    for name, size in FOOTPRINTS.items():
        # An evicted member's pod takes 3 s to go: room enough to start beside it.
        c.add_model(name, priority=PRIORITIES[name], vram=(f"{BUDGET}Gi", f"{size}Gi"),
                    terminate_delay="3s")
    c.demand("chat")
    c.demand("embed")
    # Every status written at once (no coalescing): big's wait is seen in its words.
    with controller(local_cluster, c.namespace, settings=SHARED_CARD,  # type: ignore[arg-type]
                    status_coalesce=timedelta(0)):
        # The two small ones fit together (16 of 24 GiB): both hold the card at once,
        # their pods on the one device of the group's claim.
        c.wait_serving("chat")
        c.wait_serving("embed")
        assert c.holders() == {"chat", "embed"}
        pods = {name: c.ready_pods(name) for name in ("chat", "embed")}
        for name, [pod] in pods.items():
            assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": CLAIM}]
            assert condition(c, name, "Packed")["status"] == "True"
        assert len({p["spec"]["nodeName"] for [p] in pods.values()}) == 1
        claim = c.api.get(RESOURCE_CLAIMS, c.namespace, CLAIM)
        assert len(claim["status"]["allocation"]["devices"]["results"]) == 1
        assert len(claim["status"]["reservedFor"]) == 2

        # The larger, more important one needs 16 GiB with 8 free: it evicts one of them,
        # not both, and waits for the evicted one's pod to be gone.
        c.demand("chat")
        c.demand("embed")
        c.demand("big")
        said: list[str] = []

        def big_serving() -> bool:
            active = condition(c, "big", "Active")
            if active.get("reason") == "WaitingForGPU":
                said.append(active["message"])
            return c.status("big").get("phase") == "Ready"

        wait_until(big_serving, what="big to serve", timeout=90, interval=0.1)
        c.wait_serving("big")
        survivors = c.holders() - {"big"}
        assert len(survivors) == 1, c.holders()
        [survivor] = survivors
        [evicted] = {"chat", "embed"} - survivors
        # The survivor's pod was never touched.
        assert [p["metadata"]["name"] for p in c.ready_pods(survivor)] == [
            pods[survivor][0]["metadata"]["name"]
        ]
        c.wait_parked(evicted)
        # Told who needed the room (its Packed condition moves on to Queued once its
        # demand ages out).
        told = [e["message"] for e in c.events(evicted) if e["type"] == "Warning"]
        assert any("big" in message for message in told), told
        if not broken:
            assert any("waits for 16 GiB" in message for message in said), said
        big_pod = c.ready_pods("big")[0]
        assert big_pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": CLAIM}]
        assert big_pod["spec"]["nodeName"] == pods[survivor][0]["spec"]["nodeName"]
    timeline.stop()
    if broken == "decision+interlock":
        assert timeline.violations, "the watch must see the budget exceeded without the guards"
        assert timeline.peak == 32, timeline.peak  # big beside both small ones
    else:
        assert timeline.violations == []
        assert timeline.peak == BUDGET  # 16 + 8: full, never over
