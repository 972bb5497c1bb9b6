"""What `--log-level debug` says about each reconcile, and what it leaves out.

No cluster: the controller's cache is empty and its clock for queue times is replaced
by one the test moves, so the figures are the test's, not the machine's.
"""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from flexinfer_k8s import controller as controller_module
from flexinfer_k8s import workqueue as workqueue_module
from flexinfer_k8s.controller import Controller
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_k8s.outcome import Outcome
from flexinfer_kube import logs
from flexinfer_kube.kubeapi import KubeApi


class FakeTime:
    """`time` as the queue and the controller read it: a monotonic clock the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def test_a_reconcile_says_how_long_its_key_waited_and_how_long_it_took(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ctl = Controller(KubeApi(api_client=None), metrics=ControllerMetrics(CollectorRegistry()),
                     namespaces=["ns"])
    clock = FakeTime(10.0)
    monkeypatch.setattr(workqueue_module, "time", clock)
    monkeypatch.setattr(controller_module, "time", clock)

    def reconcile(namespace: str, group: str, *, insist: bool) -> Outcome:
        clock.now += 0.25  # its API calls
        return Outcome(None, True)

    monkeypatch.setattr(ctl.shared, "reconcile_group", reconcile)
    key = ("shared", "ns", "g")
    ctl.queue.add(key)  # seen at 10 s
    clock.now = 11.0
    ctl.queue.add(key)  # seen again before a worker is free: still one reconcile
    clock.now = 12.5
    assert ctl.queue.get(timeout=0) == key
    caplog.set_level(logging.DEBUG, logger="flexinfer.controller")
    ctl.process(key)
    lines = [r for r in caplog.records if r.getMessage() == "reconciled"]
    assert len(lines) == 1
    fields = lines[0].fields  # type: ignore[attr-defined]
    assert fields == {"key": ["shared", "ns", "g"], "waited_ms": 2500.0, "took_ms": 250.0,
                      "wrote": True}


def test_debug_is_flexinfers_own_not_the_http_libraries() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        logs.configure("debug")
        assert logging.getLogger("flexinfer.controller").getEffectiveLevel() == logging.DEBUG
        # Every request (urllib3) and response (the Kubernetes client) would be a line.
        assert logging.getLogger("urllib3.connectionpool").getEffectiveLevel() == logging.INFO
        assert logging.getLogger("kubernetes.client.rest").getEffectiveLevel() == logging.INFO
        logs.configure("warning")
        assert logging.getLogger("urllib3").getEffectiveLevel() == logging.WARNING
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        for library in logs.THIRD_PARTY:
            logging.getLogger(library).setLevel(logging.NOTSET)
