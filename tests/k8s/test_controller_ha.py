"""Controller processes on a real control plane: leader election, a leader killed in the
middle of a swap, a restart; and an idle cluster that gets no writes."""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from flexinfer_k8s.kubeapi import GPU_GROUPS, NotFound, Resource
from tests.polling import wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    ControllerProcess,
    PodTimeline,
    cluster,
    controller,
    crds,
    kubectl,
)
from .test_controller_gpugroup import add_group, add_member, group_status, queue

pytestmark = pytest.mark.k8s

LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")


def holder(c: Cluster) -> str | None:
    try:
        lease: dict[str, Any] = c.api.get(LEASES, c.namespace, "flexinfer-controller")
    except NotFound:
        return None
    return (lease.get("spec") or {}).get("holderIdentity")


def test_standby_takes_over_a_swap_whose_leader_was_killed(
    local_cluster: Any, cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("a", terminate_delay="5s")
    c.add_model("b", priority=200)
    c.demand("a")
    election = (
        "--leader-elect", "--leader-election-namespace", c.namespace,
        "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1",
    )
    processes = [
        ControllerProcess(local_cluster, c.namespace, log=tmp_path / "one.log",
                          extra=(*election, "--identity", "one")),
    ]
    try:
        wait_until(lambda: holder(c) == "one", what="replica one to lead")
        processes.append(
            ControllerProcess(local_cluster, c.namespace, log=tmp_path / "two.log",
                              extra=(*election, "--identity", "two"))
        )
        c.wait_serving("a")
        c.demand("a")
        c.demand("b")  # b outranks a: the swap starts
        wait_until(lambda: c.replicas("a") == 0, what="a scaled down", interval=0.05)
        processes[0].kill()  # a's pods are still terminating; b is not scaled yet
        assert c.replicas("b") == 0
        wait_until(lambda: holder(c) == "two", what="replica two to take over", timeout=60)
        c.wait_serving("b")
        # The killed replica comes back as a standby; nothing moves.
        processes.append(
            ControllerProcess(local_cluster, c.namespace, log=tmp_path / "one-again.log",
                              extra=(*election, "--identity", "one"))
        )
        time.sleep(3)
        assert holder(c) == "two"
        assert c.status("b")["sharedGroup"]["state"] == "Active"
        assert c.replicas("a") == 0
    finally:
        for process in processes:
            process.kill()
        timeline.stop()
    assert timeline.violations == []
    assert timeline.created_apps() == ["a", "b"]


def test_a_controller_restarted_mid_swap_converges(
    local_cluster: Any, cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("a", terminate_delay="5s")
    c.add_model("b", priority=200)
    c.demand("a")
    first = ControllerProcess(local_cluster, c.namespace, log=tmp_path / "first.log")
    second: ControllerProcess | None = None
    try:
        c.wait_serving("a")
        c.demand("b")
        wait_until(lambda: c.replicas("a") == 0, what="a scaled down", interval=0.05)
        first.kill()
        preempted_at = c.status("a")["sharedGroup"]["preemptedAt"]
        second = ControllerProcess(local_cluster, c.namespace, log=tmp_path / "second.log")
        c.wait_serving("b")
        # The restart did not preempt a second time (no new stamp, no second Event; the
        # first Event may be lost if the kill came between the scale-down and it).
        assert c.status("a")["sharedGroup"]["preemptedAt"] == preempted_at
        events = [e["reason"] for e in c.events("a")]
        assert events.count("Preempted") <= 1
    finally:
        first.kill()
        if second is not None:
            second.kill()
        timeline.stop()
    assert timeline.violations == []


def test_an_idle_cluster_gets_no_writes(local_cluster: Any, cluster: Cluster) -> None:
    c = cluster
    c.add_model("a", idle_timeout="10m")
    c.add_model("b")
    add_member(c, "m1")
    add_member(c, "m2")
    add_group(c)
    c.demand("a")
    with controller(local_cluster, c.namespace) as ctl:
        c.wait_serving("a")
        queue(c, "m1", 1)
        wait_until(lambda: group_status(c).get("phase") == "Active", what="m1 active")
        queue(c, "m1", 0)
        # Let the demand and recent windows lapse, so only quiet timers remain.
        time.sleep(7)
        wait_until(lambda: ctl.controller.queue.is_idle(), what="the queue to drain")
        assert c.api.get(GPU_GROUPS, c.namespace, "gg")["status"]["activeModel"] == "m1"
        before = ctl.writes()
        reconciles_before = _reconciles(ctl)
        time.sleep(30)
        assert ctl.writes() == before
        # Timers did fire in the window (and wrote nothing).
        assert _reconciles(ctl) >= reconciles_before


def _reconciles(ctl: Any) -> float:
    total = 0.0
    for metric in ctl.metrics.reconcile_seconds.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                total += sample.value
    return total
