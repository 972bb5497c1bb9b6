"""A shared group's default member (docs/election.md 1.5): rules 8 and 9, its warm
replicas, two marked members, and the timer and explain's words for its return."""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from flexinfer_core import (
    GpuLease,
    ModelState,
    Phase,
    Serverless,
    SharedState,
    apply_decision,
    decide_group,
    elect_leader,
    next_change_at,
    reasons,
)
from flexinfer_core.election import Ballot, Threshold, crossings, explain_election
from flexinfer_core.explain import explain_group

from .builders import T0, ago, member

READY, IDLE, ACTIVE = Phase.READY, Phase.IDLE, SharedState.ACTIVE
# Longer than the 2m demand window: the holder's own demand lapses first, so its idle
# timeout is what the default waits for.
QUICK = Serverless(idle_timeout=timedelta(seconds=150))


def chat(**fields: object) -> ModelState:
    """The default: priority 100 unless told."""
    return member("chat", default_member=True, **fields)  # type: ignore[arg-type]


def coder(**fields: object) -> ModelState:
    """The holder: Active, idle timeout 2m30s."""
    fields.setdefault("shared_state", ACTIVE)
    fields.setdefault("serverless", QUICK)
    return member("coder", **fields)  # type: ignore[arg-type]


def leader(*models: ModelState, **kwargs: object) -> tuple[str | None, str]:
    election = elect_leader(models, now=T0, **kwargs)  # type: ignore[arg-type]
    return election.leader_name, election.reason


# --- rule 9: return to default ----------------------------------------------------------


def test_the_default_returns_once_the_holder_scaled_itself_to_zero() -> None:
    holder = coder(phase=IDLE, last_active=ago(151))
    assert leader(chat(), holder) == ("chat", reasons.RETURN_TO_DEFAULT)
    # Whatever the priorities: the default is what the card goes back to.
    assert leader(chat(priority=0), attrs.evolve(holder, priority=1000))[0] == "chat"
    message = elect_leader([chat(), holder], now=T0).message
    assert message == (
        "chat is the group's default and takes the card back: nobody else is demanded "
        "and coder is idle past its 2m30s idle timeout"
    )


def test_the_default_waits_for_the_holders_idle_timeout() -> None:
    # At exactly the idle timeout the holder is not yet idle past it (strictly older).
    assert leader(chat(), coder(phase=IDLE, last_active=ago(150)))[0] == "coder"
    assert leader(chat(), coder(phase=IDLE, last_active=ago(150.000001)))[0] == "chat"
    why = _why(9, chat(), coder(phase=READY, last_active=ago(130)))
    assert why.startswith("coder is in use: idle 2m10s of its 2m30s idle timeout")
    # The holder's own demand counts too: inside the demand window it is demanded.
    short = coder(phase=IDLE, last_active=ago(60), serverless=Serverless(idle_timeout=timedelta(0)))
    assert leader(chat(), short)[0] == "coder"
    assert leader(chat(), attrs.evolve(short, last_active=ago(121)))[0] == "chat"


def test_a_ready_holder_that_scales_to_zero_goes_first_so_nothing_is_evicted() -> None:
    holder = coder(phase=READY, last_active=ago(151))
    assert leader(chat(), holder) == ("coder", reasons.READY_LEADER)
    decision = decide_group([chat(), holder], now=T0)
    assert decision.member("coder").desired_replicas == 0  # it scales itself to zero
    assert "still Ready: it scales itself to zero first" in _why(9, chat(), holder)
    # Once it has, the default takes the card: no eviction, no preemptedAt, no cooldown.
    scaled = attrs.evolve(holder, phase=IDLE)
    decision = decide_group([chat(), scaled], now=T0)
    assert decision.leader == "chat"
    assert decision.member("coder").phase is IDLE
    assert decision.member("coder").preempted_at is None


@pytest.mark.parametrize(
    "serverless", [Serverless(enabled=False), Serverless(min_replicas=1, idle_timeout=timedelta(0))]
)
def test_a_holder_that_never_scales_to_zero_is_evicted(serverless: Serverless) -> None:
    holder = coder(phase=READY, last_active=ago(301), serverless=serverless)
    decision = decide_group([chat(), holder], now=T0)
    assert (decision.leader, decision.reason) == ("chat", reasons.RETURN_TO_DEFAULT)
    # A real eviction: it starts the swap cooldown, which then holds chat in place.
    assert decision.member("coder").phase is Phase.PREEMPTED
    assert decision.member("coder").preempted_at == T0
    assert decision.member("chat").reason == reasons.SWAP_COOLDOWN


def test_nobody_holds_and_nobody_is_demanded_the_default_leads_at_once() -> None:
    others = member("big", priority=900, serverless=Serverless(min_replicas=1))
    assert leader(chat(priority=0), others) == ("chat", reasons.RETURN_TO_DEFAULT)
    assert "nobody holds the card" in elect_leader([chat(), others], now=T0).message


def test_a_demanded_member_always_beats_the_return() -> None:
    for priority in (0, 100, 1000):
        asker = member("asker", priority=priority, last_active=ago(119))
        holder = coder(phase=IDLE, last_active=ago(301))
        assert leader(chat(priority=500), holder, asker) == ("asker", reasons.RECENT_DEMAND)
        assert "asker is demanded" in _why(9, chat(), asker)
    # The demanded holder keeps the card: the default is not demanded itself.
    assert leader(chat(priority=500), coder(phase=READY, last_active=ago(1))) == (
        "coder",
        reasons.READY_LEADER,
    )


def test_a_lease_forcepromotion_a_cooldown_and_a_loading_holder_come_first() -> None:
    holder = coder(phase=IDLE, last_active=ago(200))
    lease = GpuLease(name="ft", group="homelab-gpu")
    assert leader(chat(), holder, leases=[lease]) == (None, reasons.GPU_LEASE_HELD)
    forced = member("forced", priority=0, force_promotion=True)
    assert leader(chat(), holder, forced) == ("forced", reasons.FORCE_PROMOTED)
    victim = member("victim", phase=Phase.PREEMPTED, preempted_at=ago(299))
    assert leader(chat(), holder, victim) == ("coder", reasons.SWAP_COOLDOWN)
    cooled = attrs.evolve(victim, preempted_at=ago(300))
    assert leader(chat(), holder, cooled) == ("chat", reasons.RETURN_TO_DEFAULT)
    # Loading, idle past its own idle timeout but inside its load grace (5m).
    loading = coder(phase=Phase.LOADING, last_active=ago(200))
    assert leader(chat(), loading) == ("coder", reasons.LOADING_HOLDER)


def test_a_default_that_cannot_run_does_not_return() -> None:
    holder = coder(phase=IDLE, last_active=ago(200))
    assert leader(chat(phase=Phase.FAILED), holder)[0] == "coder"
    assert leader(chat(cache_ready=False), holder)[0] == "coder"
    assert _why(9, chat(cache_ready=False), holder) == (
        "the default chat is not runnable (cache not ready)"
    )
    # A holder that cannot run holds nothing worth waiting for.
    failed = coder(phase=Phase.FAILED, last_active=ago(1))
    assert leader(chat(), failed) == ("chat", reasons.RETURN_TO_DEFAULT)


def test_the_flag_means_nothing_outside_a_shared_group() -> None:
    alone = ModelState(name="solo", default_member=True)
    assert leader(alone) == ("solo", reasons.FALLBACK)
    decision = decide_group([alone], now=T0)
    assert decision.member("solo").desired_replicas == 0


# --- rule 8: the warm default yields --------------------------------------------------


def test_the_idle_default_yields_to_a_lower_priority_demand() -> None:
    warm = chat(priority=500, phase=READY, shared_state=ACTIVE, serverless=QUICK)
    asker = member("asker", priority=0, last_active=ago(1))
    assert leader(warm, asker) == ("asker", reasons.DEFAULT_YIELDS)
    # In use (inside its own idle timeout, or demanded) it keeps the card as any leader.
    assert leader(attrs.evolve(warm, last_active=ago(150)), asker) == ("chat", reasons.READY_LEADER)
    assert leader(attrs.evolve(warm, last_active=ago(150.000001)), asker)[0] == "asker"
    demanded = attrs.evolve(warm, serverless=Serverless(idle_timeout=timedelta(0)))
    assert leader(attrs.evolve(demanded, last_active=ago(1)), asker)[0] == "chat"
    # With nobody demanded it stays.
    assert leader(warm) == ("chat", reasons.RETURN_TO_DEFAULT)


# --- warm replicas ---------------------------------------------------------------------


def test_the_default_stays_warm_while_it_leads() -> None:
    never_asked = chat(phase=READY, shared_state=ACTIVE)
    decision = decide_group([never_asked, member("coder")], now=T0)
    assert decision.member("chat").desired_replicas == 1
    several = attrs.evolve(never_asked, serverless=Serverless(min_replicas=3))
    assert decide_group([several], now=T0).member("chat").desired_replicas == 3
    # Not the default: the same member scales to minReplicas (0) once idle.
    plain = attrs.evolve(never_asked, default_member=False)
    assert decide_group([plain, member("coder")], now=T0).member("chat").desired_replicas == 0


# --- two marked ------------------------------------------------------------------------


def test_with_two_marked_the_higher_priority_then_the_name_is_the_default() -> None:
    a = member("a", default_member=True, priority=100)
    b = member("b", default_member=True, priority=200)
    c = member("c", default_member=True, priority=200)
    ballot = Ballot.of([a, b, c], now=T0)
    assert ballot.default is not None and ballot.default.name == "b"
    assert ballot.ignored_defaults == ("a", "c")
    decision = decide_group([a, b, c], now=T0)
    assert decision.leader == "b"
    note = "spec.gpu.default ignored: b is the group's default (higher priority, then name)"
    assert decision.member("a").message.endswith(note)
    assert decision.member("c").message.endswith(note)
    assert not decision.member("b").message.endswith(note)
    ready = {x.type: x for x in decision.member("a").conditions}["Ready"]
    assert ready.message.endswith(note)
    assert "spec.gpu.default ignored on: a, c" in _why(6, a, b, c)
    # Written once, it is not written again.
    again = decide_group(apply_decision([a, b, c], decision), now=T0)
    assert again.changes(apply_decision([a, b, c], decision)) == ()


# --- the timer and explain ---------------------------------------------------------------


def test_the_timer_wakes_the_controller_when_the_return_is_due() -> None:
    # coder never scales to zero: at its idle timeout the default evicts it.
    always_on = Serverless(min_replicas=1, idle_timeout=timedelta(seconds=150))
    holder = coder(phase=READY, last_active=ago(121), serverless=always_on)
    due = T0 + timedelta(seconds=29, microseconds=1)
    models = [chat(), holder]
    listed = [c for c in crossings(Ballot.of(models, now=T0)) if c.kind is Threshold.DEFAULT_RETURN]
    assert [(c.at, c.subject) for c in listed] == [(due, "coder")]
    assert next_change_at(models, now=T0) == due
    assert elect_leader(models, now=due - timedelta(microseconds=1)).leader_name == "coder"
    assert elect_leader(models, now=due).leader_name == "chat"
    upcoming = explain_group(models, now=T0).next_change
    assert upcoming is not None
    assert (upcoming.at, upcoming.leader, upcoming.reason) == (
        due,
        "chat",
        reasons.RETURN_TO_DEFAULT,
    )
    assert "the default chat may take the card back" in upcoming.when


def test_the_timer_wakes_the_controller_when_the_default_starts_to_yield() -> None:
    warm = chat(
        phase=READY, shared_state=ACTIVE, last_active=ago(121), priority=500, serverless=QUICK
    )
    asker = member("asker", priority=0, last_active=ago(1))
    due = T0 + timedelta(seconds=29, microseconds=1)
    listed = [
        c for c in crossings(Ballot.of([warm, asker], now=T0)) if c.kind is Threshold.DEFAULT_YIELD
    ]
    assert [(c.at, c.subject) for c in listed] == [(due, "chat")]
    upcoming = explain_group([warm, asker], now=T0).next_change
    assert upcoming is not None
    assert (upcoming.at, upcoming.leader, upcoming.reason) == (
        due,
        "asker",
        reasons.DEFAULT_YIELDS,
    )


def _why(rule: int, *models: ModelState) -> str:
    trace = explain_election(models, now=T0)
    return next(check.why for check in trace.rules if check.number == rule)
