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
