"""Properties of the shared-group decision (docs/election.md 1.2–1.3).

Each property states the spec's preconditions exactly (which rule of 1.2 would
otherwise decide first) and would fail if the rule it names were broken.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs
from hypothesis import assume, given
from hypothesis import strategies as st

from flexinfer_core import (
    GroupDecision,
    ModelState,
    Phase,
    SharedState,
    apply_decision,
    decide_group,
    group_models,
    reasons,
    standalone_models,
)
from flexinfer_core.leases import lease_holder_label
from flexinfer_core.testing import check_invariants, oracle
from flexinfer_core.testing.strategies import (
    GroupScenario,
    active_lease,
    cluster_models,
    contested_scenarios,
    durations,
    group_scenarios,
    leases,
    loading_holder_scenarios,
    ready_leader_scenarios,
)

# --- what holds for every input ----------------------------------------------------
#
# Hypothesis spends most of its time generating; the invariants that need nothing but
# a group share one test, each a named check, so each still sees every example.


def check_unleased_group_has_a_leader(sc: GroupScenario, decision: GroupDecision) -> None:
    """A non-empty group with no readable active lease always has a leader; one that
    cannot read every lease source fails open and says which (spec section 2), but a
    lease that was read still parks it."""
    leased = active_lease(sc.leases, sc.now)
    if sc.models and not leased:
        assert decision.leader in {m.name for m in sc.models}
        failed_open = sorted(sc.unreadable_lease_sources)
        assert list(decision.election.unreadable_lease_sources) == failed_open
        if failed_open:
            assert f"could not be read ({', '.join(failed_open)})" in decision.message
    elif sc.models:
        assert decision.leader is None
        assert not decision.election.lease_unreadable


def check_status_fields(sc: GroupScenario, decision: GroupDecision) -> None:
    """queuePosition, preemptedBy, active-services and preemptedAt as spec 1.3 says."""
    non_leaders = sorted(
        (m for m in sc.models if m.name != decision.leader), key=lambda m: (-m.priority, m.name)
    )
    assert {m.name: i + 1 for i, m in enumerate(non_leaders)} == {
        m.name: m.queue_position for m in decision.members if not m.is_leader
    }
    leader_services = ",".join(sc.member(decision.leader).service_labels) if decision.leader else ""
    for member in decision.members:
        observed = sc.member(member.name)
        if member.is_leader:
            assert (member.queue_position, member.preempted_by) == (0, "")
            assert member.active_services == leader_services
            assert member.phase is observed.phase
            # preemptedAt is cleared once the member is Ready again, and only then.
            expected = None if observed.phase is Phase.READY else observed.preempted_at
            assert member.preempted_at == expected
        else:
            assert member.active_services == ""
            assert member.desired_replicas == 0
            # preemptedBy names who took the card from a member that was serving (or the
            # lease that parks it); a queued member's never names the current holder.
            lease = decision.election.lease
            if lease is not None:
                assert member.preempted_by == lease_holder_label(lease)
            elif observed.phase is Phase.READY:
                assert member.preempted_by == decision.leader
            elif observed.phase is Phase.PREEMPTED:
                assert member.preempted_by == (observed.preempted_by or "")
            else:
                assert member.preempted_by == ""
            # Only a real eviction (Ready, no longer leader) stamps preemptedAt.
            if observed.phase is Phase.READY:
                assert (member.phase, member.preempted_at) == (Phase.PREEMPTED, sc.now)
                assert len(member.events) == 1
            else:
                assert (member.phase, member.preempted_at) == (
                    observed.phase,
                    observed.preempted_at,
                )
                assert member.events == ()


def check_order_independence(
    sc: GroupScenario, decision: GroupDecision, data: st.DataObject
) -> None:
    """The same members and leases in another order give the same decision."""
    shuffled = attrs.evolve(
        sc,
        models=tuple(data.draw(st.permutations(sc.models), label="members reordered")),
        leases=tuple(data.draw(st.permutations(sc.leases), label="leases reordered")),
    )
    assert shuffled.decide() == decision
    # Reversed too: a choice that falls to "the first one listed" shows up at once.
    reversed_ = attrs.evolve(sc, models=sc.models[::-1], leases=sc.leases[::-1])
    assert reversed_.decide() == decision


@given(contested_scenarios(), st.data())
def test_every_decision_keeps_the_invariants(sc: GroupScenario, data: st.DataObject) -> None:
    # The public harness's invariants (one holder, break-before-make, leases, priority,
    # cooldown, fixed point, a timer in the future), then this suite's finer ones.
    decision = check_invariants(sc)
    check_unleased_group_has_a_leader(sc, decision)
    check_status_fields(sc, decision)
    check_order_independence(sc, decision, data)


@given(contested_scenarios(), st.data())
def test_a_handover_writes_no_status_on_a_member_it_does_not_move(
    sc: GroupScenario, data: st.DataObject
) -> None:
    """A queued member is told its place in the queue, not who holds the card: once a
    decision is written, a new demand changes the status of the old and the new holder,
    and of any other member only when its queue position moves."""
    assume(sc.models)
    settled = attrs.evolve(sc, models=apply_decision(sc.models, sc.decide()))
    before = settled.decide()
    asked = data.draw(st.sampled_from([m.name for m in settled.models]), label="asked")
    later = attrs.evolve(
        settled,
        models=tuple(
            attrs.evolve(m, last_active=sc.now) if m.name == asked else m for m in settled.models
        ),
    )
    after = later.decide()
    holders = {before.leader, after.leader}
    for change in after.changes(later.models):
        if change.status and change.name not in holders:
            assert (
                before.member(change.name).queue_position
                != after.member(change.name).queue_position
            ), change


@given(group_scenarios(min_size=1), st.data())
def test_active_lease_parks_every_member(sc: GroupScenario, data: st.DataObject) -> None:
    lease = data.draw(leases(now=sc.now).filter(lambda x: active_lease((x,), sc.now)))
    sc = attrs.evolve(sc, leases=(*sc.leases, lease))
    decision = sc.decide()
    assert decision.leader is None
    assert decision.reason == reasons.GPU_LEASE_HELD
    for member in decision.members:
        observed = sc.member(member.name)
        assert member.desired_replicas == 0
        assert member.state is SharedState.QUEUED
        assert member.preempted_by.startswith("gpu-lease/")
        assert member.active_services == ""
        if observed.phase is Phase.READY:
            assert member.phase is Phase.PREEMPTED
            assert member.preempted_at == sc.now
            assert [e.reason for e in member.events] == [reasons.GPU_LEASE_HELD]


# --- nothing moves between thresholds ---------------------------------------------------


def spec_thresholds(sc: GroupScenario) -> set[datetime]:
    """Every instant at which some input of spec 1.2–1.3 crosses a boundary, from the spec.

    Windows are exclusive ("younger than"): the state flips at the boundary itself.
    Idleness ("older than" the demand window), the loading grace and the idle timeout
    flip one tick later.
    """
    tick = timedelta(microseconds=1)
    out: set[datetime] = set()
    window = oracle.cooldown(sc.models) if sc.models else timedelta(0)
    for m in sc.models:
        if m.last_active is not None:
            grace = max(oracle.RECENT_WINDOW, m.serverless.cold_start_timeout)
            out |= {
                m.last_active + oracle.DEMAND_WINDOW,
                m.last_active + oracle.DEMAND_WINDOW + tick,
                m.last_active + oracle.RECENT_WINDOW,
                m.last_active + grace + tick,
                m.last_active + m.serverless.idle_timeout + tick,
            }
        if m.preempted_at is not None:
            out.add(m.preempted_at + window)
    out |= {x.expires_at for x in sc.leases if x.expires_at is not None}
    return out


@given(contested_scenarios(), st.data())
def test_nothing_changes_before_next_change_at(sc: GroupScenario, data: st.DataObject) -> None:
    """Apply, then decide at `now`, just before every spec threshold ahead and at a random
    instant before `next_change_at`: nothing to write, same leader, same replicas."""
    applied = attrs.evolve(sc, models=apply_decision(sc.models, sc.decide()))
    settled = applied.decide()
    horizon = settled.next_change_at
    span = (horizon - sc.now) if horizon is not None else timedelta(days=1)
    assume(span > timedelta(0))
    tick = timedelta(microseconds=1)
    offset = tick * data.draw(st.integers(min_value=0, max_value=span // tick - 1))
    end = sc.now + span
    checkpoints = {sc.now, end - tick, sc.now + offset}
    for threshold in spec_thresholds(applied):
        checkpoints |= {t for t in (threshold - tick, threshold) if sc.now <= t < end}
    for instant in sorted(checkpoints):
        later = applied.decide(now=instant)
        assert later.leader == settled.leader, instant
        assert later.reason == settled.reason, instant
        assert later.changes(applied.models) == (), instant
        assert [m.desired_replicas for m in later.members] == [
            m.desired_replicas for m in settled.members
        ], instant


# --- who may take the card from whom --------------------------------------------------


@given(ready_leader_scenarios("lower"))
def test_lower_priority_demand_never_displaces_a_ready_leader(
    case: tuple[GroupScenario, str, str],
) -> None:
    sc, leader, _ = case
    decision = sc.decide()
    assert decision.leader == leader
    assert decision.member(leader).phase is Phase.READY


@given(ready_leader_scenarios("equal"))
def test_equal_priority_demand_never_displaces_a_busy_ready_leader(
    case: tuple[GroupScenario, str, str],
) -> None:
    sc, leader, _ = case
    assert oracle.demanded(sc.member(leader), sc.now)
    decision = sc.decide()
    assert decision.leader == leader


_TICK = timedelta(microseconds=1)


@given(
    ready_leader_scenarios("equal"),
    st.sampled_from([timedelta(0), _TICK, timedelta(seconds=1), timedelta(minutes=20)]),
)
def test_equal_priority_demand_takes_the_card_only_from_an_idle_leader(
    case: tuple[GroupScenario, str, str], past_the_window: timedelta
) -> None:
    """Rule 7: at equal priority the demanded member takes over from an idle Ready
    leader; idle is strictly older than the demand window, so at exactly the window the
    leader keeps the card."""
    sc, leader, _ = case
    now = sc.now
    window = oracle.cooldown(sc.models)
    models = []
    for m in sc.models:
        if m.name == leader:
            m = attrs.evolve(m, last_active=now - oracle.DEMAND_WINDOW - past_the_window)
        elif m.phase is Phase.READY:
            m = attrs.evolve(m, phase=Phase.PREEMPTED)  # the leader stays the best Ready one
        if m.preempted_at is not None and now - m.preempted_at < window:
            m = attrs.evolve(m, preempted_at=now - window)  # no cooldown (rule 4)
        models.append(m)
    aged = attrs.evolve(sc, models=tuple(models))
    assert not oracle.cooldown_holds(aged.models, now)
    decision = aged.decide()
    if oracle.idle(aged.member(leader), now):
        assert decision.leader != leader
        assert decision.reason == reasons.DEMAND_PREEMPTION
    else:
        assert past_the_window == timedelta(0)
        assert decision.leader == leader


@given(ready_leader_scenarios("higher"))
def test_strictly_higher_priority_demand_takes_the_card_at_once(
    case: tuple[GroupScenario, str, str],
) -> None:
    sc, leader, challenger = case
    assert not oracle.cooldown_holds(sc.models, sc.now)
    decision = sc.decide()
    strongest = oracle.best(
        m for m in sc.models if oracle.runnable(m) and oracle.demanded(m, sc.now)
    )
    assert strongest is not None
    assert strongest.priority >= sc.member(challenger).priority
    assert decision.leader == strongest.name
    assert decision.reason == reasons.DEMAND_PREEMPTION
    evicted = decision.member(leader)
    assert (evicted.phase, evicted.preempted_at) == (Phase.PREEMPTED, sc.now)
    assert evicted.desired_replicas == 0


@given(group_scenarios(min_size=1, with_leases=True), st.data())
def test_cooldown_keeps_the_active_holder(sc: GroupScenario, data: st.DataObject) -> None:
    names = sorted(m.name for m in sc.models)
    holder = data.draw(st.sampled_from(names), label="an Active member")
    victim = data.draw(st.sampled_from(names), label="preempted inside the cooldown")
    models = [attrs.evolve(m, force_promotion=False) for m in sc.models]
    if oracle.cooldown(models) == timedelta(0):
        models = [attrs.evolve(m, swap_cooldown=None) if m.name == victim else m for m in models]
    window = oracle.cooldown(models)
    age = data.draw(durations(900).filter(lambda d: d < window), label="preemption age")
    models = [
        attrs.evolve(
            m,
            shared_state=SharedState.ACTIVE if m.name == holder else m.shared_state,
            preempted_at=sc.now - age if m.name == victim else m.preempted_at,
            # A Ready member's own stamp is cleared by this very decision, so it does
            # not hold the cooldown (core c01b63e); the victim waits, Preempted.
            phase=Phase.PREEMPTED if m.name == victim and m.phase is Phase.READY else m.phase,
        )
        for m in models
    ]
    sc = attrs.evolve(
        sc,
        models=tuple(models),
        leases=tuple(x for x in sc.leases if not active_lease((x,), sc.now)),
    )
    decision = sc.decide()
    expected = oracle.best(oracle.active_members(sc.models))
    assert expected is not None
    assert decision.leader == expected.name
    assert decision.reason == reasons.SWAP_COOLDOWN


@given(loading_holder_scenarios(challenged=False))
def test_loading_holder_keeps_the_card_against_anything_less(
    case: tuple[GroupScenario, str],
) -> None:
    sc, holder = case
    decision = sc.decide()
    assert decision.leader == holder
    assert decision.reason == reasons.LOADING_HOLDER


@given(loading_holder_scenarios(challenged=True))
def test_loading_holder_yields_to_strictly_higher_priority_demand(
    case: tuple[GroupScenario, str],
) -> None:
    sc, holder = case
    decision = sc.decide()
    assert decision.leader != holder
    assert decision.leader is not None
    assert sc.member(decision.leader).priority > sc.member(holder).priority


@given(group_scenarios(min_size=1, with_leases=True), st.data())
def test_force_promotion_wins_unless_a_lease_holds(sc: GroupScenario, data: st.DataObject) -> None:
    promoted = data.draw(st.sampled_from(sorted(m.name for m in sc.models)))
    sc = attrs.evolve(
        sc,
        models=tuple(
            attrs.evolve(m, force_promotion=True) if m.name == promoted else m for m in sc.models
        ),
    )
    decision = sc.decide()
    if active_lease(sc.leases, sc.now):
        assert decision.leader is None
    else:
        expected = oracle.best(m for m in sc.models if m.force_promotion)
        assert expected is not None
        assert decision.leader == expected.name


@given(cluster_models(), st.data())
def test_grouping_partitions_the_cluster(
    case: tuple[tuple[ModelState, ...], datetime], data: st.DataObject
) -> None:
    models, now = case
    shuffled = data.draw(st.permutations(models))
    groups = group_models(models)
    assert group_models(shuffled) == groups
    assert standalone_models(shuffled) == standalone_models(models)
    seen = [m.key for members in groups.values() for m in members]
    seen += [m.key for m in standalone_models(models)]
    assert sorted(seen) == sorted(m.key for m in models)
    for (namespace, group), members in groups.items():
        assert group and all((m.namespace, m.group) == (namespace, group) for m in members)
        decide_group(members, now=now)  # a real group: no InconsistentGroupError
