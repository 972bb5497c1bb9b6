"""`flexinfer explain` against a cluster the controller wrote: they agree, byte for byte.

For each scenario (cooldown, priority gate, lease, loading holder, idle timeout) the
controller runs on the local control plane until the group settles; then `explain
-o json` decides on a listing of the same cluster, and its leader, reasons and
messages must be exactly what the controller wrote into each Model's status (and
nothing left to write). The policy flags given to explain are the controller's.
"""

# The fixtures come from tests/k8s/harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from flexinfer_cli.__main__ import main
from flexinfer_core import Policy
from flexinfer_kube.resources import GPU_LEASES
from tests.k8s.harness import (  # noqa: F401  (fixtures)
    Cluster,
    cluster,
    controller,
    crds,
    kubectl,
)
from tests.polling import wait_until

pytestmark = pytest.mark.k8s

# Windows long enough that nothing lapses between the controller's last write and the
# explanation; cooldowns are set per Model.
POLICY = Policy(
    demand_window=timedelta(seconds=60),
    recent_window=timedelta(minutes=10),
    default_swap_cooldown=timedelta(minutes=10),
)
POLICY_FLAGS = (
    "--demand-window",
    "60s",
    "--recent-window",
    "10m",
    "--default-swap-cooldown",
    "10m",
)


def explain_json(c: Cluster, target: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(
        [
            "explain",
            target,
            "--kubeconfig",
            str(c.local.kubeconfig),
            "-n",
            c.namespace,
            "-o",
            "json",
            *POLICY_FLAGS,
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)  # type: ignore[no-any-return]


def written(c: Cluster, name: str) -> dict[str, Any]:
    status = c.status(name)
    conditions = {x["type"]: x for x in status.get("conditions") or []}
    shared = status.get("sharedGroup") or {}
    return {
        "state": shared.get("state"),
        "queuePosition": shared.get("queuePosition"),
        "preemptedBy": shared.get("preemptedBy"),
        "phase": status.get("phase"),
        "reason": (conditions.get("Active") or {}).get("reason"),
        "message": (conditions.get("Active") or {}).get("message"),
        "readyReason": (conditions.get("Ready") or {}).get("reason"),
        "desiredReplicas": c.replicas(name),
    }


def disagreement(c: Cluster, data: dict[str, Any]) -> list[str]:
    """Where explain's decision differs from what the controller wrote (empty: none)."""
    diffs = []
    for member in data["members"]:
        wrote = written(c, member["name"])
        for field, value in wrote.items():
            if member[field] != value:
                diffs.append(
                    f"{member['name']}.{field}: explain {member[field]!r}, wrote {value!r}"
                )
        if member["pendingWrites"]:
            diffs.append(f"{member['name']}: explain would still write {member['pendingWrites']}")
    holders = [m["name"] for m in data["members"] if written(c, m["name"])["state"] == "Active"]
    if holders != ([data["leader"]] if data["leader"] else []):
        diffs.append(f"leader: explain {data['leader']!r}, wrote {holders}")
    if data["leader"]:
        leader = next(m for m in data["members"] if m["name"] == data["leader"])
        if (data["reason"], data["message"]) != (leader["reason"], leader["message"]):
            diffs.append(f"the election's reason {data['reason']!r} is not the leader's")
    return diffs


def agreed(c: Cluster, target: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Explain once the controller has written the settled decision; fail naming the
    last disagreement if they never agree."""
    last: list[str] = []

    def probe() -> dict[str, Any] | None:
        nonlocal last
        data = explain_json(c, target, capsys)
        last = disagreement(c, data)
        return None if last else data

    try:
        return wait_until(probe, what=f"explain {target} to agree with the controller", timeout=60)
    except AssertionError as error:
        raise AssertionError(f"{error}: {last}") from None


def active_reason(c: Cluster, name: str) -> str | None:
    return written(c, name)["reason"]


def test_cooldown(
    local_cluster: object, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    c.add_model("a", priority=100, swap_cooldown="10m")
    c.add_model("b", priority=300, swap_cooldown="10m")
    c.demand("a")
    with controller(local_cluster, c.namespace, policy=POLICY):  # type: ignore[arg-type]
        c.wait_serving("a")
        c.demand("b")
        c.wait_serving("b")
        c.wait_parked("a")
        wait_until(
            lambda: active_reason(c, "b") == "SwapCooldown", what="b to hold as SwapCooldown"
        )
        data = agreed(c, "group/g", capsys)
    assert (data["leader"], data["reason"]) == ("b", "SwapCooldown")
    assert [r["number"] for r in data["rules"] if r["applied"]] == [4]
    a = next(m for m in data["members"] if m["name"] == "a")
    assert (a["phase"], a["reason"], a["preemptedBy"]) == ("Preempted", "Preempted", "b")


def test_priority_gate(
    local_cluster: object, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    c.add_model("a", priority=200, min_replicas=1)
    c.add_model("b", priority=100)
    with controller(local_cluster, c.namespace, policy=POLICY):  # type: ignore[arg-type]
        c.wait_serving("a")
        c.demand("b")
        wait_until(lambda: c.status("b").get("lastActiveTime"), what="b's demand")
        data = agreed(c, "model/b", capsys)
    assert (data["leader"], data["reason"]) == ("a", "ReadyLeader")
    rule7 = data["rules"][6]
    assert rule7["why"] == "b (priority 100) ranks below the idle ready a (priority 200)"
    assert next(m for m in data["members"] if m["name"] == "b")["reason"] == "Queued"


def test_lease(local_cluster: object, cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster
    c.add_model("a")
    c.add_model("b")
    c.demand("a")
    with controller(local_cluster, c.namespace, policy=POLICY):  # type: ignore[arg-type]
        c.wait_serving("a")
        c.api.create(
            GPU_LEASES,
            c.namespace,
            {
                "apiVersion": "ai.flexinfer/v1alpha2",
                "kind": "GPULease",
                "metadata": {"name": "train"},
                "spec": {"group": "g", "owner": "trainer"},
            },
        )
        c.wait_parked("a")
        data = agreed(c, "group/g", capsys)
    assert (data["leader"], data["reason"]) == (None, "GPULeaseHeld")
    assert data["lease"]["name"] == "train"
    assert {m["reason"] for m in data["members"]} == {"GPULeaseHeld"}
    assert {m["preemptedBy"] for m in data["members"]} == {"gpu-lease/trainer"}
    assert data["next"] == []  # a lease without expiry: nothing changes on its own


def test_loading_holder(
    local_cluster: object, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    c.add_model("a", ready_delay="10m")  # kwok keeps its pod loading
    c.add_model("b")
    c.demand("a")
    with controller(local_cluster, c.namespace, policy=POLICY):  # type: ignore[arg-type]
        wait_until(
            lambda: written(c, "a")["phase"] == "Loading" and written(c, "a")["state"] == "Active",
            what="a to be the loading holder",
        )
        c.demand("b")
        wait_until(lambda: active_reason(c, "a") == "LoadingHolder", what="a to hold while loading")
        data = agreed(c, "group/g", capsys)
    assert (data["leader"], data["reason"]) == ("a", "LoadingHolder")
    assert [r["number"] for r in data["rules"] if r["applied"]] == [5]


def test_idle_timeout(
    local_cluster: object, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    c.add_model("a", idle_timeout="3s")
    c.add_model("b")
    c.demand("a")
    with controller(local_cluster, c.namespace, policy=POLICY):  # type: ignore[arg-type]
        c.wait_serving("a")
        # Past its idle timeout a keeps the card (recently used) with no pod.
        wait_until(
            lambda: (
                c.replicas("a") == 0 and not c.pods("a") and active_reason(c, "a") == "RecentDemand"
            ),
            what="a scaled to zero by its idle timeout",
        )
        data = agreed(c, "model/a", capsys)
    assert (data["leader"], data["reason"]) == ("a", "RecentDemand")
    a = next(m for m in data["members"] if m["name"] == "a")
    assert (a["desiredReplicas"], a["state"]) == (0, "Active")
