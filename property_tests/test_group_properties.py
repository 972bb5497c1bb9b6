"""Properties of the shared-group decision (spec/election.md 1.2–1.3).

Each property states the spec's preconditions exactly (which rule of 1.2 would
otherwise decide first) and would fail if the rule it names were broken.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs
from hypothesis import assume, given
from hypothesis import strategies as st

from flexinfer_core import (
    ModelState,
    Phase,
    SharedState,
    apply_decision,
    reasons,
)
from property_tests import oracle
from property_tests.strategies import (
    AGES,
    PRIORITIES,
    GroupScenario,
    active_lease,
    durations,
    group_scenarios,
    leases,
)

# --- shapes that hold for every input -----------------------------------------------


@given(group_scenarios(with_leases=True, lease_unreadable=None))
def test_at_most_one_leader_and_it_is_the_only_active_member(sc: GroupScenario) -> None:
    decision = sc.decide()
    active = [m.name for m in decision.members if m.state is SharedState.ACTIVE]
    assert active == ([decision.leader] if decision.leader is not None else [])
    assert sorted(m.name for m in decision.members) == sorted(m.name for m in sc.models)


@given(group_scenarios(with_leases=True, lease_unreadable=None))
def test_at_most_one_member_wants_replicas_and_it_is_the_leader(sc: GroupScenario) -> None:
    decision = sc.decide()
    scaled = [m.name for m in decision.members if m.desired_replicas > 0]
    assert len(scaled) <= 1
    if scaled:
        assert scaled == [decision.leader]


@given(group_scenarios(min_size=1, with_leases=True, lease_unreadable=None))
def test_non_empty_unleased_group_always_has_a_leader(sc: GroupScenario) -> None:
    assume(sc.lease_unreadable or not active_lease(sc.leases, sc.now))
    decision = sc.decide()
    assert decision.leader in {m.name for m in sc.models}
    if sc.lease_unreadable and active_lease(sc.leases, sc.now):
        assert decision.election.lease_unreadable  # fail open, and it says so


@given(group_scenarios(min_size=1), st.data())
def test_active_lease_parks_every_member(sc: GroupScenario, data: st.DataObject) -> None:
    lease = data.draw(leases(now=sc.now).filter(lambda x: active_lease((x,), sc.now)))
    sc = attrs.evolve(sc, leases=(*sc.leases, lease))
    decision = sc.decide()
    assert decision.leader is None
    assert decision.reason == reasons.GPU_LEASE_HELD_ELECTION
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


@given(group_scenarios(with_leases=True, lease_unreadable=None), st.data())
def test_result_does_not_depend_on_input_order(sc: GroupScenario, data: st.DataObject) -> None:
    shuffled = attrs.evolve(
        sc,
        models=tuple(data.draw(st.permutations(sc.models))),
        leases=tuple(data.draw(st.permutations(sc.leases))),
    )
    assert shuffled.decide() == sc.decide()


@given(group_scenarios(with_leases=True, lease_unreadable=None))
def test_break_before_make(sc: GroupScenario) -> None:
    decision = sc.decide()
    assume(decision.leader is not None)
    assert decision.leader is not None
    leader = decision.member(decision.leader)
    others_with_pods = sc.running - {decision.leader}
    if others_with_pods and decision.leader not in sc.running:
        assert leader.desired_replicas == 0
        if oracle.leader_replicas(sc.member(decision.leader), sc.now) > 0:
            assert leader.reason == reasons.WAITING_FOR_GPU
    else:
        assert leader.desired_replicas == oracle.leader_replicas(sc.member(decision.leader), sc.now)


@given(group_scenarios(with_leases=True, lease_unreadable=None))
def test_status_fields_follow_spec_1_3(sc: GroupScenario) -> None:
    decision = sc.decide()
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
            if decision.leader is not None:
                assert member.preempted_by == decision.leader
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


# --- fixed points in time -------------------------------------------------------------


@given(group_scenarios(with_leases=True, lease_unreadable=None))
def test_applying_a_decision_is_a_fixed_point(sc: GroupScenario) -> None:
    first = sc.decide()
    applied = attrs.evolve(sc, models=apply_decision(sc.models, first))
    again = applied.decide()
    assert again.changes(applied.models) == ()
    assert again.events == ()
    assert again.leader == first.leader
    assert [m.desired_replicas for m in again.members] == [
        m.desired_replicas for m in first.members
    ]


@given(group_scenarios(with_leases=True, lease_unreadable=None), st.data())
def test_nothing_changes_before_next_change_at(sc: GroupScenario, data: st.DataObject) -> None:
    applied = attrs.evolve(sc, models=apply_decision(sc.models, sc.decide()))
    settled = applied.decide()
    horizon = settled.next_change_at
    span = (horizon - sc.now) if horizon is not None else timedelta(days=1)
    assume(span > timedelta(0))
    offset_us = data.draw(
        st.integers(min_value=0, max_value=span // timedelta(microseconds=1) - 1),
        label="microseconds after now",
    )
    later = applied.decide(now=sc.now + timedelta(microseconds=offset_us))
    assert later.leader == settled.leader
    assert later.reason == settled.reason
    assert later.changes(applied.models) == ()
    assert [m.desired_replicas for m in later.members] == [
        m.desired_replicas for m in settled.members
    ]


# --- who may take the card from whom --------------------------------------------------


@st.composite
def ready_leader_scenarios(draw: st.DrawFn, relation: str) -> tuple[GroupScenario, str, str]:
    """A group whose Ready holder L is the best Ready member, and one demanded challenger C.

    `relation` is C's priority relative to L: "lower", "equal" (L busy) or "higher".
    Preconditions per spec 1.2: no forcePromotion, no active lease, L the only
    Active member (so rule 5 cannot fire and rule 4 would keep L). For "higher" no
    cooldown either; for the others, no member at or above L's priority (above
    for "equal") is demanded, so C is the strongest demand there is.
    """
    sc = draw(group_scenarios(min_size=2, with_leases=True))
    names = sorted(m.name for m in sc.models)
    leader_name = draw(st.sampled_from(names))
    challenger = draw(st.sampled_from([n for n in names if n != leader_name]))
    now = sc.now
    leader_priority = draw(st.sampled_from((50, 100, 500)))
    if relation == "lower":
        challenger_priority = draw(st.sampled_from([p for p in PRIORITIES if p < leader_priority]))
    elif relation == "equal":
        challenger_priority = leader_priority
    else:
        challenger_priority = draw(st.sampled_from([p for p in PRIORITIES if p > leader_priority]))

    def demanded_at() -> st.SearchStrategy[datetime]:
        return durations(119).map(lambda age: now - age)

    models: dict[str, ModelState] = {}
    for m in sc.models:
        m = attrs.evolve(m, force_promotion=False)
        if m.name == leader_name:
            last_active = draw(demanded_at()) if relation == "equal" else m.last_active
            m = attrs.evolve(
                m,
                priority=leader_priority,
                phase=Phase.READY,
                shared_state=SharedState.ACTIVE,
                cache_ready=True,
                last_active=last_active,
            )
        else:
            m = attrs.evolve(m, shared_state=draw(st.sampled_from((None, SharedState.QUEUED))))
        if m.name == challenger:
            m = attrs.evolve(
                m,
                priority=challenger_priority,
                last_active=draw(demanded_at()),
                cache_ready=True,
                phase=Phase.IDLE if m.phase in (Phase.FAILED, Phase.READY) else m.phase,
            )
        models[m.name] = m
    leader = models[leader_name]
    for name, m in models.items():
        if name == leader_name:
            continue
        if m.phase is Phase.READY and oracle.rank(m) < oracle.rank(leader):
            m = attrs.evolve(m, phase=Phase.PREEMPTED)
        stronger = (
            m.priority >= leader_priority if relation == "lower" else m.priority > (leader_priority)
        )
        if (
            relation != "higher"
            and name != challenger
            and stronger
            and oracle.runnable(m)
            and oracle.demanded(m, now)
        ):
            m = attrs.evolve(m, last_active=now - oracle.DEMAND_WINDOW - draw(durations(600)))
        models[name] = m
    members = tuple(models[m.name] for m in sc.models)
    if relation == "higher":
        window = oracle.cooldown(members)
        members = tuple(
            attrs.evolve(m, preempted_at=now - window - draw(durations(600)))
            if m.preempted_at is not None and now - m.preempted_at < window
            else m
            for m in members
        )
    unleased = tuple(x for x in sc.leases if not active_lease((x,), now))
    return attrs.evolve(sc, models=members, leases=unleased), leader_name, challenger


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


@st.composite
def loading_holder_scenarios(draw: st.DrawFn, *, challenged: bool) -> tuple[GroupScenario, str]:
    """L is the only Active member, Pending or Loading, demanded within its loading grace.

    No forcePromotion, no active lease and no cooldown (rule 4 would keep L too).
    `challenged`: some runnable member of strictly higher priority is demanded;
    otherwise none is.
    """
    sc = draw(group_scenarios(min_size=1 if not challenged else 2, with_leases=True))
    now = sc.now
    names = sorted(m.name for m in sc.models)
    holder_name = draw(st.sampled_from(names))
    holder_priority = draw(st.sampled_from((0, 50, 100, 500)))
    models = []
    for m in sc.models:
        m = attrs.evolve(m, force_promotion=False)
        if m.name == holder_name:
            grace = max(oracle.RECENT_WINDOW, m.serverless.cold_start_timeout)
            age = draw(AGES)
            if age > grace:  # fold into [0, grace]: the grace is inclusive
                age %= grace + timedelta(microseconds=1)
            m = attrs.evolve(
                m,
                priority=holder_priority,
                phase=draw(st.sampled_from((Phase.PENDING, Phase.LOADING))),
                shared_state=SharedState.ACTIVE,
                last_active=now - age,
            )
        else:
            m = attrs.evolve(m, shared_state=draw(st.sampled_from((None, SharedState.QUEUED))))
            if (
                not challenged
                and m.priority > holder_priority
                and oracle.runnable(m)
                and oracle.demanded(m, now)
            ):
                m = attrs.evolve(m, last_active=now - oracle.DEMAND_WINDOW)
        models.append(m)
    if challenged:
        challenger = draw(st.sampled_from([n for n in names if n != holder_name]))
        models = [
            attrs.evolve(
                m,
                priority=draw(st.sampled_from([p for p in PRIORITIES if p > holder_priority])),
                last_active=now - draw(durations(119)),
                cache_ready=True,
                phase=Phase.IDLE if m.phase is Phase.FAILED else m.phase,
            )
            if m.name == challenger
            else m
            for m in models
        ]
    window = oracle.cooldown(models)
    models = [
        attrs.evolve(m, preempted_at=now - window)
        if m.preempted_at is not None and now - m.preempted_at < window
        else m
        for m in models
    ]
    unleased = tuple(x for x in sc.leases if not active_lease((x,), now))
    return attrs.evolve(sc, models=tuple(models), leases=unleased), holder_name


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
