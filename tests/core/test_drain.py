"""Draining before preemption (docs/election.md 1.6): a replaced Ready holder with
fresh requests in flight keeps its pods until they are answered or its drain timeout
ends, the new holder waits, and the deadline wakes the controller."""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from flexinfer_core import Phase, SharedState, apply_decision, decide_group, reasons
from flexinfer_core.annotations import (
    DemandReport,
    InFlightReport,
    format_demand,
    format_in_flight,
    parse_demand,
    parse_in_flight,
)
from flexinfer_core.election import Threshold
from flexinfer_core.group import describe_threshold, thresholds
from flexinfer_core.phases import observed_phase
from tests.core.builders import T0, ago, member

ACTIVE = SharedState.ACTIVE


def _preempting(**chat: object) -> list:
    """chat (priority 100) is the busy Ready holder; coder (priority 200) is demanded."""
    fields = {
        "phase": Phase.READY,
        "shared_state": ACTIVE,
        "last_active": ago(5),
        "replicas": 1,
        "in_flight": 2,
        "in_flight_at": ago(3),
        **chat,
    }
    return [member("chat", **fields), member("coder", priority=200, last_active=ago(1))]


def test_a_busy_holder_with_requests_in_flight_drains_instead_of_being_scaled_to_zero() -> None:
    decision = decide_group(_preempting(), now=T0, running={"chat"})
    assert (decision.leader, decision.reason) == ("coder", reasons.DEMAND_PREEMPTION)
    chat, coder = decision.member("chat"), decision.member("coder")
    assert chat.phase is Phase.DRAINING
    assert chat.desired_replicas == 1
    assert chat.draining_since == T0
    assert chat.preempted_at is None  # the eviction (and its cooldown) comes at the end
    assert chat.reason == reasons.DRAINING
    assert [e.reason for e in decision.events] == [reasons.PREEMPTED]
    assert "drains its 2 request(s) in flight first" in decision.events[0].message
    # break-before-make: the new holder waits, and says for whom and until when
    assert coder.desired_replicas == 0
    assert coder.reason == reasons.WAITING_FOR_GPU
    assert coder.message == (
        "coder holds the GPU and is waiting for chat to drain (2 in flight, until 12:01:00)"
    )


@pytest.mark.parametrize(
    "chat",
    [
        pytest.param({"in_flight": 0}, id="nothing-in-flight"),
        pytest.param({"in_flight_at": None}, id="undated-report"),
        pytest.param({"in_flight_at": ago(301)}, id="stale-report"),
        pytest.param({"drain_timeout": timedelta(0)}, id="drain-timeout-0"),
        pytest.param({"replicas": 0}, id="already-at-zero"),
    ],
)
def test_no_drain_without_fresh_requests_in_flight_or_with_drain_timeout_zero(
    chat: dict[str, object],
) -> None:
    decision = decide_group(_preempting(**chat), now=T0, running={"chat"})
    assert decision.member("chat").phase is Phase.PREEMPTED
    assert decision.member("chat").desired_replicas == 0
    assert decision.member("chat").preempted_at == T0


def _draining(**chat: object) -> list:
    """chat drains since T0 - 10s (60s timeout); coder holds the card and waits."""
    fields = {
        "phase": Phase.DRAINING,
        "shared_state": SharedState.QUEUED,
        "draining_since": ago(10),
        "preempted_by": "coder",
        "last_active": ago(5),
        "replicas": 1,
        "in_flight": 1,
        "in_flight_at": ago(3),
        **chat,
    }
    return [
        member("chat", **fields),
        member("coder", priority=200, last_active=ago(1), shared_state=ACTIVE, replicas=0),
    ]


def test_the_drain_goes_on_while_requests_are_in_flight_and_the_deadline_is_ahead() -> None:
    decision = decide_group(_draining(), now=T0, running={"chat"})
    chat = decision.member("chat")
    assert (chat.phase, chat.desired_replicas, chat.draining_since) == (
        Phase.DRAINING,
        1,
        ago(10),  # kept from the status: a restarted controller reads the same deadline
    )
    assert decision.member("coder").desired_replicas == 0
    assert decision.next_change_at == ago(10) + timedelta(seconds=60)
    assert decision.events == ()


@pytest.mark.parametrize(
    ("chat", "now"),
    [
        pytest.param({"in_flight": 0}, T0, id="in-flight-reaches-0"),
        pytest.param({}, ago(10) + timedelta(seconds=60), id="deadline"),
        pytest.param({"in_flight_at": ago(301)}, T0, id="report-stale"),
        pytest.param({"draining_since": None}, T0, id="no-drainingSince"),
    ],
)
def test_the_drain_ends_at_zero_in_flight_or_at_the_deadline(
    chat: dict[str, object], now: object
) -> None:
    models = _draining(**chat)
    decision = decide_group(models, now=now, running={"chat"})  # type: ignore[arg-type]
    ended = decision.member("chat")
    assert (ended.phase, ended.desired_replicas, ended.draining_since) == (
        Phase.PREEMPTED,
        0,
        None,
    )
    assert ended.preempted_at == now  # the real eviction starts the cooldown
    assert ended.preempted_by == "coder"
    # still break-before-make: the pods are not gone yet
    assert decision.member("coder").desired_replicas == 0
    assert decision.member("coder").message == (
        "coder holds the GPU and waits for the pods of chat to be gone before scaling up"
    )
    # once they are, the holder starts
    gone = apply_decision(models, decision)
    after = decide_group(gone, now=now, running=set())  # type: ignore[arg-type]
    assert after.member("coder").desired_replicas == 1


def test_the_drain_deadline_is_a_crossing_said_by_the_drain() -> None:
    models = _draining()
    crossing = next(c for c in thresholds(models, now=T0) if c.kind is Threshold.DRAIN_DEADLINE)
    assert (crossing.at, crossing.subject) == (ago(10) + timedelta(seconds=60), "chat")
    assert describe_threshold(models, crossing, now=T0) == (
        "chat's 1m drain timeout ends: it is scaled to 0 whatever is still in flight"
    )
    stale = next(c for c in thresholds(models, now=T0) if c.kind is Threshold.IN_FLIGHT_STALE)
    assert stale.at == ago(3) + timedelta(minutes=5, microseconds=1)


def test_a_drainer_the_election_wants_back_goes_on_serving_without_a_restart() -> None:
    # coder is no longer demanded (its last request left the demand and recent windows)
    models = _draining()
    models[1] = attrs.evolve(models[1], last_active=ago(minutes=10))
    decision = decide_group(models, now=T0, running={"chat"})
    assert decision.leader == "chat"
    chat = decision.member("chat")
    assert (chat.phase, chat.state, chat.draining_since) == (Phase.READY, ACTIVE, None)
    assert chat.desired_replicas == 1
    assert chat.preempted_at is None


def test_the_drain_written_then_decided_again_writes_nothing() -> None:
    models = _preempting()
    decision = decide_group(models, now=T0, running={"chat"})
    written = apply_decision(models, decision)
    again = decide_group(written, now=T0 + timedelta(seconds=1), running={"chat"})
    assert again.changes(written) == ()


def test_observed_phase_keeps_draining_while_a_pod_is_ready() -> None:
    assert observed_phase(Phase.DRAINING, replicas=1, pods=1, ready_pods=1) is Phase.DRAINING
    assert observed_phase(Phase.DRAINING, replicas=1, pods=1, ready_pods=0) is Phase.LOADING
    assert observed_phase(Phase.DRAINING, replicas=0, pods=1, ready_pods=1) is Phase.IDLE


def test_in_flight_wire_formats_round_trip() -> None:
    report = InFlightReport(count=2, reported_at=T0)
    assert format_in_flight(report) == {"count": 2, "reportedAt": "2026-03-01T12:00:00Z"}
    assert parse_in_flight(format_in_flight(report)) == report
    for bad in (None, {}, {"count": -1}, {"count": True}, {"count": "2"}, [2]):
        assert parse_in_flight(bad) is None
    demand = DemandReport(queued=0, reported_at=T0, in_flight=3)
    assert format_demand(demand) == (
        '{"queued": 0, "inFlight": 3, "reportedAt": "2026-03-01T12:00:00Z"}'
    )
    assert parse_demand(format_demand(demand)) == demand
    assert not demand.empty and DemandReport(queued=0).empty
    assert parse_demand('{"queued": 1, "inFlight": -2}') == DemandReport(queued=1)


def test_explain_says_the_drain_and_its_deadline() -> None:
    from flexinfer_core.explain import explain_group

    models = _draining()
    explanation = explain_group(models, now=T0, running={"chat"})
    assert explanation.drain == (
        "chat drains its requests in flight before it is scaled to 0 (1 in flight, "
        "deadline 2026-03-01T12:00:50+00:00)"
    )
    assert "waiting for chat to drain (1 in flight, until 12:00:50)" in (
        explanation.decision.member("coder").message
    )
    first = explanation.upcoming[0]
    assert first.at == ago(10) + timedelta(seconds=60)
    assert "chat's 1m drain timeout ends" in first.when
    # Nobody drains: nothing to say.
    assert explain_group(_preempting(in_flight=0), now=T0, running={"chat"}).drain is None


def test_a_draining_holders_own_stamp_does_not_hold_the_card() -> None:
    # Found by the drain property suite: an Active holder whose observed phase is
    # Draining and which carries a recent preemptedAt of its own. Kept, it would serve
    # on (Ready) and lose its stamp, so the next decision with no news preempted it: a
    # swap one reconcile late. Its own stamp is no cooldown; the demanded member takes
    # the card at once, and the decision is a fixed point.
    models = [
        member("alpha", last_active=T0),
        member("beta", phase=Phase.DRAINING, shared_state=ACTIVE, preempted_at=T0),
    ]
    first = decide_group(models, now=T0)
    assert first.leader == "alpha"
    assert first.election.reason != reasons.SWAP_COOLDOWN
    applied = apply_decision(models, first)
    again = decide_group(applied, now=T0)
    assert again.leader == "alpha"
    assert again.changes(applied) == ()
