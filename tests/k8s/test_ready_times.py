"""`flexinfer_swap_seconds` and `flexinfer_cold_start_seconds` from pods' own timestamps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from flexinfer_core.timestamps import format_rfc3339
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_k8s.ready_times import ReadyTimes

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def pod(uid: str, *, created: datetime, ready_at: datetime | None) -> dict[str, Any]:
    conditions = []
    if ready_at is not None:
        conditions.append(
            {"type": "Ready", "status": "True", "lastTransitionTime": format_rfc3339(ready_at)}
        )
    return {
        "metadata": {"uid": uid, "creationTimestamp": format_rfc3339(created)},
        "status": {"conditions": conditions},
    }


def sample(registry: CollectorRegistry, name: str, model: str = "chat") -> float:
    value = registry.get_sample_value(name, {"namespace": "ns", "model": model})
    return 0.0 if value is None else value


def test_a_ready_pod_is_observed_once_from_its_own_timestamps() -> None:
    registry = CollectorRegistry()
    times = ReadyTimes(ControllerMetrics(registry), since=T0)
    handed = T0 + timedelta(seconds=1)
    fresh = pod("p1", created=T0 + timedelta(seconds=3), ready_at=T0 + timedelta(seconds=15))
    for _ in range(3):  # every reconcile sees it; it counts once
        times.pods_seen([fresh], namespace="ns", model="chat", handed_over_at=handed)
    assert sample(registry, "flexinfer_cold_start_seconds_count") == 1
    assert sample(registry, "flexinfer_cold_start_seconds_sum") == 12.0
    assert sample(registry, "flexinfer_swap_seconds_count") == 1
    assert sample(registry, "flexinfer_swap_seconds_sum") == 14.0


def test_what_is_not_a_fresh_swap_is_not_counted_as_one() -> None:
    registry = CollectorRegistry()
    times = ReadyTimes(ControllerMetrics(registry), since=T0)
    loading = pod("p1", created=T0, ready_at=None)
    before_start = pod("p2", created=T0 - timedelta(minutes=5), ready_at=T0 - timedelta(minutes=4))
    # Made before the handover (e.g. a restart of the holder): a cold start, not a swap.
    restarted = pod("p3", created=T0, ready_at=T0 + timedelta(seconds=4))
    times.pods_seen(
        [loading, before_start, restarted],
        namespace="ns",
        model="chat",
        handed_over_at=T0 + timedelta(seconds=1),
    )
    assert sample(registry, "flexinfer_cold_start_seconds_count") == 1
    assert sample(registry, "flexinfer_swap_seconds_count") == 0
    # The loading pod, once Ready, is observed then.
    ready = pod("p1", created=T0, ready_at=T0 + timedelta(seconds=9))
    times.pods_seen([ready], namespace="ns", model="chat", handed_over_at=T0)
    assert sample(registry, "flexinfer_cold_start_seconds_count") == 2
    assert sample(registry, "flexinfer_swap_seconds_sum") == 9.0
