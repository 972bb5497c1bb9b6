"""Leadership fencing without a cluster: a manual monotonic clock and a lock that fails
the way an API-server outage makes it fail."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import urllib3
from kubernetes.leaderelection import electionconfig

from flexinfer_k8s.leader import Leadership, _FencedElection
from flexinfer_kube.kubeapi import KubeApi, NotLeading


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_writes_are_refused_once_the_renew_deadline_has_passed() -> None:
    ticks = Ticks()
    lost: list[str] = []
    leadership = Leadership(renew_deadline=10, on_lost=lost.append, monotonic=ticks)
    leadership.renewed(ticks.now)
    ticks.now += 9.9
    leadership.guard_write("PATCH", "/x")  # still fresh
    assert lost == []
    ticks.now += 0.2
    with pytest.raises(NotLeading, match="no successful lease renew for more than 10s"):
        leadership.guard_write("PATCH", "/x")
    with pytest.raises(NotLeading):
        leadership.guard_write("POST", "/y")
    assert len(lost) == 1  # told once
    assert leadership.healthy() == (False, "leadership stale for 0.1s")


def test_a_replica_that_never_led_writes_nothing() -> None:
    leadership = Leadership(renew_deadline=10, on_lost=lambda why: None, monotonic=Ticks())
    with pytest.raises(NotLeading, match="not leading yet"):
        leadership.guard_write("PATCH", "/x")


def test_an_older_renew_never_moves_leadership_back() -> None:
    ticks = Ticks()
    leadership = Leadership(renew_deadline=10, on_lost=lambda why: None, monotonic=ticks)
    leadership.renewed(1000.0)
    leadership.renewed(990.0)
    ticks.now = 1009.0
    assert leadership.fresh()


def test_kubeapi_consults_the_guard_before_every_write_and_never_for_reads() -> None:
    seen: list[tuple[str, str]] = []

    def guard(method: str, path: str) -> None:
        seen.append((method, path))
        raise NotLeading(0, "no")

    api = KubeApi(object(), write_guard=guard)
    with pytest.raises(NotLeading):
        api.request("PATCH", "/apis/apps/v1/namespaces/n/deployments/d/scale", body={})
    assert seen == [("PATCH", "/apis/apps/v1/namespaces/n/deployments/d/scale")]
    # A GET reaches the client (which here is not one): the guard is not asked.
    with pytest.raises(AttributeError):
        api.request("GET", "/api/v1/pods")
    assert len(seen) == 1


class OutageLock:
    """A LeaseLock during an API-server outage: urllib3 errors, not ApiException."""

    name = "flexinfer-controller"
    namespace = "ns"
    identity = "one"

    def __init__(self) -> None:
        self.calls = 0

    def get(self, name: str, namespace: str) -> Any:
        self.calls += 1
        raise urllib3.exceptions.MaxRetryError(None, "/lease", "connection refused")  # type: ignore[arg-type]


def test_a_failing_lock_is_a_failed_attempt_not_a_dead_thread() -> None:
    lock = OutageLock()
    config = electionconfig.Config(  # type: ignore[no-untyped-call]
        lock, lease_duration=15, renew_deadline=10, retry_period=2,
        onstarted_leading=lambda: None, onstopped_leading=lambda: None,
    )
    ticks = Ticks()
    leadership = Leadership(renew_deadline=10, on_lost=lambda why: None, monotonic=ticks)
    election = _FencedElection(config, leadership, ticks)
    assert election.try_acquire_or_renew() is False
    assert election.try_acquire_or_renew() is False
    assert lock.calls == 2
    assert not leadership.leading


def test_health_fails_once_the_election_thread_is_gone() -> None:
    leadership = Leadership(renew_deadline=10, on_lost=lambda why: None)
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    leadership.thread = thread
    assert leadership.healthy() == (False, "leader election thread stopped")
