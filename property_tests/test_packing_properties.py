"""Properties of VRAM co-residency (docs/election.md 1.7), over generated arrival
sequences run through the simulator (the controller's own `decide_group`, pods that
take time to load and to go)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import attrs
from hypothesis import example, given
from hypothesis import strategies as st

from flexinfer_core import GroupDecision, apply_decision, decide_group, reasons
from flexinfer_core.election import Ballot, elect, group_cooldown
from flexinfer_core.packing import GIB, pack
from flexinfer_core.simulate import Request, Timeline, simulate
from flexinfer_core.snapshot import ModelState
from flexinfer_core.testing import GroupScenario, check_fixed_point
from flexinfer_core.testing.strategies import group_scenarios

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
STEP = timedelta(seconds=30)
NAMES = ("chat", "coder", "embed", "rerank", "vision")
HALF_GIB = GIB // 2


@st.composite
def budgeted_groups(draw: st.DrawFn) -> tuple[ModelState, ...]:
    budget = draw(st.integers(8, 48)) * GIB
    count = draw(st.integers(2, len(NAMES)))
    return tuple(
        ModelState(
            name=name,
            group="gpu",
            priority=draw(st.sampled_from((50, 100, 100, 200))),
            vram_budget=budget,
            vram_estimate=draw(
                st.one_of(
                    st.integers(1, 2 * budget // HALF_GIB).map(lambda n: n * HALF_GIB),
                    st.none(),
                )
            ),
        )
        for name in NAMES[:count]
    )


@st.composite
def crowded_groups(draw: st.DrawFn) -> tuple[ModelState, ...]:
    """Known footprints of a third to a half of the card and distinct priorities: a
    newcomer often outranks a seated member and does not fit (evictions happen)."""
    names = NAMES[: draw(st.integers(3, len(NAMES)))]
    priorities = draw(st.permutations((50, 100, 150, 200, 250)))
    return tuple(
        ModelState(
            name=name,
            group="gpu",
            priority=priority,
            vram_budget=24 * GIB,
            vram_estimate=draw(st.integers(12, 24)) * HALF_GIB,
        )
        for name, priority in zip(names, priorities, strict=False)
    )


@st.composite
def arrivals(draw: st.DrawFn, members: tuple[ModelState, ...]) -> list[tuple[datetime, set[str]]]:
    names = [m.name for m in members]
    steps = draw(st.lists(st.sets(st.sampled_from(names)), min_size=1, max_size=40))
    gaps = draw(
        st.lists(st.sampled_from((1, 1, 2, 3, 12)), min_size=len(steps), max_size=len(steps))
    )
    out, at = [], T0
    for asked, gap in zip(steps, gaps, strict=True):
        at += STEP * gap
        out.append((at, asked))
    return out


def _timeline(members: tuple[ModelState, ...], asked: list[tuple[datetime, set[str]]]) -> Timeline:
    requests = [Request(at, name) for at, names in asked for name in sorted(names)]
    return simulate(
        members, start=T0, until=asked[-1][0] + timedelta(minutes=10), requests=requests
    )


@st.composite
def histories(draw: st.DrawFn) -> tuple[tuple[ModelState, ...], Timeline]:
    members = draw(st.one_of(budgeted_groups(), crowded_groups()))
    return members, _timeline(members, draw(arrivals(members)))


def _two_newcomers_in_a_row() -> tuple[tuple[ModelState, ...], Timeline]:
    """c, then d a step later, each outranks a seated member and does not fit: only the
    cooldown keeps d from evicting b right after c evicted a."""
    members = tuple(
        ModelState(name=n, group="gpu", priority=p, vram_budget=24 * GIB, vram_estimate=8 * GIB)
        for n, p in (("lead", 250), ("a", 50), ("b", 100), ("c", 150), ("d", 200))
    )
    seated = {"lead", "a", "b"}
    asked = [seated, seated, {"c", *seated}, {"d", "c", *seated}, {"d"}]
    return members, _timeline(members, [(T0 + STEP * (i + 1), n) for i, n in enumerate(asked)])


def _evictions(timeline: Timeline) -> list[tuple[datetime, str]]:
    return [
        (step.at, event.model)
        for step in timeline.steps
        for event in step.events
        if event.reason == reasons.PREEMPTED and ": evicted by " in event.message
    ]


@given(histories())
@example(_two_newcomers_in_a_row())
def test_no_eviction_follows_another_within_a_cooldown(
    history: tuple[tuple[ModelState, ...], Timeline],
) -> None:
    # No flapping between two packings: once a member was evicted for room, no member
    # is evicted for room again before the group's swap cooldown has passed, unless the
    # evicted one came back and served in between (rule 4's cooldown ends for a member
    # that is Ready again, docs/election.md 1.2).
    members, timeline = history
    cooldown = group_cooldown(members)
    evictions = _evictions(timeline)
    for (before, evicted), (after, name) in pairwise(evictions):
        if after == before or after - before >= cooldown:
            continue
        came_back = any(
            before < step.at <= after and dict((n, r) for n, _, r in step.pods).get(evicted)
            for step in timeline.steps
        )
        assert came_back, (
            f"{name} evicted at {after}, {after - before} after {evicted}'s eviction at "
            f"{before}, which had not served again"
        )


@given(group_scenarios(min_size=1), st.data())
def test_with_no_budget_the_set_is_todays_holder(sc: GroupScenario, data: st.DataObject) -> None:
    # The current code path decides; packing must add nobody beside its holder, however
    # small the members' footprints.
    sizes = st.one_of(st.none(), st.integers(1, 8).map(lambda n: n * HALF_GIB))
    sc = attrs.evolve(
        sc, models=tuple(attrs.evolve(m, vram_estimate=data.draw(sizes)) for m in sc.models)
    )
    decision = sc.decide()
    ballot = Ballot.of(
        sc.models,
        now=sc.now,
        leases=sc.leases,
        unreadable_lease_sources=sc.unreadable_lease_sources,
        policy=sc.policy,
    )
    packing = pack(ballot, elect(ballot))
    today = tuple(m.name for m in decision.members if m.is_leader)
    assert packing.holders == today
    assert packing.evicted == ()


@given(group_scenarios(min_size=2), st.integers(1, 48))
def test_members_that_disagree_on_the_budget_are_not_packed(sc: GroupScenario, gib: int) -> None:
    first, *rest = sc.models
    models = (attrs.evolve(first, vram_budget=gib * GIB, vram_estimate=GIB), *rest)
    models = (*models[:1], *(attrs.evolve(m, vram_estimate=GIB) for m in models[1:]))
    ballot = Ballot.of(models, now=sc.now, leases=sc.leases, policy=sc.policy)
    election = elect(ballot)
    packing = pack(ballot, election)
    assert packing.budget.conflict
    assert len(packing.holders) <= 1


@given(st.data())
def test_the_simulated_card_never_holds_more_than_the_budget(data: st.DataObject) -> None:
    # Through the controller's own decision (decide_group) and the simulator's pods,
    # which take 30 s to load and 5 s to go: at every step, terminating pods included.
    members = data.draw(st.one_of(budgeted_groups(), crowded_groups()))
    budget = members[0].vram_budget
    assert budget is not None
    asked = data.draw(arrivals(members))
    requests = [Request(at, name) for at, names in asked for name in sorted(names)]
    timeline = simulate(
        members, start=T0, until=asked[-1][0] + timedelta(minutes=10), requests=requests
    )
    sizes = {m.name: m.vram_estimate for m in members}
    for step in timeline.steps:
        on = [sizes[name] for name, pods, _ in step.pods if pods]
        if len(on) > 1:
            assert None not in on, f"{step.at}: a member of unknown footprint shares the card"
            total = sum(s or 0 for s in on)
            assert total <= budget, f"{step.at}: {total / GIB} GiB on {budget / GIB}: {step.pods}"


@given(group_scenarios(min_size=1), st.integers(1, 48))
def test_a_budget_with_unknown_footprints_decides_as_today(sc: GroupScenario, gib: int) -> None:
    today = sc.decide()
    budgeted = attrs.evolve(
        sc, models=tuple(attrs.evolve(m, vram_budget=gib * GIB) for m in sc.models)
    )
    decided = budgeted.decide()
    # The election carries the leader's snapshot, which now has the budget: compare what
    # it decides, not the input it holds.
    assert decided.members == today.members
    assert (decided.leader, decided.reason, decided.message, decided.next_change_at) == (
        today.leader,
        today.reason,
        today.message,
        today.next_change_at,
    )


@given(st.data())
def test_a_member_that_fits_alone_is_served_in_the_simulator(data: st.DataObject) -> None:
    # The same liveness through the controller's own decision: after any arrivals, a
    # member that fits the card alone and keeps being asked for is served.
    members = data.draw(st.one_of(budgeted_groups(), crowded_groups()))
    budget = members[0].vram_budget
    assert budget is not None
    fits = [m for m in members if m.vram_estimate is not None and m.vram_estimate <= budget]
    if not fits:
        members = (attrs.evolve(members[0], vram_estimate=budget), *members[1:])
        fits = [members[0]]
    waiter = data.draw(st.sampled_from(fits)).name
    asked = data.draw(arrivals(members))
    requests = [Request(at, name) for at, names in asked for name in sorted(names)]
    since = asked[-1][0]
    later = [Request(since + STEP * (i + 1), waiter) for i in range(30)]
    timeline = simulate(members, start=T0, until=since + STEP * 31, requests=[*requests, *later])
    served = [o for o in timeline.requests if o.request in later and o.served_at is not None]
    assert served, f"{waiter}, asked every 30 s for 15 minutes, was never served"


def with_a_budget(sc: GroupScenario, data: st.DataObject) -> GroupScenario:
    """`sc` with one drawn budget (8 to 48 GiB) for every member and a drawn footprint
    (1 to 24 GiB, or unknown) for each."""
    budget = data.draw(st.integers(8, 48)) * GIB
    sizes = st.one_of(st.none(), st.integers(1, 24).map(lambda n: n * GIB))
    return attrs.evolve(
        sc,
        models=tuple(
            attrs.evolve(m, vram_budget=budget, vram_estimate=data.draw(sizes)) for m in sc.models
        ),
    )


@given(group_scenarios(min_size=1), st.data())
def test_a_packed_decision_is_a_fixed_point(sc: GroupScenario, data: st.DataObject) -> None:
    # Applying a budgeted group's decision and deciding again at the same instant
    # writes nothing: a packing does not rewrite every status at every reconcile.
    sc = with_a_budget(sc, data)
    decision = sc.decide()
    check_fixed_point(sc, decision)


@given(group_scenarios(min_size=1), st.data())
def test_without_a_shared_card_a_budget_decides_as_today(
    sc: GroupScenario, data: st.DataObject
) -> None:
    # A controller without a DRA driver for its GPUs (no --gpu-device-class): whatever
    # the budget and footprints, every member's decision is today's, and the words that
    # say so are written once (deciding again after applying writes nothing).
    budgeted = with_a_budget(sc, data)

    def decide(models: tuple[ModelState, ...]) -> GroupDecision:
        return decide_group(
            models,
            now=sc.now,
            leases=sc.leases,
            unreadable_lease_sources=sc.unreadable_lease_sources,
            running=sc.running,
            policy=sc.policy,
            shared_card=False,
        )

    today = sc.decide()
    decided = decide(budgeted.models)
    assert decided.members == today.members
    assert (decided.leader, decided.reason, decided.next_change_at) == (
        today.leader,
        today.reason,
        today.next_change_at,
    )
    assert {p.condition.reason for p in decided.packed} == {reasons.NO_SHARED_CARD}
    applied = apply_decision(budgeted.models, decided)
    assert decide(applied).changes(applied) == ()
