"""Properties of a shared group's default member (docs/election.md 1.5, rules 8 and 9).

Groups come from the harness's strategies and are then shaped so that the rule under
test is in play; the preconditions are stated with `oracle`'s definitions, written out
independently of the core.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs
from hypothesis import given
from hypothesis import strategies as st

from flexinfer_core import ModelState, Phase, SharedState, apply_decision, reasons
from flexinfer_core.testing import check_invariants, oracle
from flexinfer_core.testing.strategies import (
    SHORT_AGES,
    GroupScenario,
    active_lease,
    group_scenarios,
)

_TICK = timedelta(microseconds=1)


def _at_rest(m: ModelState, now: datetime, extra: timedelta) -> datetime:
    """A `lastActiveTime` past every window and timeout the member is read against: the
    demand window, its idle timeout and its load grace."""
    longest = max(
        oracle.DEMAND_WINDOW,
        oracle.RECENT_WINDOW,
        m.serverless.idle_timeout,
        m.serverless.cold_start_timeout,
    )
    return now - longest - _TICK - extra


@st.composite
def defaults_at_rest(draw: st.DrawFn) -> tuple[GroupScenario, str]:
    """A group with a runnable default D, nobody else demanded, the holder idle past its
    idle timeout (and its load grace) and scaled to zero if it scales to zero by itself,
    no active lease, no forcePromotion, no swap cooldown running."""
    sc = draw(group_scenarios(min_size=1, with_leases=True))
    names = sorted(m.name for m in sc.models)
    default = names[draw(st.integers(0, len(names) - 1))]
    now = sc.now
    window = oracle.cooldown(sc.models, default=sc.policy.default_swap_cooldown)
    models = []
    for m in sc.models:
        m = attrs.evolve(m, force_promotion=False, default_member=m.name == default)
        if m.preempted_at is not None and now - m.preempted_at < window:
            m = attrs.evolve(m, preempted_at=now - window - draw(SHORT_AGES))
        if m.name == default:
            if not oracle.runnable(m):
                m = attrs.evolve(m, phase=Phase.IDLE, cache_ready=True)
        else:
            if m.last_active is not None:
                m = attrs.evolve(m, last_active=_at_rest(m, now, draw(SHORT_AGES)))
            scales_to_zero = m.serverless.enabled and m.serverless.min_replicas == 0
            if m.shared_state is SharedState.ACTIVE and m.phase is Phase.READY and scales_to_zero:
                m = attrs.evolve(m, phase=Phase.IDLE)
        models.append(m)
    leases = tuple(x for x in sc.leases if not active_lease((x,), now))
    return attrs.evolve(sc, models=tuple(models), leases=leases), default


@given(defaults_at_rest())
def test_with_nobody_else_demanded_the_default_leads(case: tuple[GroupScenario, str]) -> None:
    """Past every other member's idle timeout and the cooldown, with no demand and no
    lease, the default holds the card (rule 9; or its own demand by rule 7, or its own
    load by rule 5), and it runs: at least one replica once the card is free."""
    sc, default = case
    decision = check_invariants(sc)
    assert decision.leader == default, (decision.reason, decision.message)
    assert decision.reason in (
        reasons.RETURN_TO_DEFAULT,
        reasons.DEMAND_PREEMPTION,  # its own demand
        reasons.LOADING_HOLDER,  # it holds already and is loading
    )
    leader = decision.member(default)
    if not (sc.running - {default}) or default in sc.running:
        assert leader.desired_replicas >= 1, leader


@st.composite
def demanded_holders(draw: st.DrawFn) -> tuple[GroupScenario, str, str]:
    """A group whose only Active member H is Ready, runnable and demanded, and a default
    D (another member) that is not demanded and not Ready; no lease, no forcePromotion."""
    sc = draw(group_scenarios(min_size=2, with_leases=True))
    names = sorted(m.name for m in sc.models)
    i = draw(st.integers(0, len(names) - 1))
    holder, default = names[i], names[(i + 1 + draw(st.integers(0, len(names) - 2))) % len(names)]
    now = sc.now
    models = []
    for m in sc.models:
        m = attrs.evolve(m, force_promotion=False, default_member=m.name == default)
        if m.name == holder:
            m = attrs.evolve(
                m,
                phase=Phase.READY,
                shared_state=SharedState.ACTIVE,
                cache_ready=True,
                last_active=now - draw(SHORT_AGES) % oracle.DEMAND_WINDOW,
            )
        else:
            m = attrs.evolve(m, shared_state=SharedState.QUEUED)
        if m.name == default:
            if m.last_active is not None and oracle.demanded(m, now):
                m = attrs.evolve(m, last_active=now - oracle.DEMAND_WINDOW)
            if m.phase is Phase.READY:
                m = attrs.evolve(m, phase=Phase.PREEMPTED)
        models.append(m)
    leases = tuple(x for x in sc.leases if not active_lease((x,), now))
    return attrs.evolve(sc, models=tuple(models), leases=leases), holder, default


@given(demanded_holders())
def test_a_demanded_member_is_never_displaced_by_the_default(
    case: tuple[GroupScenario, str, str],
) -> None:
    sc, holder, default = case
    assert oracle.demanded(sc.member(holder), sc.now)
    decision = check_invariants(sc)
    assert decision.leader != default, (decision.reason, decision.message)
    assert decision.reason not in (reasons.RETURN_TO_DEFAULT, reasons.DEFAULT_YIELDS)


@given(defaults_at_rest(), st.data())
def test_the_return_stays_put(case: tuple[GroupScenario, str], data: st.DataObject) -> None:
    """Once the default holds the card and nobody asks for anything, it keeps it at
    every later instant up to a day ahead, warm (at least one replica)."""
    sc, default = case
    decision = sc.decide()
    applied = attrs.evolve(sc, models=apply_decision(sc.models, decision), running=frozenset())
    later = sc.now + timedelta(seconds=data.draw(st.integers(0, 86_400)))
    again = applied.decide(now=later)
    assert again.leader == default, (later, again.reason, again.message)
    assert again.member(default).desired_replicas >= 1
