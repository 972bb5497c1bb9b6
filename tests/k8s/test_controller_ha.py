"""Controller processes on a real control plane: leader election, a leader killed in the
middle of a swap, a restart; and an idle cluster that gets no writes."""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from flexinfer_kube.kubeapi import NotFound
from flexinfer_kube.resources import GPU_GROUPS, Resource
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
from .harness import controller_writes as audit_writes
from .outage import Forwarder
from .test_controller_gpugroup import add_group, add_member, group_status, queue

pytestmark = pytest.mark.k8s

LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")


def holder(c: Cluster) -> str | None:
    try:
        lease: dict[str, Any] = c.api.get(LEASES, c.namespace, "flexinfer-controller")
    except NotFound:
        return None
    return (lease.get("spec") or {}).get("holderIdentity")


def renewed_at(c: Cluster) -> datetime | None:
    try:
        lease: dict[str, Any] = c.api.get(LEASES, c.namespace, "flexinfer-controller")
    except NotFound:
        return None
    text = (lease.get("spec") or {}).get("renewTime")
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def controller_writes(local: Any, namespace: str) -> list[tuple[str, str, str]]:
    """(when, identity, what) for every write a controller replica sent about
    `namespace`, oldest first (harness.controller_writes)."""
    return [(when, who, what) for when, who, what, _ in audit_writes(local, namespace)]


def writer_runs(writes: list[tuple[str, str, str]]) -> list[str]:
    """The identities in the order they wrote, consecutive writes of one folded together:
    a single writer at a time means no identity appears twice."""
    runs: list[str] = []
    for _, identity, _ in writes:
        if not runs or runs[-1] != identity:
            runs.append(identity)
    return runs


def test_a_short_api_server_outage_leaves_one_leader_that_keeps_renewing(
    local_cluster: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """Both replicas lose the API server for 5 s on the default 15/10/2 timings: their
    election threads survive (the outage raises urllib3 errors, not ApiException), the
    leader keeps renewing, and the audit log shows one writer throughout."""
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("a")
    c.add_model("b", priority=200)
    c.demand("a")
    forwarder = Forwarder(local_cluster.server)
    kubeconfig = forwarder.kubeconfig(local_cluster.kubeconfig, tmp_path / "cut.kubeconfig")
    election = ("--leader-elect", "--leader-election-namespace", c.namespace)
    processes = [
        ControllerProcess(local_cluster, c.namespace, log=tmp_path / "one.log",
                          kubeconfig=kubeconfig, extra=(*election, "--identity", "one")),
    ]
    try:
        # a's demand is kept fresh until a replica leads: a process starting on a busy
        # machine can take longer than the demand window.
        wait_until(lambda: c.demand("a") or holder(c) == "one", what="replica one to lead")
        processes.append(
            ControllerProcess(local_cluster, c.namespace, log=tmp_path / "two.log",
                              kubeconfig=kubeconfig, extra=(*election, "--identity", "two"))
        )
        c.wait_serving("a")
        assert [p.healthz() for p in processes] == [200, 200]

        forwarder.cut()
        time.sleep(5)
        forwarder.restore()
        back = datetime.now(UTC)

        # The leader renews again: its election thread lived through the outage.
        wait_until(lambda: (renewed_at(c) or back) > back, what="a renew after the outage",
                   timeout=30)
        assert holder(c) == "one"
        assert [p.popen.poll() for p in processes] == [None, None]
        assert [p.healthz() for p in processes] == [200, 200]
        # And it still acts: a swap after the outage.
        c.demand("a")
        c.demand("b")
        c.wait_serving("b")
        assert holder(c) == "one"
    finally:
        for process in processes:
            process.kill()
        forwarder.close()
        timeline.stop()
    writes = controller_writes(local_cluster, c.namespace)
    assert writes, "the audit log recorded no controller writes"
    assert writer_runs(writes) == ["one"], writes
    assert timeline.violations == []


def test_a_paused_leader_never_writes_after_it_resumes(
    local_cluster: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """SIGSTOP the leader past its lease: the standby takes over and acts; when the old
    leader resumes it refuses every write (its last renew is older than the renew deadline
    on the monotonic clock) and exits, instead of acting on what it saw before the pause."""
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("a")
    c.add_model("b", priority=200)
    c.demand("a")
    election = (
        "--leader-elect", "--leader-election-namespace", c.namespace,
        "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1",
    )
    one = ControllerProcess(local_cluster, c.namespace, log=tmp_path / "one.log",
                            extra=(*election, "--identity", "one"))
    two: ControllerProcess | None = None
    try:
        wait_until(lambda: c.demand("a") or holder(c) == "one", what="replica one to lead")
        two = ControllerProcess(local_cluster, c.namespace, log=tmp_path / "two.log",
                                extra=(*election, "--identity", "two"))
        c.wait_serving("a")
        os.kill(one.popen.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: holder(c) == "two", what="replica two to take over", timeout=60)
            # Work for both: one saw none of it, and will see all of it when it resumes.
            c.demand("a")
            c.demand("b")
            c.wait_serving("b")
        finally:
            os.kill(one.popen.pid, signal.SIGCONT)
        assert wait_until(lambda: one.popen.poll() is not None, what="the old leader to exit",
                          timeout=30)
        assert one.popen.returncode == 1
        lost = [e for e in one.log_lines() if e.get("msg") == "lost leadership; exiting"]
        assert lost, one.log_path.read_text()[-2000:]
        assert holder(c) == "two" and two.popen.poll() is None
    finally:
        one.kill()
        if two is not None:
            two.kill()
        timeline.stop()
    writes = controller_writes(local_cluster, c.namespace)
    assert writer_runs(writes) == ["one", "two"], writes
    assert timeline.violations == []


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
        # Killed once the preemption is fully written (its Event comes right after the
        # scale-down), while a's pods still terminate and b is not scaled up yet.
        wait_until(lambda: "Preempted" in [e["reason"] for e in c.events("a")],
                   what="a's Preempted Event", interval=0.05)
        first.kill()
        assert c.replicas("b") == 0
        preempted_at = c.status("a")["sharedGroup"]["preemptedAt"]
        second = ControllerProcess(local_cluster, c.namespace, log=tmp_path / "second.log")
        c.wait_serving("b")
        # The restart did not preempt a second time: no new stamp, no second Event.
        assert c.status("a")["sharedGroup"]["preemptedAt"] == preempted_at
        events = [e["reason"] for e in c.events("a")]
        assert events.count("Preempted") == 1
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
        time.sleep(30)  # timers may fire: they must write nothing
        # A full pass over every key reconciles again and still writes nothing.
        ctl.controller.enqueue_all()
        assert ctl.controller.wait_idle(30)
        assert ctl.writes() == before
        assert _reconciles(ctl) >= reconciles_before + len(ctl.controller.all_keys())


def _reconciles(ctl: Any) -> float:
    total = 0.0
    for metric in ctl.metrics.reconcile_seconds.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                total += sample.value
    return total
