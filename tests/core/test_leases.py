"""docs/election.md 2: lease activity, precedence and the finetune lifecycle."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flexinfer_core import (
    FinetuneLeaseInput,
    GpuLease,
    InvalidFieldError,
    JobPhase,
    LeaseAction,
    LeaseSource,
    finetune_lease_ttl,
    governing_lease,
    lease_is_active,
    plan_finetune_lease,
)
from flexinfer_core.leases import lease_holder_label

from .builders import T0


def test_lease_without_expiry_is_active_while_it_exists() -> None:
    assert lease_is_active(GpuLease(name="l", group="g"), T0)


def test_lease_active_strictly_before_expiry() -> None:
    lease = GpuLease(name="l", group="g", expires_at=T0)
    assert lease_is_active(lease, T0 - timedelta(microseconds=1))
    assert not lease_is_active(lease, T0)


def test_gpulease_takes_precedence_over_configmap() -> None:
    cm = GpuLease(name="gpu-lease-g", group="g", owner="legacy", source=LeaseSource.CONFIG_MAP)
    crd = GpuLease(name="ft", group="g", owner="new", expires_at=T0 + timedelta(hours=1))
    chosen = governing_lease([cm, crd], namespace="default", group="g", now=T0)
    assert chosen is crd


def test_expired_gpulease_falls_back_to_active_configmap() -> None:
    cm = GpuLease(name="gpu-lease-g", group="g", source=LeaseSource.CONFIG_MAP)
    crd = GpuLease(name="ft", group="g", expires_at=T0 - timedelta(seconds=1))
    assert governing_lease([crd, cm], namespace="default", group="g", now=T0) is cm


@pytest.mark.parametrize(
    ("ttl", "timeout", "expected"),
    [
        (3600, None, timedelta(seconds=3600)),
        (60, None, timedelta(seconds=60)),
        (None, None, timedelta(seconds=21600 + 600)),
        (None, 1800, timedelta(seconds=2400)),
    ],
)
def test_finetune_lease_ttl(ttl: int | None, timeout: int | None, expected: timedelta) -> None:
    assert finetune_lease_ttl(ttl, timeout_seconds=timeout) == expected


def test_finetune_lease_ttl_minimum_names_field() -> None:
    with pytest.raises(InvalidFieldError, match=r"gpuLease.ttlSeconds: 30 must be between 60 and"):
        finetune_lease_ttl(30)


def _cache(**fields: object) -> FinetuneLeaseInput:
    base: dict[str, object] = {
        "cache_name": "qwen-ft",
        "namespace": "default",
        "group": "5930k-textgen",
        "ttl": timedelta(hours=1),
        "node": "gpu-node-1",
    }
    base.update(fields)
    return FinetuneLeaseInput(**base)  # type: ignore[arg-type]


def test_lifecycle_acquire_before_job() -> None:
    plan = plan_finetune_lease(_cache(), now=T0)
    assert plan.action is LeaseAction.CREATE
    assert plan.expires_at == T0 + timedelta(hours=1)
    assert plan.create_job is False  # the Job waits until the lease exists
    assert _cache().lease_name == "qwen-ft-gpu-lease"


def test_lifecycle_job_created_once_lease_exists() -> None:
    plan = plan_finetune_lease(
        _cache(lease_exists=True, lease_expires_at=T0 + timedelta(hours=1)), now=T0
    )
    assert plan.action is LeaseAction.NONE
    assert plan.create_job is True


def test_lifecycle_refresh_while_job_active() -> None:
    stale = _cache(
        lease_exists=True, job=JobPhase.ACTIVE, lease_expires_at=T0 + timedelta(minutes=40)
    )
    plan = plan_finetune_lease(stale, now=T0)
    assert plan.action is LeaseAction.REFRESH
    assert plan.expires_at == T0 + timedelta(hours=1)
    assert plan.create_job is False


def test_lifecycle_fresh_lease_is_not_rewritten() -> None:
    fresh = _cache(
        lease_exists=True, job=JobPhase.ACTIVE, lease_expires_at=T0 + timedelta(minutes=58)
    )
    plan = plan_finetune_lease(fresh, now=T0)
    assert plan.action is LeaseAction.NONE
    # ...until the refresh interval (5m for a 1h TTL) has passed since it was set.
    assert plan.next_change_at == T0 + timedelta(minutes=3)
    assert plan_finetune_lease(fresh, now=plan.next_change_at).action is LeaseAction.REFRESH


@pytest.mark.parametrize("job", [JobPhase.SUCCEEDED, JobPhase.FAILED])
def test_lifecycle_release_when_job_terminal(job: JobPhase) -> None:
    plan = plan_finetune_lease(_cache(lease_exists=True, job=job), now=T0)
    assert plan.action is LeaseAction.DELETE
    assert plan_finetune_lease(_cache(job=job), now=T0).action is LeaseAction.NONE


def test_lifecycle_release_when_cache_deleted() -> None:
    plan = plan_finetune_lease(
        _cache(lease_exists=True, job=JobPhase.ACTIVE, cache_deleted=True), now=T0
    )
    assert plan.action is LeaseAction.DELETE


def test_governing_lease_choice_is_total() -> None:
    # Found by the order-independence property: two look-alike carriers that differ
    # only by owner must not be chosen by listing order.
    a = GpuLease(name="gpu-lease-g", group="g", owner="a", source=LeaseSource.CONFIG_MAP)
    b = GpuLease(name="gpu-lease-g", group="g", owner="b", source=LeaseSource.CONFIG_MAP)
    first = governing_lease([a, b], namespace="default", group="g", now=T0)
    second = governing_lease([b, a], namespace="default", group="g", now=T0)
    assert first is second is a


def test_a_lease_ttl_beyond_thirty_days_names_the_field() -> None:
    """ttlSeconds near 2**62 passed the CRD (no maximum) and overflowed `now + ttl`."""
    with pytest.raises(InvalidFieldError, match=r"ttlSeconds: 4611686018427387904 must be between"):
        finetune_lease_ttl(2**62)
    assert finetune_lease_ttl(2_592_000) == timedelta(days=30)


def test_an_unreadable_lease_is_never_active() -> None:
    broken = GpuLease(name="l", group="g", problem="data.expiresAt: 'x' is not an RFC 3339 time")
    assert not lease_is_active(broken, T0)
    assert governing_lease([broken], namespace="default", group="g", now=T0) is None


@pytest.mark.parametrize(
    ("owner", "expected_bytes"),
    [("job", len("gpu-lease/job")), ("o" * 502, 512), ("o" * 503, 512), ("é" * 600, 511)],
)
def test_the_holder_label_fits_preempted_by(owner: str, expected_bytes: int) -> None:
    """A legacy ConfigMap's owner has no bound; `preemptedBy` has 512 (a longer one was
    refused with 422, and the member kept its pods next to the lease holder)."""
    label = lease_holder_label(GpuLease(name="l", group="g", owner=owner))
    assert len(label.encode()) == expected_bytes
    assert label.startswith("gpu-lease/")
    if len(f"gpu-lease/{owner}".encode()) > 512:
        assert label.endswith("...")
    else:
        assert label == f"gpu-lease/{owner}"
