"""docs/election.md 4: a standalone ModelDeployment scales to zero when idle."""

from __future__ import annotations

from datetime import timedelta, timezone
from typing import Any

import attrs
import pytest

from flexinfer_core import (
    InvalidFieldError,
    StandaloneDeployment,
    decide_standalone,
    reasons,
)

from .builders import T0, ago


def md(**fields: Any) -> StandaloneDeployment:
    return StandaloneDeployment("chat", **fields)


@pytest.mark.parametrize(
    ("fields", "replicas", "reason"),
    [
        pytest.param({}, 0, reasons.IDLE_SCALE_TO_ZERO, id="never-used-min-0"),
        pytest.param({"min_replicas": 1}, 1, reasons.IDLE_MIN_REPLICAS, id="never-used-min-1"),
        pytest.param({"last_access_time": ago(1)}, 1, reasons.IN_USE, id="fresh-request"),
        pytest.param(
            {"last_access_time": ago(1), "replicas": 3}, 3, reasons.IN_USE, id="in-use-replicas"
        ),
        pytest.param(
            {"last_access_time": ago(1), "replicas": 0}, 1, reasons.IN_USE, id="in-use-at-least-1"
        ),
        pytest.param({"last_access_time": ago(299)}, 1, reasons.IN_USE, id="just-before-timeout"),
        pytest.param(
            {"last_access_time": ago(300)}, 0, reasons.IDLE_SCALE_TO_ZERO, id="exactly-timeout"
        ),
        pytest.param(
            {"last_access_time": ago(301)}, 0, reasons.IDLE_SCALE_TO_ZERO, id="after-timeout"
        ),
        pytest.param(
            {"last_access_time": ago(900), "min_replicas": 2, "replicas": 3},
            2,
            reasons.IDLE_MIN_REPLICAS,
            id="idle-never-below-min",
        ),
        pytest.param(
            {"last_access_time": ago(1), "min_replicas": 2, "replicas": 3},
            3,
            reasons.IN_USE,
            id="in-use-above-min",
        ),
        pytest.param(
            {"last_access_time": T0 + timedelta(seconds=2)},
            1,
            reasons.IN_USE,
            id="request-ahead-of-our-clock",
        ),
        pytest.param(
            {"last_access_time": ago(0), "idle_timeout": timedelta(0)},
            0,
            reasons.IDLE_SCALE_TO_ZERO,
            id="zero-idle-timeout",
        ),
    ],
)
def test_desired_replicas(fields: dict[str, Any], replicas: int, reason: str) -> None:
    decision = decide_standalone(md(**fields), now=T0)
    assert (decision.desired_replicas, decision.reason) == (replicas, reason)


def test_next_change_is_the_idle_timeout_lapse() -> None:
    decision = decide_standalone(md(last_access_time=ago(100)), now=T0)
    assert decision.next_change_at == T0 + timedelta(seconds=200)
    lapsed = decide_standalone(md(last_access_time=ago(300)), now=T0)
    assert lapsed.next_change_at is None
    assert decide_standalone(md(), now=T0).next_change_at is None


def test_idle_scales_to_zero_once_and_then_is_quiet() -> None:
    idle = md(last_access_time=ago(400), current_replicas=1, ready_replicas=1)
    decision = decide_standalone(idle, now=T0)
    assert decision.scale_to == 0
    assert decision.event is not None
    assert decision.event.reason == reasons.IDLE_SCALE_TO_ZERO
    again = decide_standalone(
        attrs.evolve(idle, current_replicas=0, ready_replicas=0), now=T0 + timedelta(seconds=5)
    )
    assert (again.scale_to, again.event) == (None, None)
    assert (again.reason, again.message) == (decision.reason, decision.message)


def test_request_at_zero_scales_up_to_replicas() -> None:
    woken = md(replicas=2, last_access_time=ago(0), current_replicas=0)
    decision = decide_standalone(woken, now=T0)
    assert decision.scale_to == 2
    assert decision.reason == reasons.IN_USE
    assert decision.event is not None
    assert decision.event.reason == reasons.DEMAND_SCALE_UP
    settled = decide_standalone(attrs.evolve(woken, current_replicas=2), now=T0)
    assert (settled.scale_to, settled.reason) == (None, reasons.IN_USE)


def test_message_does_not_change_while_time_passes() -> None:
    state = md(last_access_time=ago(10), current_replicas=1, ready_replicas=1)
    first = decide_standalone(state, now=T0)
    later = decide_standalone(state, now=T0 + timedelta(seconds=100))
    assert (first.reason, first.message) == (later.reason, later.message)


def test_no_deployment_means_nothing_to_scale() -> None:
    decision = decide_standalone(md(last_access_time=ago(0)), now=T0)
    assert (decision.desired_replicas, decision.scale_to, decision.event) == (1, None, None)


def test_cold_start_keeps_a_woken_deployment_up_until_a_pod_is_ready() -> None:
    starting = md(
        idle_timeout=timedelta(seconds=5),
        cold_start_timeout=timedelta(seconds=60),
        last_access_time=ago(10),
        current_replicas=1,
        ready_replicas=0,
    )
    decision = decide_standalone(starting, now=T0)
    assert (decision.desired_replicas, decision.scale_to) == (1, None)
    assert decision.reason == reasons.COLD_START
    assert decision.next_change_at == T0 + timedelta(seconds=50)
    # Once a pod is ready the idle timeout rules again.
    ready = decide_standalone(attrs.evolve(starting, ready_replicas=1), now=T0)
    assert (ready.scale_to, ready.reason) == (0, reasons.IDLE_SCALE_TO_ZERO)
    # A load that outlasts the cold start timeout is given up on.
    late = decide_standalone(starting, now=T0 + timedelta(seconds=50))
    assert late.scale_to == 0


@pytest.mark.parametrize(
    ("fields", "field", "value"),
    [
        ({"replicas": -1}, "StandaloneDeployment(chat).replicas", -1),
        ({"min_replicas": -1}, "StandaloneDeployment(chat).min_replicas", -1),
        ({"min_replicas": 2, "replicas": 1}, "StandaloneDeployment(chat).min_replicas", 2),
        ({"idle_timeout": timedelta(seconds=-1)}, "StandaloneDeployment(chat).idle_timeout", None),
        ({"current_replicas": -2}, "StandaloneDeployment(chat).current_replicas", -2),
        (
            {"last_access_time": T0.replace(tzinfo=None)},  # naive
            "StandaloneDeployment(chat).last_access_time",
            None,
        ),
    ],
)
def test_invalid_fields_name_the_field_and_value(
    fields: dict[str, Any], field: str, value: object
) -> None:
    with pytest.raises(InvalidFieldError) as raised:
        md(**fields)
    assert raised.value.field == field
    assert str(raised.value).startswith(field)
    if value is not None:
        assert raised.value.value == value


def test_name_is_required() -> None:
    with pytest.raises(InvalidFieldError, match=r"StandaloneDeployment\.name"):
        StandaloneDeployment("")


def test_aware_times_in_other_zones_compare_as_instants() -> None:
    last = (T0 - timedelta(seconds=10)).astimezone(timezone(timedelta(hours=2)))
    assert decide_standalone(md(last_access_time=last), now=T0).reason == reasons.IN_USE


def test_defaults_follow_the_crd() -> None:
    state = StandaloneDeployment("x")
    assert (state.replicas, state.min_replicas) == (1, 0)
    assert state.idle_timeout == timedelta(seconds=300)
    assert state.cold_start_timeout == timedelta(seconds=60)


def test_values_that_would_overflow_a_decision_name_the_field() -> None:
    """idleTimeoutSeconds 10**12 and replicas 3e9 passed the CRD (no maximum): the first
    overflowed `now + idle`, the second every scale call. Both are now a clear error."""
    with pytest.raises(InvalidFieldError, match=r"idle_timeout: 1e\+12s is too long"):
        StandaloneDeployment(name="d", idle_timeout=timedelta(seconds=10**12))
    with pytest.raises(InvalidFieldError, match=r"replicas: 3000000000 must be between 0 and"):
        StandaloneDeployment(name="d", replicas=3_000_000_000)


def test_a_model_deployment_whose_cache_is_not_ready_is_held_at_zero() -> None:
    state = StandaloneDeployment(
        name="d", last_access_time=ago(1), current_replicas=1, cache_ready=False
    )
    decision = decide_standalone(state, now=T0)
    assert (decision.desired_replicas, decision.scale_to) == (0, 0)
    assert decision.reason == reasons.CACHE_NOT_READY
    assert not decision.may_serve
    assert decision.event is not None and decision.event.type == "Normal"
    ready = decide_standalone(attrs.evolve(state, cache_ready=True), now=T0)
    assert ready.desired_replicas == 1


def test_a_last_access_time_from_the_year_9999_is_read_as_now_said_and_rewritten() -> None:
    """Read as recorded it kept the ModelDeployment in use, never scaled to zero."""
    future = T0.replace(year=9999)
    state = md(last_access_time=future, current_replicas=1, ready_replicas=1)
    decision = decide_standalone(state, now=T0)
    assert decision.reason == reasons.IN_USE  # in use as of now, not as of 9999
    assert decision.next_change_at == T0 + timedelta(seconds=300)
    assert decision.rewrite_last_access_time == T0
    assert decision.message.endswith(
        f"status.lastAccessTime {future.isoformat()} is in the future and is read as now"
    )
    assert decision.warning is not None and decision.warning.type == "Warning"
    assert decision.warning.reason == reasons.TIMESTAMP_IN_FUTURE
    rewritten = attrs.evolve(state, last_access_time=T0)
    later = decide_standalone(rewritten, now=T0 + timedelta(seconds=301))
    assert (later.desired_replicas, later.reason) == (0, reasons.IDLE_SCALE_TO_ZERO)
    assert later.warning is None and later.rewrite_last_access_time is None
    skewed = decide_standalone(md(last_access_time=T0 + timedelta(seconds=5)), now=T0)
    assert (skewed.warning, skewed.rewrite_last_access_time) == (None, None)
