"""The invariants of a shared group's decision, as functions a test calls.

Each `check_*` takes the input (`GroupScenario`: members as observed, leases, which
members have pods, `now`) and the decision made from it, and raises `AssertionError`
saying what broke. They hold for every input, so a user's property test can call
`check_invariants` on any group it builds, then assert its own rule (e.g. with
`preemptions`: "chat is never preempted by batch"). The definitions they lean on are
written out again in `oracle`, independently of the core, so a bug in the core's own
helpers cannot hide by being used on both sides. No hypothesis here: these work in any
test (the strategies that draw inputs are in `strategies`).
"""

from __future__ import annotations

from datetime import datetime

import attrs

from flexinfer_core import reasons
from flexinfer_core.group import GroupDecision, apply_decision, decide_group
from flexinfer_core.snapshot import (
    DEFAULT_POLICY,
    GpuLease,
    ModelState,
    Phase,
    Policy,
    SharedState,
)
from flexinfer_core.testing import oracle


@attrs.frozen
class GroupScenario:
    """One decide_group input: members, leases, which members have pods, and `now`."""

    models: tuple[ModelState, ...]
    now: datetime
    leases: tuple[GpuLease, ...] = ()
    running: frozenset[str] = frozenset()
    # Lease carriers the adapter could not read (the election may fail open).
    unreadable_lease_sources: tuple[str, ...] = ()
    policy: Policy = DEFAULT_POLICY

    def decide(self, *, now: datetime | None = None) -> GroupDecision:
        return decide_group(
            self.models,
            now=self.now if now is None else now,
            leases=self.leases,
            unreadable_lease_sources=self.unreadable_lease_sources,
            running=self.running,
            policy=self.policy,
        )

    def member(self, name: str) -> ModelState:
        return next(m for m in self.models if m.name == name)


def lease_parks(sc: GroupScenario) -> bool:
    """Does a lease that was read park the scenario's group at `now`?"""
    if not sc.models:
        return False
    first = sc.models[0]
    return any(
        (lease.namespace, lease.group) == (first.namespace, first.group)
        and not lease.problem
        and (lease.expires_at is None or sc.now < lease.expires_at)
        for lease in sc.leases
    )


def check_one_holder(sc: GroupScenario, decision: GroupDecision) -> None:
    """At most one leader, the only Active member; only it, and a member that drains
    (docs/election.md 1.6) without scaling up, may want replicas; while one drains, a
    leader without pods wants none; every member is decided."""
    active = [m.name for m in decision.members if m.state is SharedState.ACTIVE]
    assert active == ([decision.leader] if decision.leader is not None else []), active
    assert sorted(m.name for m in decision.members) == sorted(m.name for m in sc.models)
    scaled = [m.name for m in decision.members if m.desired_replicas > 0]
    draining = [
        m.name for m in decision.members if m.phase is Phase.DRAINING and m.name != decision.leader
    ]
    assert set(scaled) <= {decision.leader, *draining}, (
        f"{scaled} want replicas; {decision.leader} leads"
    )
    for name in draining:
        observed = sc.member(name)
        assert decision.member(name).desired_replicas <= max(1, observed.replicas or 0), (
            f"{name} drains and scales up"
        )
    if draining and decision.leader is not None and decision.leader not in sc.running:
        assert decision.member(decision.leader).desired_replicas == 0, (
            f"{decision.leader} scaled up while {draining} drain"
        )


def check_break_before_make(sc: GroupScenario, decision: GroupDecision) -> None:
    """The leader is not scaled up while another member still has pods or drains (it
    says `WaitingForGPU`); otherwise it wants the replicas its serverless settings give."""
    if decision.leader is None:
        return
    leader = decision.member(decision.leader)
    default = oracle.group_default(sc.models)
    wanted = oracle.leader_replicas(
        sc.member(decision.leader),
        sc.now,
        warm=default is not None and default.name == decision.leader,
    )
    # A member that drains keeps its pods (docs/election.md 1.6): it occupies the card.
    draining = {m.name for m in decision.members if m.phase is Phase.DRAINING}
    others = sorted((sc.running | draining) - {decision.leader})
    if others and decision.leader not in sc.running:
        assert leader.desired_replicas == 0, (
            f"{decision.leader} scaled up while {others} still have pods"
        )
        if wanted > 0:
            assert leader.reason == reasons.WAITING_FOR_GPU, leader.reason
    else:
        assert leader.desired_replicas == wanted, (leader.desired_replicas, wanted)


def check_lease_parks_the_group(sc: GroupScenario, decision: GroupDecision) -> None:
    """Under an active lease that was read nobody leads and nothing runs but a member
    that drains (docs/election.md 1.6); without one (or with lease sources that could
    not be read: fail open) a non-empty group has a leader."""
    if lease_parks(sc):
        assert decision.leader is None, f"{decision.leader} leads under a lease"
        assert all(
            m.desired_replicas == 0 for m in decision.members if m.phase is not Phase.DRAINING
        )
    elif sc.models:
        assert decision.leader is not None, "an unleased group has no leader"


def check_priority(sc: GroupScenario, decision: GroupDecision) -> None:
    """A Ready, runnable member that is the only Active one (as the controller leaves a
    group) never loses the card to a member of strictly lower priority, unless that one
    has forcePromotion, or the group's default is involved once the holder has idled
    out (docs/election.md 1.5): the default takes the card back from a holder idle past
    its own idle timeout, and a default idle past its own yields to any demanded member.
    A demanded member is never displaced by the default's return."""
    active = oracle.active_members(sc.models)
    if len(active) != 1 or lease_parks(sc) or decision.leader is None:
        return
    holder = active[0]
    if holder.phase is not Phase.READY or not oracle.runnable(holder):
        return
    leader = sc.member(decision.leader)
    if leader.force_promotion:
        return
    default = oracle.group_default(sc.models)
    if default is not None and leader is default and holder is not default:
        # The default takes the card from a demanded holder only by its own demand.
        assert not oracle.demanded(holder, sc.now) or oracle.demanded(leader, sc.now), (
            f"the default {leader.name} displaced the demanded {holder.name}: "
            f"{decision.reason}: {decision.message}"
        )
    if leader.priority >= holder.priority:
        return
    if default is not None:
        if leader is default:
            assert oracle.idle_past_timeout(holder, sc.now), (
                f"the default {leader.name} took the card from {holder.name}, which is not "
                f"idle past its idle timeout: {decision.reason}: {decision.message}"
            )
            return
        if (
            holder is default
            and not oracle.demanded(holder, sc.now)
            and oracle.idle_past_timeout(holder, sc.now)
        ):
            return
    assert leader.priority >= holder.priority, (
        f"{holder.name} (priority {holder.priority}) lost the card to {leader.name} "
        f"(priority {leader.priority}): {decision.reason}: {decision.message}"
    )


def check_cooldown(sc: GroupScenario, decision: GroupDecision) -> None:
    """Inside the swap cooldown (a member evicted less than the group's largest
    swapCooldown ago and not Ready again) an Active member keeps the card, unless a
    lease parks the group or a member has forcePromotion."""
    if lease_parks(sc) or any(m.force_promotion for m in sc.models):
        return
    active = oracle.active_members(sc.models)
    if not active or not oracle.cooldown_holds(
        sc.models, sc.now, default=sc.policy.default_swap_cooldown
    ):
        return
    assert decision.leader in {m.name for m in active}, (
        f"{decision.leader} took the card from {[m.name for m in active]} inside the cooldown"
    )


def check_fixed_point(sc: GroupScenario, decision: GroupDecision) -> None:
    """Applying the decision and deciding again at the same `now` writes nothing."""
    applied = attrs.evolve(sc, models=apply_decision(sc.models, decision))
    again = applied.decide()
    assert again.changes(applied.models) == (), again.changes(applied.models)
    assert again.events == ()
    assert again.leader == decision.leader
    assert [m.desired_replicas for m in again.members] == [
        m.desired_replicas for m in decision.members
    ]


def check_invariants(sc: GroupScenario, decision: GroupDecision | None = None) -> GroupDecision:
    """Every check above; returns the decision (made from `sc` when not given)."""
    if decision is None:
        decision = sc.decide()
    check_one_holder(sc, decision)
    check_break_before_make(sc, decision)
    check_lease_parks_the_group(sc, decision)
    check_priority(sc, decision)
    check_cooldown(sc, decision)
    check_fixed_point(sc, decision)
    assert decision.next_change_at is None or decision.next_change_at > sc.now, (
        "a timer armed for now or the past would fire in a loop"
    )
    return decision


def preemptions(sc: GroupScenario, decision: GroupDecision) -> list[tuple[str, str]]:
    """(victim, taker) for each member that was serving and loses the card with this
    decision; the taker is the new leader, or `gpu-lease/<owner>` under a lease."""
    return [
        (m.name, m.preempted_by)
        for m in decision.members
        if sc.member(m.name).phase is Phase.READY and m.phase is Phase.PREEMPTED
    ]
