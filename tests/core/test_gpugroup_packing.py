"""docs/election.md 3, "Packing": a GPUGroup with `spec.vramBudget` decides a set of
holders by the rules of 1.7 (`flexinfer_core.gpugroup_packing`); with no budget, exactly
the decision of `decide_gpu_group`."""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer_core import (
    AntiThrashing,
    Event,
    GpuGroupAction,
    GpuGroupMember,
    GpuGroupPhase,
    GpuGroupState,
    MemberState,
    decide_gpu_group,
    reasons,
)
from flexinfer_core.gpugroup_packing import (
    PackedGpuGroupDecision,
    decide_packed_gpu_group,
    record_packed_decision,
)
from flexinfer_core.testing.strategies import gpu_group_states

from .builders import T0, ago

GIB = 2**30
MIB = 2**20


def group(
    *members: GpuGroupMember, budget: int | None = 24 * GIB, **fields: object
) -> GpuGroupState:
    return GpuGroupState("gg", members=members, vram_budget=budget, **fields)  # type: ignore[arg-type]


def holding(name: str, size: int | None, **fields: object) -> GpuGroupMember:
    """A member with a ready pod, asked for a moment ago, seated on the card."""
    base: dict[str, object] = {
        "last_request": ago(5),
        "has_pods": True,
        "ready": True,
        "seated": True,
        "vram_estimate": size,
    }
    return GpuGroupMember(name, **(base | fields))  # type: ignore[arg-type]


def asking(name: str, size: int | None, **fields: object) -> GpuGroupMember:
    """A member with one request queued for 5 s, reported just now, no pods."""
    base: dict[str, object] = {
        "queued": 1,
        "oldest_waiting": ago(5),
        "reported_at": ago(0),
        "vram_estimate": size,
    }
    return GpuGroupMember(name, **(base | fields))  # type: ignore[arg-type]


def decide(state: GpuGroupState) -> PackedGpuGroupDecision:
    return decide_packed_gpu_group(state, now=T0)


def states(packed: PackedGpuGroupDecision) -> dict[str, MemberState]:
    return {s.name: s.state for s in packed.decision.member_statuses}


def test_without_a_budget_the_decision_is_exactly_section_3s() -> None:
    cases = [
        group(holding("chat", 5632 * MIB), asking("embed", 4 * GIB), budget=None,
              current_model="chat"),
        group(asking("a", 8 * GIB), asking("b", None), budget=None),
        group(holding("chat", None, last_request=ago(900)), asking("b", GIB), budget=None,
              current_model="chat", last_swap_time=ago(900)),
    ]  # fmt: skip
    for state in cases:
        packed = decide(state)
        assert packed.decision == decide_gpu_group(state, now=T0)
        assert not packed.packing.packed


@settings(max_examples=200, deadline=None)
@given(gpu_group_states())
def test_no_budget_never_changes_a_generated_decision(case: tuple[GpuGroupState, object]) -> None:
    state, now = case
    assert state.vram_budget is None
    estimated = attrs.evolve(
        state, members=tuple(attrs.evolve(m, vram_estimate=GIB) for m in state.members)
    )
    for observed in (state, estimated):
        assert decide_packed_gpu_group(observed, now=now).decision == decide_gpu_group(  # type: ignore[arg-type]
            observed, now=now  # type: ignore[arg-type]
        )


def test_a_newcomer_that_fits_sits_beside_the_holder() -> None:
    state = group(holding("chat", 5632 * MIB), asking("embed", 4 * GIB), current_model="chat",
                  last_swap_time=ago(600))  # fmt: skip
    packed = decide(state)
    assert packed.packing.holders == ("chat", "embed")
    assert packed.packing.used == 9728 * MIB
    assert packed.decision.active_model == "chat"  # the leader stays; no swap
    assert packed.decision.swap_count == 0 and packed.decision.member_events == ()
    assert dict(packed.decision.desired_replicas) == {"chat": 1, "embed": 1}
    assert states(packed) == {"chat": MemberState.ACTIVE, "embed": MemberState.ACTIVE}
    seat = packed.packing.seat("embed")
    assert (seat.admitted, seat.reason) == (True, reasons.CO_RESIDENT)
    assert seat.message == "fits: 9.5 of 24 GiB used"
    assert packed.decision.phase is GpuGroupPhase.ACTIVE


def test_one_that_does_not_fit_and_may_not_evict_waits() -> None:
    state = group(
        holding("chat", 5632 * MIB, priority=300),
        holding("embed", 4 * GIB, priority=200),
        asking("coder", 16 * GIB, priority=100),
        current_model="chat",
        last_swap_time=ago(600),
    )
    packed = decide(state)
    assert packed.packing.holders == ("chat", "embed")
    seat = packed.packing.seat("coder")
    assert (seat.admitted, seat.reason) == (False, reasons.WAITING_FOR_VRAM)
    assert seat.message.startswith("coder needs 16 GiB, 14.5 free; coder may not evict")
    assert dict(packed.decision.desired_replicas)["coder"] == 0
    assert states(packed)["coder"] is MemberState.QUEUED


def three() -> GpuGroupState:
    """Two small ones hold the card (16 of 24 GiB); a larger, more important one asks."""
    return group(
        holding("chat", 8 * GIB, priority=100),
        holding("embed", 8 * GIB, priority=100, last_request=ago(30)),
        asking("big", 16 * GIB, priority=300),
        current_model="chat",
        last_swap_time=ago(600),
    )


def test_a_larger_more_important_one_evicts_just_enough_then_waits_for_memory() -> None:
    packed = decide(three())
    # The lowest-ranked seated member goes (embed: same priority, asked for longer
    # ago), not both: 8 + 16 fit the 24 GiB.
    assert packed.packing.holders == ("chat", "big")
    assert packed.packing.evicted == (("embed", "big"),)
    assert states(packed) == {
        "big": MemberState.ACTIVE, "chat": MemberState.ACTIVE, "embed": MemberState.PREEMPTED
    }  # fmt: skip
    (embed,) = [s for s in packed.decision.member_statuses if s.name == "embed"]
    assert (embed.preempted_at, embed.preempted_by) == (T0, "big")
    assert packed.decision.member_events == (
        Event("embed", reasons.PREEMPTED, "evicted by big: it needs 16 GiB, 8 free",
              type="Warning"),
    )  # fmt: skip
    # Break-before-make by memory: embed's pod still holds 8 GiB, so big waits.
    assert packed.packing.waiting == ("big",)
    assert dict(packed.decision.desired_replicas) == {"big": 0, "chat": 1, "embed": 0}
    # Once embed's pod is gone, big starts beside chat.
    gone = record_packed_decision(three(), packed)
    gone = attrs.evolve(
        gone,
        members=tuple(
            attrs.evolve(m, has_pods=False, ready=False) if m.name == "embed" else m
            for m in gone.members
        ),
    )
    again = decide(gone)
    assert again.packing.holders == ("chat", "big")
    assert again.packing.evicted == () and again.decision.member_events == ()
    assert dict(again.decision.desired_replicas) == {"big": 1, "chat": 1, "embed": 0}


def test_no_eviction_while_the_newcomer_s_cooldown_runs() -> None:
    state = three()
    state = attrs.evolve(
        state,
        members=tuple(
            attrs.evolve(m, preempted_at=ago(10)) if m.name == "big" else m for m in state.members
        ),
    )
    packed = decide(state)
    assert packed.packing.holders == ("chat", "embed")
    assert "big was preempted less than its cooldown ago" in packed.packing.seat("big").message
    cool = attrs.evolve(state, anti_thrashing=AntiThrashing(cooldown_after_preemption=timedelta(0)))
    assert decide(cool).packing.holders == ("chat", "big")


def test_a_seated_member_idle_past_its_timeout_gives_up_its_seat_quietly() -> None:
    state = group(
        holding("chat", 8 * GIB),
        holding("embed", 8 * GIB, last_request=ago(600)),
        current_model="chat",
        last_swap_time=ago(600),
    )
    packed = decide(state)
    assert packed.packing.holders == ("chat",)
    assert packed.packing.seat("embed").reason == reasons.QUEUED
    assert dict(packed.decision.desired_replicas)["embed"] == 0
    assert packed.decision.member_events == ()


def test_a_seated_member_that_takes_the_lead_keeps_the_former_leader_beside_it() -> None:
    # embed is more important and has requests queued: section 3 names it the holder.
    # Packed, the former leader stays on the card beside it: no eviction, no Event.
    state = group(
        holding("chat", 8 * GIB, priority=100),
        holding("embed", 8 * GIB, priority=300, ready=False, queued=5,
                oldest_waiting=ago(60), reported_at=ago(0)),
        current_model="chat",
        last_swap_time=ago(600),
    )  # fmt: skip
    packed = decide(state)
    assert (packed.decision.action, packed.decision.active_model) == (GpuGroupAction.SWAP, "embed")
    assert packed.packing.holders == ("embed", "chat")
    assert packed.packing.evicted == () and packed.decision.member_events == ()
    assert states(packed) == {"chat": MemberState.ACTIVE, "embed": MemberState.ACTIVE}
    (chat,) = [s for s in packed.decision.member_statuses if s.name == "chat"]
    assert (chat.preempted_at, chat.preempted_by) == (None, "")
    assert dict(packed.decision.desired_replicas) == {"chat": 1, "embed": 1}
    # Without packing chat would be preempted and scaled to 0.
    plain = decide_gpu_group(state, now=T0)
    assert dict(plain.desired_replicas)["chat"] == 0


def test_when_the_leader_idles_out_a_seated_member_in_use_keeps_the_card() -> None:
    state = group(
        holding("chat", 8 * GIB, last_request=ago(900)),
        holding("embed", 8 * GIB, last_request=ago(5)),
        current_model="chat",
        last_swap_time=ago(900),
    )
    assert decide_gpu_group(state, now=T0).active_model is None  # section 3: idle
    packed = decide(state)
    assert packed.decision.active_model == "embed"
    assert packed.packing.holders == ("embed",)
    assert dict(packed.decision.desired_replicas) == {"chat": 0, "embed": 1}


def test_a_leader_of_unknown_footprint_holds_the_card_alone_as_without_a_budget() -> None:
    state = group(holding("chat", None), asking("embed", 4 * GIB), current_model="chat",
                  last_swap_time=ago(600))  # fmt: skip
    packed = decide(state)
    assert packed.decision == decide_gpu_group(state, now=T0)
    assert packed.packing.holders == ("chat",)
    assert "chat's footprint is unknown" in packed.packing.seat("embed").message


def test_deciding_again_once_applied_changes_nothing() -> None:
    cases = [
        three(),
        group(holding("chat", 5632 * MIB), asking("embed", 4 * GIB), current_model="chat",
              last_swap_time=ago(600)),
        group(asking("a", 8 * GIB), asking("b", 8 * GIB), asking("c", 16 * GIB)),
    ]  # fmt: skip
    for state in cases:
        first = decide(state)
        second = decide(record_packed_decision(state, first))
        assert second.packing.holders == first.packing.holders
        assert second.packing.evicted == ()
        assert second.decision.member_statuses == first.decision.member_statuses
        assert second.decision.swap_count == first.decision.swap_count


def test_the_set_never_exceeds_the_budget() -> None:
    state = group(*(asking(n, s * GIB, priority=p) for n, s, p in
                    (("a", 10, 100), ("b", 10, 200), ("c", 6, 150), ("d", 3, 50))))  # fmt: skip
    packed = decide(state)
    sizes = {"a": 10, "b": 10, "c": 6, "d": 3}
    assert sum(sizes[h] for h in packed.packing.holders) <= 24
    # b leads (most important); c fits (16); a does not (26); d does (19).
    assert packed.packing.holders == ("b", "c", "d")
    # No member has pods: they start in the order of the set, each counted.
    assert dict(packed.decision.desired_replicas) == {"a": 0, "b": 1, "c": 1, "d": 1}


def test_only_as_many_are_evicted_as_the_newcomer_needs_the_lowest_ranked_first() -> None:
    state = group(
        holding("lead", 4 * GIB, priority=200),
        holding("b", 4 * GIB, priority=100),
        holding("c", 4 * GIB, priority=150),
        asking("big", 12 * GIB, priority=300),
        budget=20 * GIB,
        current_model="lead",
        last_swap_time=ago(600),
    )
    packed = decide(state)
    # 12 of 20 used, 8 free: one 4 GiB seat is enough, and b ranks below c.
    assert packed.packing.evicted == (("b", "big"),)
    assert packed.packing.holders == ("lead", "big", "c")


@settings(max_examples=300, deadline=None)
@given(gpu_group_states(), st.data())
def test_generated_packings_fit_and_hold_once_applied(
    case: tuple[GpuGroupState, datetime], data: st.DataObject
) -> None:
    """Over generated groups given a budget and footprints: the holders' footprints fit
    the budget and the leader is one of them; and once a decision is applied (its
    seats recorded, pods as they were), deciding again keeps the same holders and
    evicts nobody."""
    state, now = case
    sizes = st.sampled_from((None, 4 * GIB, 8 * GIB, 16 * GIB))
    members = tuple(attrs.evolve(m, vram_estimate=data.draw(sizes)) for m in state.members)
    state = attrs.evolve(state, members=members, vram_budget=24 * GIB)
    first = decide_packed_gpu_group(state, now=now)
    packing = first.packing
    if first.decision.active_model is not None:
        assert packing.holders[0] == first.decision.active_model
    if packing.used:
        sizes_of = {m.name: m.vram_estimate or 0 for m in members}
        assert sum(sizes_of[h] for h in packing.holders) == packing.used <= 24 * GIB
    # The leader's name may move to a member already on the card (one loading leads by
    # section 3, say): the set of holders stays, nobody goes.
    second = decide_packed_gpu_group(record_packed_decision(state, first), now=now)
    assert set(second.packing.holders) == set(packing.holders)
    assert second.packing.evicted == ()


def test_a_member_seated_in_its_cooldown_keeps_its_record_and_is_not_named_leader_next() -> None:
    """gamma was preempted 10 s ago and asks again: the cooldown keeps beta leading, and
    gamma sits beside it. Its preemption's record (and so its cooldown) stays: cleared,
    the next decision with no news would name gamma leader (a Swap Event, a write)."""
    state = group(
        holding("beta", 4 * GIB, last_request=ago(10), seated=False),
        asking("gamma", 4 * GIB, preempted_at=ago(10), preempted_by="beta"),
        current_model="beta",
        budget=16 * GIB,
        anti_thrashing=AntiThrashing(enabled=True, request_queue_threshold=1,
                                     hysteresis_window=timedelta(0),
                                     minimum_run_duration=timedelta(0),
                                     cooldown_after_preemption=timedelta(seconds=60)),
    )  # fmt: skip
    first = decide(state)
    assert first.decision.active_model == "beta"
    assert first.decision.reason == reasons.COOLDOWN_AFTER_PREEMPTION
    assert first.packing.holders == ("beta", "gamma")
    (gamma,) = [s for s in first.decision.member_statuses if s.name == "gamma"]
    assert (gamma.state, gamma.preempted_at, gamma.preempted_by) == (
        MemberState.ACTIVE, ago(10), "beta"
    )  # fmt: skip
    again = decide(record_packed_decision(state, first))
    assert again.decision.action is not GpuGroupAction.SWAP
    assert again.decision.active_model == "beta" and again.decision.group_events == ()
    assert again.decision.member_statuses == first.decision.member_statuses


def test_an_evicted_member_with_queued_requests_is_called_queued_as_section_3_would() -> None:
    """embed, seated and still asked for, is evicted to make room for big (its cooldown
    starts); with requests queued it is called Queued, as the next decision calls it,
    not Preempted now and Queued one reconcile later."""
    state = group(
        holding("chat", 8 * GIB, priority=100),
        holding("embed", 8 * GIB, priority=100, queued=1, oldest_waiting=ago(5),
                reported_at=ago(0)),
        asking("big", 16 * GIB, priority=300),
        current_model="chat",
        last_swap_time=ago(600),
    )  # fmt: skip
    first = decide(state)
    assert first.packing.evicted == (("embed", "big"),)
    (embed,) = [s for s in first.decision.member_statuses if s.name == "embed"]
    assert (embed.state, embed.preempted_at, embed.preempted_by) == (
        MemberState.QUEUED, T0, "big"
    )  # fmt: skip
    again = decide(record_packed_decision(state, first))
    assert again.decision.member_statuses == first.decision.member_statuses
