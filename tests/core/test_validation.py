"""Bad input raises a FlexinferError naming the field and the value."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from flexinfer_core import (
    FlexinferError,
    GpuGroupMember,
    GpuLease,
    InconsistentGroupError,
    InvalidFieldError,
    ModelState,
    Serverless,
    decide_group,
    elect_leader,
)

from .builders import T0, member


@pytest.mark.parametrize("priority", [-1, 1001, 5000])
def test_priority_out_of_range(priority: int) -> None:
    with pytest.raises(InvalidFieldError) as err:
        ModelState("chat", priority=priority)
    assert "priority" in str(err.value) and str(priority) in str(err.value)
    assert "between 0 and 1000" in str(err.value)


def test_priority_bounds_accepted() -> None:
    assert ModelState("a", priority=0).priority == 0
    assert ModelState("a", priority=1000).priority == 1000


def test_naive_datetime_rejected() -> None:
    naive = datetime(2026, 3, 1, 12, 0)  # noqa: DTZ001 - the point of the test
    with pytest.raises(InvalidFieldError, match=r"last_active.*naive"):
        ModelState("chat", last_active=naive)


def test_negative_cooldown_rejected() -> None:
    with pytest.raises(InvalidFieldError, match=r"swap_cooldown: -5s is negative"):
        ModelState("chat", swap_cooldown=timedelta(seconds=-5))


def test_min_replicas_range() -> None:
    with pytest.raises(InvalidFieldError, match=r"min_replicas.*11"):
        Serverless(min_replicas=11)


def test_unknown_phase_rejected() -> None:
    with pytest.raises(ValueError, match="Running"):
        ModelState("chat", phase="Running")


def test_empty_name_rejected() -> None:
    with pytest.raises(InvalidFieldError, match="name"):
        ModelState("")


def test_lease_needs_group() -> None:
    with pytest.raises(InvalidFieldError, match="group"):
        GpuLease(name="l", group="")


def test_gpugroup_member_queue_not_negative() -> None:
    with pytest.raises(InvalidFieldError, match=r"queued.*-1"):
        GpuGroupMember("a", queued=-1)


def test_members_of_two_groups_are_not_one_group() -> None:
    with pytest.raises(InconsistentGroupError, match="other"):
        elect_leader([member("a"), member("b", group="other")], now=T0)


def test_duplicate_member_rejected() -> None:
    with pytest.raises(InconsistentGroupError, match="twice"):
        decide_group([member("a"), member("a")], now=T0)


def test_all_core_errors_share_a_base() -> None:
    assert issubclass(InvalidFieldError, FlexinferError)
    assert issubclass(InconsistentGroupError, FlexinferError)
