"""GPUGroups on a real control plane: queue threshold, hysteresis, minimum run,
cooldown after preemption and Graceful drain, each shown on its own."""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_core.timestamps import format_rfc3339 as format_time
from flexinfer_kube.resources import GPU_GROUPS, MODEL_DEPLOYMENTS
from tests.polling import hold_while, wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    PodTimeline,
    cluster,
    controller,
    crds,
    drains_observed,
    kubectl,
    now_text,
    on_kwok,
)

pytestmark = pytest.mark.k8s


def add_member(c: Cluster, name: str, *, terminate_delay: str = "1s") -> None:
    c.api.create(MODEL_DEPLOYMENTS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"backend": "vllm", "model": f"test/{name}", "idleTimeoutSeconds": 300,
                 "gpuGroupRef": "gg", **on_kwok(terminate_delay=terminate_delay)},
    })


def add_group(c: Cluster, *, policy: str = "Graceful", drain: int = 60, threshold: int = 1,
              hysteresis: int = 0, minimum_run: int = 0, cooldown: int = 0) -> None:
    c.api.create(GPU_GROUPS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
        "metadata": {"name": "gg"},
        "spec": {
            "models": [{"name": "m1", "priority": 100}, {"name": "m2", "priority": 100}],
            "scalingPolicy": {"preemptionPolicy": policy, "drainTimeoutSeconds": drain},
            "antiThrashing": {
                "enabled": True,
                "requestQueueThreshold": threshold,
                "hysteresisWindowSeconds": hysteresis,
                "minimumRunDurationSeconds": minimum_run,
                "cooldownAfterPreemptionSeconds": cooldown,
            },
        },
    })


def queue(c: Cluster, member: str, queued: int, *, oldest: datetime | None = None) -> None:
    """What the proxy writes (docs/resources.md, demand annotations)."""
    now = datetime.now(UTC)
    value: str | None = None
    if queued:
        value = json.dumps({
            "queued": queued,
            "oldestWaiting": format_time(oldest or now),
            "reportedAt": format_time(now),
        })
    c.api.patch(GPU_GROUPS, c.namespace, "gg",
                {"metadata": {"annotations": {f"demand.ai.flexinfer/{member}": value}}})


def group_status(c: Cluster) -> dict[str, Any]:
    return dict(c.api.get(GPU_GROUPS, c.namespace, "gg").get("status") or {})


def reason(c: Cluster) -> str:
    conditions = group_status(c).get("conditions") or []
    return next((x["reason"] for x in conditions if x["type"] == "Ready"), "")


def active(c: Cluster, member: str) -> bool:
    status = group_status(c)
    return (
        status.get("activeModel") == member
        and status.get("phase") == "Active"
        and c.replicas(member) == 1
        and bool(c.ready_pods(member))
    )


def start_with_m1(c: Cluster) -> None:
    queue(c, "m1", 1)
    wait_until(lambda: active(c, "m1"), what="m1 active")
    queue(c, "m1", 0)


def test_queue_threshold(local_cluster: object, cluster: Cluster) -> None:
    c = cluster
    add_member(c, "m1")
    add_member(c, "m2")
    add_group(c, threshold=3)
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        start_with_m1(c)
        queue(c, "m2", 2)
        wait_until(lambda: reason(c) == "QueueBelowThreshold", what="the threshold to block")
        assert group_status(c)["activeModel"] == "m1"
        queue(c, "m2", 3)
        wait_until(lambda: active(c, "m2"), what="m2 active at the threshold")
        status = group_status(c)
        assert status["swapCount"] == 2
        rows = {r["name"]: r for r in status["modelStatuses"]}
        assert rows["m1"]["preemptedBy"] == "m2"
        assert rows["m2"]["state"] == "Active"

        def md_phase(name: str) -> str:
            md = c.api.get(MODEL_DEPLOYMENTS, c.namespace, name)
            return str((md.get("status") or {}).get("phase"))

        wait_until(lambda: md_phase("m2") == "Running", what="m2's ModelDeployment Running")
        wait_until(lambda: md_phase("m1") == "Idle", what="m1's ModelDeployment Idle")


def test_hysteresis(local_cluster: object, cluster: Cluster) -> None:
    c = cluster
    add_member(c, "m1")
    add_member(c, "m2")
    add_group(c, hysteresis=6)
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        start_with_m1(c)
        asked = datetime.now(UTC)
        queue(c, "m2", 1, oldest=asked)
        wait_until(lambda: reason(c) == "Hysteresis", what="hysteresis to hold")
        hold_while(lambda: datetime.now(UTC) < asked + timedelta(seconds=5),
                   lambda: group_status(c)["activeModel"] == "m1", what="m1 active")
        # No further write from the test: the timer at oldest + 6 s does it.
        wait_until(lambda: active(c, "m2"), what="m2 active after the hysteresis window")


def test_minimum_run_duration(local_cluster: object, cluster: Cluster) -> None:
    c = cluster
    add_member(c, "m1")
    add_member(c, "m2")
    add_group(c, minimum_run=10)
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        queue(c, "m1", 1)
        wait_until(lambda: group_status(c).get("activeModel") == "m1", what="m1 chosen")
        swapped = datetime.fromisoformat(group_status(c)["lastSwapTime"].replace("Z", "+00:00"))
        queue(c, "m1", 0)
        queue(c, "m2", 1)
        wait_until(lambda: reason(c) == "MinimumRunDuration", what="minimum run to hold")
        hold_while(lambda: datetime.now(UTC) < swapped + timedelta(seconds=9),
                   lambda: group_status(c)["activeModel"] == "m1", what="m1 active")
        wait_until(lambda: active(c, "m2"), what="m2 active after the minimum run")


def test_cooldown_after_preemption(local_cluster: object, cluster: Cluster) -> None:
    c = cluster
    add_member(c, "m1")
    add_member(c, "m2")
    add_group(c, cooldown=12)
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        start_with_m1(c)
        queue(c, "m2", 1)
        wait_until(lambda: group_status(c).get("activeModel") == "m2", what="swap to m2")
        queue(c, "m2", 0)
        rows = {r["name"]: r for r in group_status(c)["modelStatuses"]}
        preempted = datetime.fromisoformat(rows["m1"]["preemptedAt"].replace("Z", "+00:00"))
        queue(c, "m1", 1)
        wait_until(lambda: reason(c) == "CooldownAfterPreemption", what="the cooldown to hold")
        hold_while(lambda: datetime.now(UTC) < preempted + timedelta(seconds=11),
                   lambda: group_status(c)["activeModel"] == "m2", what="m2 active")
        wait_until(lambda: active(c, "m1"), what="m1 back after its cooldown")


def test_graceful_drain_waits_for_the_old_pods(local_cluster: object, cluster: Cluster) -> None:
    c = cluster
    timeline = PodTimeline(c)
    add_member(c, "m1", terminate_delay="4s")
    add_member(c, "m2")
    add_group(c, policy="Graceful", drain=60)
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        start_with_m1(c)
        queue(c, "m2", 1)
        wait_until(lambda: group_status(c).get("phase") == "Draining", what="Draining")
        status = group_status(c)
        assert status["pendingModel"] == "m2"
        assert c.replicas("m2") == 0
        assert c.pods("m1")  # still terminating
        wait_until(lambda: active(c, "m2"), what="m2 active after the drain")
    timeline.stop()
    assert timeline.violations == []


def test_drain_timeout_and_immediate_policy_do_not_wait(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    add_member(c, "m1", terminate_delay="40s")
    add_member(c, "m2")
    add_group(c, policy="Graceful", drain=5)
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        start_with_m1(c)
        queue(c, "m2", 1)
        # The old pod outlives the 5 s drain timeout: m2 starts anyway.
        wait_until(lambda: c.replicas("m2") == 1, what="m2 scaled after the drain timeout")
        assert c.pods("m1")


def md_ready_condition(c: Cluster, name: str) -> dict[str, Any]:
    md = c.api.get(MODEL_DEPLOYMENTS, c.namespace, name)
    conditions = (md.get("status") or {}).get("conditions") or []
    return next((x for x in conditions if x["type"] == "Ready"), {})


def test_membership_conflicts_hold_at_zero_and_say_why(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    add_member(c, "m1")
    add_member(c, "m2")
    add_group(c)
    c.api.create(MODEL_DEPLOYMENTS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "stray"},
        "spec": {"backend": "vllm", "model": "test/stray", **on_kwok()},
    })
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        # Standalone, a request wakes it.
        c.api.patch(MODEL_DEPLOYMENTS, c.namespace, "stray",
                    {"status": {"lastAccessTime": now_text()}}, subresource="status")
        wait_until(lambda: c.ready_pods("stray"), what="stray running on its own")
        # Its gpuGroupRef now names gg, which does not list it: held at zero, and it says so.
        c.api.patch(MODEL_DEPLOYMENTS, c.namespace, "stray", {"spec": {"gpuGroupRef": "gg"}})
        wait_until(lambda: md_ready_condition(c, "stray").get("reason") == "GPUGroupRefNotListed",
                   what="stray's condition")
        ready = md_ready_condition(c, "stray")
        assert ready["status"] == "False" and "GPUGroup gg does not list it" in ready["message"]
        wait_until(lambda: c.replicas("stray") == 0 and not c.pods("stray"),
                   what="stray held at zero")
        assert "GPUGroupRefNotListed" in {e["reason"] for e in c.events("stray")}

        start_with_m1(c)
        wait_until(lambda: md_ready_condition(c, "m1").get("reason") == "GPUGroupMember",
                   what="m1's condition naming its group")
        # A second group lists m1 too: neither runs it, and it says which groups.
        c.api.create(GPU_GROUPS, c.namespace, {
            "apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
            "metadata": {"name": "g2"}, "spec": {"models": [{"name": "m1"}]},
        })
        wait_until(
            lambda: md_ready_condition(c, "m1").get("reason") == "ListedByMultipleGPUGroups",
            what="m1's conflict condition",
        )
        assert "GPUGroups g2, gg" in md_ready_condition(c, "m1")["message"]
        wait_until(lambda: c.replicas("m1") == 0 and not c.pods("m1"), what="m1 held at zero")
        queue(c, "m1", 1)
        wait_until(lambda: group_status(c).get("phase") == "Idle", what="gg idle without m1")
        assert c.replicas("m1") == 0
        # g2 lets go: m1 is gg's again, and its queue starts it.
        c.api.delete(GPU_GROUPS, c.namespace, "g2")
        wait_until(lambda: active(c, "m1"), what="m1 active in gg again")
        assert md_ready_condition(c, "m1")["reason"] == "GPUGroupMember"


def in_flight(c: Cluster, member: str, count: int) -> None:
    """What the proxy writes while it has `count` requests in flight to `member` and none
    queued (docs/election.md 1.6)."""
    value = None
    if count:
        value = json.dumps({"queued": 0, "inFlight": count, "reportedAt": now_text()})
    c.api.patch(GPU_GROUPS, c.namespace, "gg",
                {"metadata": {"annotations": {f"demand.ai.flexinfer/{member}": value}}})


def test_graceful_keeps_a_member_answering_requests_until_they_end(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    add_member(c, "m1")
    add_member(c, "m2")
    add_group(c, policy="Graceful", drain=60)
    with controller(local_cluster, c.namespace) as ctl:  # type: ignore[arg-type]
        start_with_m1(c)
        in_flight(c, "m1", 2)
        queue(c, "m2", 1)

        def m1_drains() -> bool:
            md = c.api.get(MODEL_DEPLOYMENTS, c.namespace, "m1")
            return (
                group_status(c).get("activeModel") == "m2"
                and group_status(c).get("phase") == "Draining"
                and (md.get("status") or {}).get("phase") == "Draining"
                and c.replicas("m1") == 1
                and bool(c.ready_pods("m1"))
                and c.replicas("m2") == 0
                and not c.pods("m2")
            )

        wait_until(m1_drains, what="m1 to drain")
        drained_at = datetime.now(UTC)
        hold_while(lambda: datetime.now(UTC) < drained_at + timedelta(seconds=3), m1_drains,
                   what="the drain while m1 answers")
        in_flight(c, "m1", 0)  # its last answer ended
        wait_until(lambda: active(c, "m2"), what="m2 active after m1 drained")
        assert c.replicas("m1") == 0
        # One drain, from the swap to the scale-down, ended by the count (not the 60 s).
        drains = drains_observed(ctl.scrape(), c.namespace, "m1")
        assert list(drains) == ["drained"]
        count, seconds = drains["drained"]
        assert count == 1 and 3 <= seconds < 60
    timeline.stop()
    assert timeline.violations == []
    assert timeline.created_apps() == ["m1", "m2"]


def test_a_vram_budget_is_shown_and_members_still_take_turns(
    local_cluster: object, cluster: Cluster
) -> None:
    """docs/election.md 3: a GPUGroup reads spec.vramBudget and its members' footprints
    and shows them; on a controller without --gpu-device-class its members take turns
    one at a time all the same, and its Packed condition says why
    (test_controller_gpugroup_packing: with one, they pack)."""
    c = cluster
    timeline = PodTimeline(c)
    add_member(c, "m1")
    add_member(c, "m2")
    add_group(c)
    c.api.patch(GPU_GROUPS, c.namespace, "gg", {"spec": {
        "vramBudget": "24Gi",
        "models": [{"name": "m1", "priority": 100, "vramEstimate": "4Gi"},
                   {"name": "m2", "priority": 100, "vramEstimate": "4Gi"}],
    }})  # fmt: skip
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        start_with_m1(c)
        wait_until(lambda: group_status(c).get("vram", {}).get("used") == "4Gi",
                   what="the budget's use written")
        status = group_status(c)
        assert status["vram"] == {"budget": "24Gi", "used": "4Gi"}
        assert {r["name"]: r.get("footprint") for r in status["modelStatuses"]} == {
            "m1": "4Gi", "m2": "4Gi"}
        packed = next(x for x in status["conditions"] if x["type"] == "Packed")
        assert (packed["status"], packed["reason"]) == ("False", "NoSharedCard")
        assert "--gpu-device-class" in packed["message"]
        # m2 asked for too: both fit the budget, but it takes its turn (a swap).
        queue(c, "m2", 1)
        wait_until(lambda: active(c, "m2"), what="m2 active")
        assert c.replicas("m1") == 0
    timeline.stop()
    assert timeline.violations == []
