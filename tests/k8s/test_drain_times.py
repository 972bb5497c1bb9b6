"""`flexinfer_drain_seconds`: once per drain, from its recorded start, with its outcome."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from flexinfer_k8s.drain_times import DrainTimes
from flexinfer_k8s.metrics import ControllerMetrics

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def sample(registry: CollectorRegistry, name: str, outcome: str) -> float:
    value = registry.get_sample_value(
        name, {"namespace": "ns", "model": "low", "outcome": outcome}
    )
    return 0.0 if value is None else value


def test_a_drain_is_observed_once_with_its_outcome() -> None:
    registry = CollectorRegistry()
    times = DrainTimes(ControllerMetrics(registry))
    deadline = T0 + timedelta(seconds=60)
    # The same drain seen ending by two reconciles (a status conflict, a retry).
    for late in (0, 2):
        times.drain_ended(
            namespace="ns",
            model="low",
            since=T0,
            deadline=deadline,
            ended=T0 + timedelta(seconds=12 + late),
        )
    assert sample(registry, "flexinfer_drain_seconds_count", "drained") == 1
    assert sample(registry, "flexinfer_drain_seconds_sum", "drained") == 12.0
    assert sample(registry, "flexinfer_drain_seconds_count", "deadline") == 0
    # A later drain of the same model, ended by its deadline.
    later = T0 + timedelta(minutes=5)
    times.drain_ended(
        namespace="ns",
        model="low",
        since=later,
        deadline=later + timedelta(seconds=3),
        ended=later + timedelta(seconds=3),
    )
    assert sample(registry, "flexinfer_drain_seconds_count", "deadline") == 1
    assert sample(registry, "flexinfer_drain_seconds_sum", "deadline") == 3.0
    assert sample(registry, "flexinfer_drain_seconds_count", "drained") == 1
