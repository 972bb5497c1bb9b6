"""Break-before-make by memory at the last moment (`write_plan.Interlock`): what a
scale-up checks in the live pod list of its group (docs/election.md 1.7)."""

from __future__ import annotations

from flexinfer_core.packing import GIB
from flexinfer_k8s.write_plan import Interlock

BUDGET = 24 * GIB
PACKED = Interlock(
    group="g",
    kind="Model",
    budget=BUDGET,
    footprints=(("big", 16 * GIB), ("chat", 8 * GIB), ("embed", 8 * GIB)),
)


def test_without_a_budget_no_other_member_may_have_pods() -> None:
    alone = Interlock(group="g", kind="Model")
    assert alone.waits_for("chat", set()) == ""
    assert alone.waits_for("chat", {"chat"}) == ""
    assert alone.waits_for("chat", {"embed"}) == "other members still have pods: embed"
    # Footprints alone change nothing: the budget says the pods share a card.
    unbudgeted = Interlock(group="g", kind="Model", footprints=PACKED.footprints)
    assert unbudgeted.waits_for("chat", {"embed"}) != ""


def test_with_a_budget_live_footprints_plus_its_own_must_fit() -> None:
    assert PACKED.waits_for("embed", {"chat"}) == ""  # 8 + 8 of 24
    assert PACKED.waits_for("big", {"chat"}) == ""  # 8 + 16 = 24: fits exactly
    # A terminating member's pods count until they are gone.
    assert PACKED.waits_for("big", {"chat", "embed"}) == (
        "waits for 16 GiB: 16 of 24 GiB held by the pods of chat, embed"
    )


def test_an_unknown_footprint_takes_the_whole_card() -> None:
    # A member with no footprint (unknown, or its pods cannot share the claim), or a
    # former member: nobody starts beside its pods, and it starts beside nobody's.
    assert PACKED.waits_for("chat", {"gone"}) == "other members still have pods: gone"
    assert PACKED.waits_for("odd", {"chat"}) == "other members still have pods: chat"


def test_accounted_members_are_not_counted() -> None:
    lock = Interlock(group="g", kind="ModelDeployment", accounted=frozenset({"old"}))
    assert lock.waits_for("new", {"old"}) == ""
