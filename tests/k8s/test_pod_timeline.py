"""The pod watch that proves break-before-make must be able to fail: an overlap is a
violation, and a watch that dies is a failure at stop(), never a quiet pass."""

# ruff: noqa: F811

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_kube.kubeapi import Transient
from flexinfer_kube.resources import PODS
from tests.polling import wait_until

from .harness import Cluster, PodTimeline, cluster, crds, kubectl  # noqa: F401

pytestmark = pytest.mark.k8s


def pod(name: str, model: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "flexinfer",
                                              "ai.flexinfer/model": model}},
        "spec": {"containers": [{"name": "c", "image": "x"}],
                 "nodeSelector": {"type": "no-such-node"}},  # never scheduled: stays put
    }


def test_an_overlap_is_a_violation(cluster: Cluster) -> None:
    c = cluster
    timeline = PodTimeline(c)
    c.api.create(PODS, c.namespace, pod("a-1", "a"))
    c.api.create(PODS, c.namespace, pod("b-1", "b"))
    timeline.stop()
    assert timeline.violations == ["pod b-1 of b created while ['a'] had pods"]


def test_a_watch_that_dies_fails_the_test_at_stop(cluster: Cluster, monkeypatch: Any) -> None:
    c = cluster

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise Transient(0, "connection refused")

    monkeypatch.setattr(PodTimeline, "MAX_FAILURES", 2)
    monkeypatch.setattr(c.api, "watch", broken)
    timeline = PodTimeline(c)
    wait_until(lambda: timeline.failure, what="the watch to give up")
    monkeypatch.undo()
    c.api.create(PODS, c.namespace, pod("a-1", "a"))
    c.api.create(PODS, c.namespace, pod("b-1", "b"))  # an overlap it never sees
    with pytest.raises(AssertionError, match="the pod timeline is broken: 3 watch failures"):
        timeline.stop()
    assert timeline.violations == []  # exactly why a quiet timeline must not pass


def test_a_finished_pod_holds_nothing_but_a_terminating_one_does(cluster: Cluster) -> None:
    # As the controller counts them: Succeeded or Failed runs nothing and the kubelet has
    # freed its device, though its object may linger until deleted; a pod being deleted
    # whose containers may still run holds its GPU until it is gone.
    c = cluster
    timeline = PodTimeline(c)
    c.api.create(PODS, c.namespace, pod("a-1", "a"))
    c.api.patch(PODS, c.namespace, "a-1", {"status": {"phase": "Succeeded"}}, subresource="status")
    wait_until(lambda: "a-1" not in timeline.live, what="a-1 to count as finished")
    c.api.create(PODS, c.namespace, pod("b-1", "b"))  # no overlap: a-1 is over
    held = pod("c-1", "c")
    held["metadata"]["finalizers"] = ["flexinfer.test/hold"]
    c.api.create(PODS, c.namespace, held)
    c.api.delete(PODS, c.namespace, "b-1")
    c.api.delete(PODS, c.namespace, "c-1")  # terminating, held by its finalizer
    c.api.create(PODS, c.namespace, pod("d-1", "d"))
    c.api.patch(PODS, c.namespace, "c-1", {"metadata": {"finalizers": None}})
    timeline.stop()
    assert timeline.violations == [
        "pod c-1 of c created while ['b'] had pods",
        "pod d-1 of d created while ['c'] had pods",
    ]
