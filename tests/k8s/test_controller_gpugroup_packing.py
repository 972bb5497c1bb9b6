"""A GPUGroup with `spec.vramBudget` on the local cluster (docs/election.md 3, "Packing").

With the local cluster's fake DRA driver's class the controller renders the GPUGroup's
one ResourceClaim (owned by the GPUGroup), its members' pods reference it, and the
members that fit hold the card together; a pod watch checks break-before-make by
memory: the footprints of the members with live pods never exceed the budget.

The same scenario runs with the controller's two memory guards taken away one at a
time, as for shared groups of Models (test_controller_packed_memory): the decision's
memory gate (`flexinfer_core.gpugroup_packing._memory_gate`, read from the controller's
cache) and the last check on a live pod list before a scale-up (`write_plan.Interlock`).
Either one alone keeps the budget; with both gone the watch sees it exceeded, which
shows that the watch can fail. Without a device class the members take turns.
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_cli.__main__ import main
from flexinfer_core.timestamps import format_rfc3339
from flexinfer_devcluster import gpudriver
from flexinfer_devcluster.policy import dev_policy
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_k8s.write_plan import Interlock
from flexinfer_kube.kubeapi import NotFound
from flexinfer_kube.resources import DEPLOYMENTS, GPU_GROUPS, MODEL_DEPLOYMENTS, RESOURCE_CLAIMS
from tests.polling import hold_while, wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    MemoryTimeline,
    PodTimeline,
    cluster,
    controller,
    crds,
    foreign_claim,
    kubectl,
    on_kwok,
)

pytestmark = pytest.mark.k8s

SHARED_CARD = RenderSettings(policy=dev_policy(), gpu_device_class=gpudriver.DEVICE_CLASS)
CLAIM = "flexinfer-gpu-gpugroup-gg"
BUDGET = 24  # GiB
FOOTPRINTS = {"chat": 8, "embed": 8, "big": 16}
PRIORITIES = {"chat": 100, "embed": 100, "big": 300}


def add_member(c: Cluster, name: str, *, terminate_delay: str = "1s") -> None:
    c.api.create(MODEL_DEPLOYMENTS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"backend": "vllm", "model": f"test/{name}", "idleTimeoutSeconds": 300,
                 "gpuGroupRef": "gg", **on_kwok(terminate_delay=terminate_delay)},
    })  # fmt: skip


def add_group(c: Cluster, footprints: dict[str, int]) -> None:
    """A 24 GiB budget; one queued request never moves the lead (the threshold), so a
    member asked for joins the holders rather than replacing the leader."""
    c.api.create(GPU_GROUPS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
        "metadata": {"name": "gg"},
        "spec": {
            "vramBudget": f"{BUDGET}Gi",
            "models": [{"name": n, "priority": PRIORITIES[n], "vramEstimate": f"{size}Gi"}
                       for n, size in footprints.items()],
            "scalingPolicy": {"preemptionPolicy": "Graceful", "drainTimeoutSeconds": 60},
            "antiThrashing": {"enabled": True, "requestQueueThreshold": 10,
                              "hysteresisWindowSeconds": 0, "minimumRunDurationSeconds": 0,
                              "cooldownAfterPreemptionSeconds": 0},
        },
    })  # fmt: skip


def queue(c: Cluster, member: str, queued: int, *, oldest: datetime | None = None) -> None:
    """What the proxy writes for a member's queue (docs/resources.md)."""
    now = datetime.now(UTC)
    value = None
    if queued:
        value = json.dumps({"queued": queued, "oldestWaiting": format_rfc3339(oldest or now),
                            "reportedAt": format_rfc3339(now)})  # fmt: skip
    c.api.patch(GPU_GROUPS, c.namespace, "gg",
                {"metadata": {"annotations": {f"demand.ai.flexinfer/{member}": value}}})


def group_status(c: Cluster) -> dict[str, Any]:
    return dict(c.api.get(GPU_GROUPS, c.namespace, "gg").get("status") or {})


def states(c: Cluster) -> dict[str, str]:
    return {r["name"]: r["state"] for r in group_status(c).get("modelStatuses") or []}


def packed(c: Cluster) -> dict[str, str]:
    conditions = group_status(c).get("conditions") or []
    return next((x for x in conditions if x["type"] == "Packed"), {})


def serving(c: Cluster, name: str) -> bool:
    md = c.api.get(MODEL_DEPLOYMENTS, c.namespace, name)
    return (md.get("status") or {}).get("phase") == "Running" and bool(c.ready_pods(name))


def said_on_the_cluster_as_written(c: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """`flexinfer explain` and `status` with the controller's device class decide the
    live group as the controller did: the same holders, the same `Packed` words."""
    flags = ["--kubeconfig", str(c.local.kubeconfig), "-n", c.namespace, "-o", "json",
             "--gpu-device-class", gpudriver.DEVICE_CLASS]  # fmt: skip
    capsys.readouterr()
    assert main(["explain", "gpugroup/gg", *flags]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["holders"] == ["chat", "embed"]
    assert explained["packed"]["message"] == packed(c)["message"]
    seats = {m["name"]: m["seat"]["message"] for m in explained["members"]}
    assert seats["embed"] == "fits: 16 of 24 GiB used"
    assert main(["status", *flags]) == 0
    (row,) = json.loads(capsys.readouterr().out)["gpuGroups"]
    assert (row["active"], row["holders"]) == ("chat", ["chat", "embed"])
    assert row["vram"]["usedBytes"] == 16 * 2**30


def _no_memory_gate(state: Any, holders: Any, *, size: int) -> tuple[str, ...]:
    return ()


def _never_waits(self: Interlock, name: str, occupied: Any) -> str:
    return ""


@pytest.mark.parametrize(
    "broken",
    ["", "decision", "decision+interlock"],
    ids=["guarded", "interlock-alone", "unguarded"],
)
def test_a_packed_gpugroup_runs_two_at_once_and_never_holds_more_than_its_budget(
    local_cluster: object,
    cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    broken: str,
) -> None:
    c = cluster
    if "decision" in broken:
        monkeypatch.setattr("flexinfer_core.gpugroup_packing._memory_gate", _no_memory_gate)
    if "interlock" in broken:
        monkeypatch.setattr(Interlock, "waits_for", _never_waits)
    timeline = MemoryTimeline(c, footprints=FOOTPRINTS, budget=BUDGET)
    for name in FOOTPRINTS:
        # An evicted member's pod takes 3 s to go: room enough to start beside it.
        add_member(c, name, terminate_delay="3s")
    add_group(c, FOOTPRINTS)
    # chat asked first: it leads; embed fits beside it (16 of 24 GiB).
    queue(c, "chat", 1, oldest=datetime.now(UTC) - timedelta(seconds=5))
    queue(c, "embed", 1)
    with controller(local_cluster, c.namespace, settings=SHARED_CARD):  # type: ignore[arg-type]
        wait_until(lambda: serving(c, "chat") and serving(c, "embed"),
                   what="chat and embed serving together", timeout=90)  # fmt: skip
        status = group_status(c)
        assert status["activeModel"] == "chat"
        assert {n: s for n, s in states(c).items() if s == "Active"} == {
            "chat": "Active", "embed": "Active"
        }  # fmt: skip
        wait_until(lambda: packed(c).get("status") == "True", what="Packed True")
        assert packed(c)["message"].startswith(
            "chat, embed hold the card together: fits: 16 of 24 GiB used"
        )
        assert group_status(c)["vram"] == {"budget": "24Gi", "used": "16Gi"}
        if not broken:
            said_on_the_cluster_as_written(c, capsys)
        pods = {name: c.ready_pods(name) for name in ("chat", "embed")}
        for [pod] in pods.values():
            assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": CLAIM}]
        assert len({p["spec"]["nodeName"] for [p] in pods.values()}) == 1
        claim = c.api.get(RESOURCE_CLAIMS, c.namespace, CLAIM)
        owners = claim["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o.get("controller")) for o in owners] == [
            ("GPUGroup", "gg", True)
        ]
        assert len(claim["status"]["allocation"]["devices"]["results"]) == 1
        assert len(claim["status"]["reservedFor"]) == 2
        queue(c, "chat", 0)  # served: the proxy's queues are empty
        queue(c, "embed", 0)

        # The larger, more important one needs 16 GiB with 8 free: it evicts embed (chat
        # leads and is never evicted), not both, and waits for embed's pod to be gone.
        queue(c, "big", 1)
        wait_until(lambda: serving(c, "big"), what="big to serve", timeout=90, interval=0.2)
        wait_until(lambda: states(c).get("embed") == "Preempted", what="embed evicted")
        assert states(c)["chat"] == states(c)["big"] == "Active"
        assert c.replicas("embed") == 0
        # chat's pod was never touched.
        assert [p["metadata"]["name"] for p in c.ready_pods("chat")] == [
            pods["chat"][0]["metadata"]["name"]
        ]
        wait_until(lambda: not c.pods("embed"), what="embed's pod gone")
        rows = {r["name"]: r for r in group_status(c)["modelStatuses"]}
        assert rows["embed"]["preemptedBy"] == "big"
        told = [e["message"] for e in c.events("embed") if e["type"] == "Warning"]
        assert any("evicted by big" in message for message in told), told
        big_pod = c.ready_pods("big")[0]
        assert big_pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": CLAIM}]
        assert big_pod["spec"]["nodeName"] == pods["chat"][0]["spec"]["nodeName"]
        wait_until(lambda: group_status(c).get("vram", {}).get("used") == "24Gi",
                   what="24 of 24 GiB used")  # fmt: skip
    timeline.stop()
    if broken == "decision+interlock":
        assert timeline.violations, "the watch must see the budget exceeded without the guards"
        assert timeline.peak == 32, timeline.peak  # big beside both small ones
    else:
        assert timeline.violations == []
        assert timeline.peak == BUDGET  # 16 + 8: full, never over


def test_without_a_device_class_a_budgeted_gpugroup_takes_turns_and_says_why(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    footprints = {"chat": 8, "embed": 8}
    for name in footprints:
        add_member(c, name)
    add_group(c, footprints)
    queue(c, "chat", 1, oldest=datetime.now(UTC) - timedelta(seconds=5))
    queue(c, "embed", 1)
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        wait_until(lambda: serving(c, "chat"), what="chat serving", timeout=60)
        wait_until(lambda: packed(c).get("reason") == "NoSharedCard",
                   what="the group told its members take turns")  # fmt: skip
        assert "--gpu-device-class" in packed(c)["message"]
        deadline = time.monotonic() + 3
        hold_while(lambda: time.monotonic() < deadline,
                   lambda: c.replicas("embed") == 0 and states(c).get("embed") != "Active",
                   what="embed waiting its turn")  # fmt: skip
        assert "resourceClaims" not in c.ready_pods("chat")[0]["spec"]
    timeline.stop()
    assert timeline.violations == []


def test_a_claim_of_the_gpugroups_name_that_flexinfer_did_not_create_is_never_used(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    foreign = foreign_claim(CLAIM, gpudriver.DEVICE_CLASS)
    c.api.create(RESOURCE_CLAIMS, c.namespace, foreign)
    add_member(c, "chat")
    add_group(c, {"chat": 8})
    queue(c, "chat", 1)

    def rendered() -> dict[str, str]:
        md = c.api.get(MODEL_DEPLOYMENTS, c.namespace, "chat")
        conditions = (md.get("status") or {}).get("conditions") or []
        return next((x for x in conditions if x["type"] == "Rendered"), {})

    with controller(local_cluster, c.namespace, settings=SHARED_CARD):  # type: ignore[arg-type]
        wait_until(lambda: rendered().get("reason") == "NameClash",
                   what="chat told the claim is not flexinfer's")  # fmt: skip
        assert f"ResourceClaim {c.namespace}/{CLAIM}" in rendered()["message"]
        assert "GPUGroup gg" in rendered()["message"]
        with pytest.raises(NotFound):
            c.api.get(DEPLOYMENTS, c.namespace, "chat")
        untouched = c.api.get(RESOURCE_CLAIMS, c.namespace, CLAIM)
        assert untouched["metadata"]["labels"] == {"team": "ml"}
        assert not untouched["metadata"].get("ownerReferences")
        # Its owner deletes it: the controller makes the group's own and chat runs.
        c.api.delete(RESOURCE_CLAIMS, c.namespace, CLAIM)
        wait_until(lambda: serving(c, "chat"), what="chat serving", timeout=90)
        ours = c.api.get(RESOURCE_CLAIMS, c.namespace, CLAIM)
        assert ours["metadata"]["labels"]["ai.flexinfer/kind"] == "ModelDeployment"
        assert ours["metadata"]["ownerReferences"][0]["kind"] == "GPUGroup"
