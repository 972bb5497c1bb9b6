"""VRAM co-residency (docs/election.md 1.7): each member's seat, its reason and words,
and the tie-breaks."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from flexinfer_core import reasons
from flexinfer_core.election import Ballot
from flexinfer_core.errors import InvalidFieldError
from flexinfer_core.packing import GIB, PACKING, Packing, memory_gate, packing_of
from flexinfer_core.snapshot import ModelState

from .builders import T0, ago, member

BUDGET = 24 * GIB


def budgeted(name: str, gib: float | None, **fields: Any) -> ModelState:
    fields.setdefault("vram_budget", BUDGET)
    size = None if gib is None else int(gib * GIB)
    return member(name, vram_estimate=size, **fields)


def holding(name: str, gib: float | None, **fields: Any) -> ModelState:
    """A member that holds a seat and serves, used a minute ago."""
    fields.setdefault("last_active", ago(minutes=1))
    return budgeted(name, gib, shared_state="Active", phase="Ready", **fields)


def packing(*models: ModelState) -> Packing:
    return packing_of(Ballot.of(models, now=T0))


def test_a_demanded_member_that_fits_sits_beside_the_leader() -> None:
    result = packing(holding("chat", 5.5), budgeted("embed", 4, last_active=ago(10)))
    assert result.holders == ("chat", "embed")
    seat = result.seat("embed")
    assert (seat.admitted, seat.reason) == (True, reasons.CO_RESIDENT)
    assert seat.message == "fits: 9.5 of 24 GiB used"
    assert result.used == int(9.5 * GIB)


def test_a_newcomer_evicts_the_lowest_ranked_holder_only_as_far_as_needed() -> None:
    result = packing(
        holding("lead", 8, priority=300),
        holding("coder", 4, priority=50),
        holding("chat", 4, priority=60),
        holding("vision", 4, priority=70),
        budgeted("big", 8, priority=100, last_active=ago(5)),
    )
    # 20 of 24 used, 4 free: big needs 8, so only coder (the lowest) goes.
    assert result.holders == ("lead", "big", "vision", "chat")
    assert result.evicted == ("coder",)
    assert (
        result.seat("big").message == "evicts coder: needs 8 GiB, 4 free; fits: 24 of 24 GiB used"
    )
    coder = result.seat("coder")
    assert (coder.admitted, coder.reason) == (False, reasons.EVICTED_FOR_VRAM)
    assert coder.message == "evicted by big: it needs 8 GiB, 4 free"


def test_the_worded_example_evicts_coder() -> None:
    result = packing(
        holding("lead", 8, priority=300),
        holding("coder", 12, priority=50),
        budgeted("chat", 12, priority=100, last_active=ago(5)),
    )
    assert result.seat("chat").message.startswith("evicts coder: needs 12 GiB, 4 free")


def test_no_eviction_while_a_swap_cooldown_runs() -> None:
    result = packing(
        holding("lead", 8, priority=300),
        holding("coder", 12, priority=50),
        budgeted("chat", 12, priority=100, last_active=ago(5)),
        budgeted("old", 2, phase="Preempted", preempted_at=ago(minutes=1)),
    )
    assert result.evicted == ()
    seat = result.seat("chat")
    assert (seat.admitted, seat.reason) == (False, reasons.WAITING_FOR_VRAM)
    assert seat.message == "chat needs 12 GiB, 4 free; a swap cooldown runs"


def test_a_busy_holder_of_equal_priority_is_not_evicted() -> None:
    result = packing(
        holding("lead", 8, priority=300),
        holding("coder", 12),
        budgeted("chat", 12, last_active=ago(5)),
    )
    assert result.holders == ("lead", "coder")
    assert result.seat("chat").message == (
        "chat needs 12 GiB, 4 free; chat may not evict coder (docs/election.md 1.2 rule 7) "
        "nor the leader lead"
    )


def test_a_newcomer_too_big_beside_the_leader_says_so() -> None:
    # coder may be evicted (idle, equal priority), but even so 20 GiB do not fit
    # beside lead's 8: nobody is evicted, and the words say why.
    result = packing(
        holding("lead", 8, priority=300),
        holding("coder", 12, last_active=ago(minutes=3)),
        budgeted("chat", 20, last_active=ago(5)),
    )
    assert result.holders == ("lead", "coder")
    assert result.seat("chat").message == (
        "chat needs 20 GiB, 4 free; evicting every other holder would not make room "
        "beside the leader lead"
    )
    alone = packing(holding("lead", 8, priority=300), budgeted("chat", 20, last_active=ago(5)))
    assert alone.seat("chat").message == (
        "chat needs 20 GiB, 16 free; the leader lead is never evicted"
    )


def test_an_idle_holder_of_equal_priority_is_evicted() -> None:
    result = packing(
        holding("lead", 8, priority=300),
        holding("coder", 12, last_active=ago(minutes=3)),
        budgeted("chat", 12, last_active=ago(5)),
    )
    assert result.evicted == ("coder",)


def test_ties_go_to_the_smaller_name_whatever_the_input_order() -> None:
    lead = holding("lead", 12, priority=300)
    a = budgeted("alpha", 12, last_active=ago(5))
    b = budgeted("beta", 12, last_active=ago(5))
    for models in ((lead, a, b), (b, a, lead)):
        result = packing(*models)
        assert result.holders == ("lead", "alpha")
        assert result.seat("beta").message == (
            "beta needs 12 GiB, 0 free; beta may not evict alpha "
            "(docs/election.md 1.2 rule 7) nor the leader lead"
        )


def test_a_leader_of_unknown_footprint_holds_the_card_alone() -> None:
    result = packing(holding("chat", None), budgeted("embed", 1, last_active=ago(5)))
    assert result.holders == ("chat",)
    assert result.seat("embed").message == "not packed: chat's footprint is unknown"


def test_a_newcomer_of_unknown_footprint_waits() -> None:
    result = packing(holding("chat", 4), budgeted("embed", None, last_active=ago(5)))
    assert result.holders == ("chat",)
    assert result.seat("embed").message == "embed's footprint is unknown: it needs the whole card"


def test_an_idle_holder_gives_up_its_seat_quietly() -> None:
    result = packing(
        holding("chat", 4, priority=300), holding("embed", 4, last_active=ago(minutes=6))
    )
    assert result.holders == ("chat",)
    assert result.evicted == ()
    assert (
        result.seat("embed").message == "embed is idle past its idle timeout and gives up its seat"
    )


def test_members_that_disagree_on_the_budget_run_one_at_a_time() -> None:
    result = packing(
        holding("chat", 4),
        budgeted("embed", 4, vram_budget=16 * GIB, last_active=ago(5)),
        budgeted("coder", 4, vram_budget=None),
    )
    assert result.holders == ("chat",)
    assert result.budget.size is None
    assert result.budget.conflict == (
        "members disagree on spec.gpu.vramBudget (chat: 24 GiB, coder: unset, embed: 16 GiB)"
    )


def test_a_lease_parks_every_member() -> None:
    from flexinfer_core.election import elect
    from flexinfer_core.packing import pack
    from flexinfer_core.snapshot import GpuLease

    models = (holding("chat", 4), budgeted("embed", 4, last_active=ago(5)))
    ballot = Ballot.of(models, now=T0, leases=(GpuLease(name="train", group="homelab-gpu"),))
    assert pack(ballot, elect(ballot)).holders == ()


def test_explain_reads_the_packing_stage() -> None:
    ballot = Ballot.of((holding("chat", 5.5), budgeted("embed", 4, last_active=ago(10))), now=T0)
    said = PACKING.decide(ballot)
    assert not isinstance(said, type(None))
    assert callable(said)
    assert "embed: fits: 9.5 of 24 GiB used" in said()  # type: ignore[operator]


@pytest.mark.parametrize("field", ["vram_budget", "vram_estimate"])
@pytest.mark.parametrize("value", [0, -1, True, "24Gi", 1.5])
def test_a_bad_size_names_the_field_and_the_value(field: str, value: object) -> None:
    with pytest.raises(InvalidFieldError) as raised:
        ModelState(name="chat", **{field: value})
    assert raised.value.field == f"ModelState(chat).{field}"
    assert raised.value.value == value
    assert "must be a positive number of bytes" in str(raised.value)


def test_the_memory_gate_counts_every_live_pod() -> None:
    models = (budgeted("chat", 12), budgeted("coder", 10), budgeted("embed", 4))
    assert memory_gate("embed", members=models, running={"chat"}, budget=BUDGET) == (True, "")
    assert memory_gate("embed", members=models, running={"chat", "coder"}, budget=BUDGET) == (
        False,
        "waits for 4 GiB: 22 of 24 GiB held by the pods of chat, coder",
    )
    # No budget: today's rule, whatever the sizes.
    assert memory_gate("embed", members=models, running={"chat"}, budget=None) == (
        False,
        "waits for the pods of chat to be gone",
    )
    assert memory_gate("embed", members=models, running={"embed"}, budget=None) == (True, "")


def test_the_memory_gate_treats_an_unknown_footprint_as_the_whole_card() -> None:
    models = (budgeted("chat", None), budgeted("embed", 4))
    assert memory_gate("embed", members=models, running={"chat"}, budget=BUDGET) == (
        False,
        "waits for the pods of chat to be gone (footprint unknown)",
    )


def test_explain_says_each_seat_of_a_budgeted_group() -> None:
    from flexinfer_core.explain import explain_group

    models = (
        holding("lead", 8, priority=300),
        holding("coder", 12, priority=50),
        budgeted("chat", 12, priority=100, last_active=ago(5)),
    )
    said = explain_group(models, now=T0).packing
    assert said is not None
    assert "chat: evicts coder: needs 12 GiB, 4 free; fits: 20 of 24 GiB used" in said
    assert "coder: evicted by chat: it needs 12 GiB, 4 free" in said
    assert said.startswith("lead: leads; fits: 20 of 24 GiB used; ")
    unbudgeted = [member(m.name, priority=m.priority) for m in models]
    assert explain_group(unbudgeted, now=T0).packing is None


def test_a_co_holder_is_sized_as_a_leader_and_waits_for_room() -> None:
    from flexinfer_core.group import decide_group

    models = (
        holding("chat", 12, priority=300),
        budgeted("embed", 4, last_active=ago(5)),
        budgeted("coder", 10, phase="Preempted", preempted_at=ago(minutes=10)),
    )
    # coder's pod is still terminating: 12 + 10 held, embed's 4 do not fit yet.
    decision = decide_group(models, now=T0, running={"chat", "coder"})
    embed = decision.member("embed")
    assert embed.is_leader and embed.desired_replicas == 0
    assert embed.reason == reasons.WAITING_FOR_GPU
    assert embed.message == (
        "embed holds the GPU and waits for 4 GiB: 22 of 24 GiB held by the pods of chat, coder"
    )
    started = decide_group(models, now=T0, running={"chat"}).member("embed")
    assert started.desired_replicas == 1
    assert started.reason == reasons.CO_RESIDENT
    assert started.message == "embed shares the card with chat: fits: 16 of 24 GiB used"


# --- What each member is told: the `Packed` condition and `status.vram` -------------


def test_a_budget_conflict_reaches_every_members_status() -> None:
    from flexinfer_core import apply_decision
    from flexinfer_core.group import CONDITION_PACKED, decide_group

    models = (
        holding("chat", 4),
        budgeted("embed", 4, vram_budget=16 * GIB, last_active=ago(5)),
        budgeted("coder", 4, vram_budget=None),
    )
    decision = decide_group(models, now=T0)
    assert [p.name for p in decision.packed] == ["chat", "coder", "embed"]
    for told in decision.packed:
        assert told.condition.type == CONDITION_PACKED
        assert told.condition.status is False
        assert told.condition.reason == reasons.VRAM_BUDGET_CONFLICT
        assert told.condition.message == (
            "members disagree on spec.gpu.vramBudget (chat: 24 GiB, coder: unset, "
            "embed: 16 GiB): the group runs one member at a time"
        )
        assert told.vram is not None and told.vram.budget is None and told.vram.used is None
    assert decision.packed_status("embed").vram.footprint == 4 * GIB  # type: ignore[union-attr]
    # Once written, deciding again writes nothing more.
    again = decide_group(apply_decision(models, decision), now=T0)
    assert again.changes(apply_decision(models, decision)) == ()


def test_each_member_is_told_its_seat_and_the_budget_use() -> None:
    from flexinfer_core.group import decide_group

    models = (
        holding("chat", 5.5, priority=200),
        budgeted("embed", 4, priority=150, last_active=ago(5)),
        budgeted("coder", 16, last_active=ago(5)),
    )
    decision = decide_group(models, now=T0)
    embed = decision.packed_status("embed")
    coder = decision.packed_status("coder")
    assert embed is not None and coder is not None
    assert (embed.condition.status, embed.condition.reason) == (True, reasons.CO_RESIDENT)
    assert embed.condition.message == "fits: 9.5 of 24 GiB used"
    assert (coder.condition.status, coder.condition.reason) == (False, reasons.WAITING_FOR_VRAM)
    assert coder.condition.message.startswith("coder needs 16 GiB, 14.5 free")
    assert embed.vram is not None
    assert (embed.vram.footprint, embed.vram.budget, embed.vram.used) == (
        4 * GIB,
        BUDGET,
        int(9.5 * GIB),
    )


def test_without_a_budget_nothing_is_told_unless_it_was_before() -> None:
    from flexinfer_core.group import CONDITION_PACKED, decide_group
    from flexinfer_core.snapshot import Condition, VramUse

    plain = (member("chat", shared_state="Active", phase="Ready", last_active=ago(1)),)
    assert decide_group(plain, now=T0).packed == ()
    # A group whose budget was removed: its words say so instead of staying as written.
    was = (
        member(
            "chat",
            shared_state="Active",
            phase="Ready",
            last_active=ago(1),
            recorded_vram=VramUse(4 * GIB, BUDGET, 4 * GIB),
            recorded_packed=Condition(CONDITION_PACKED, True, "RecentDemand", "leader"),
        ),
    )
    decision = decide_group(was, now=T0)
    told = decision.packed_status("chat")
    assert told is not None and told.vram is None
    assert (told.condition.status, told.condition.reason) == (False, reasons.NO_VRAM_BUDGET)
    assert decision.members == decide_group(plain, now=T0).members


def test_without_a_shared_card_a_budgeted_group_decides_as_today_and_says_why() -> None:
    from flexinfer_core.group import CONDITION_PACKED, decide_group

    models = (
        holding("chat", 5.5, priority=200),
        budgeted("embed", 4, last_active=ago(5)),
    )
    unbudgeted = tuple(attrs.evolve(m, vram_budget=None) for m in models)
    shared = decide_group(models, now=T0)
    assert shared.member("embed").is_leader  # packed beside chat
    alone = decide_group(models, now=T0, shared_card=False)
    assert alone.members == decide_group(unbudgeted, now=T0).members
    assert [m.name for m in alone.members if m.is_leader] == ["chat"]
    for told in alone.packed:
        assert told.condition.type == CONDITION_PACKED
        assert (told.condition.status, told.condition.reason) == (False, reasons.NO_SHARED_CARD)
        assert "--gpu-device-class" in told.condition.message
        assert told.vram is not None and told.vram.budget == BUDGET and told.vram.used is None


def test_a_model_alone_is_told_nothing_of_packing() -> None:
    from flexinfer_core.group import decide_group

    alone = budgeted("solo", 4, group="", last_active=ago(1))
    assert decide_group((alone,), now=T0).packed == ()
    assert decide_group((alone,), now=T0, shared_card=False).packed == ()


def test_a_loading_newcomer_named_leader_is_told_the_reason_that_holds_once_written() -> None:
    # Found by the packing fixed-point property: an idle Ready member (no status yet)
    # and a demanded loading one that fits beside it. Written, the loading one leads
    # (rule 5), the idle one is preempted, and that preemption starts the cooldown: the
    # leader's condition must already give the cooldown, or the next reconcile, with no
    # news, rewrites it.
    from flexinfer_core import apply_decision
    from flexinfer_core.group import decide_group

    models = (
        budgeted("alpha", 1, priority=50, phase="Ready", vram_budget=8 * GIB),
        budgeted("beta", 1, priority=0, phase="Pending", last_active=T0, vram_budget=8 * GIB),
    )
    # No pod is live yet (the controller has just scaled them).
    decision = decide_group(models, now=T0, running=frozenset())
    assert decision.leader == "beta"
    assert decision.member("beta").reason == reasons.SWAP_COOLDOWN
    written = apply_decision(models, decision)
    assert decide_group(written, now=T0, running=frozenset()).changes(written) == ()
