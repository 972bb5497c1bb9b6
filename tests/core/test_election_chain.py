"""The election is one chain of named rules, the rule book's, and everything walks it.

docs/election.md 1.2 lists the rules and 3 the GPUGroup's steps; the code's lists must
be the same names in the same order. The timer, explain's wording of what crosses
and status's cooldown end come from the rule that reads each threshold.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexinfer_core import GpuLease, Phase, SharedState, decide_group, next_change_at, reasons
from flexinfer_core.election import (
    CHAIN,
    RULES,
    Ballot,
    Crossing,
    Threshold,
    candidate_rank,
    cooldown_ends_at,
    crossings,
    ranked,
)
from flexinfer_core.gpugroup import GPU_GROUP_RULES
from flexinfer_core.group import STAGES, describe_threshold, thresholds

from .builders import T0, ago, member

ROOT = Path(__file__).resolve().parents[2]
RULE_BOOK = ROOT / "docs" / "election.md"
READY, ACTIVE = Phase.READY, SharedState.ACTIVE


def numbered_rules(heading: str) -> list[str]:
    """The bold names of the numbered list under `heading` in docs/election.md."""
    text = RULE_BOOK.read_text(encoding="utf-8")
    section = text.split(f"{heading}\n", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    return re.findall(r"^\d+\. \*\*(.+?)\*\*", section, flags=re.MULTILINE)


def test_the_chain_is_the_rule_books_list_in_order() -> None:
    assert numbered_rules("### 1.2 The election, in order") == [name for _, name in RULES]
    assert [rule.name for rule in CHAIN] == [name for _, name in RULES]
    assert [number for number, _ in RULES] == list(range(1, len(CHAIN) + 1))


def test_the_gpu_group_steps_are_the_rule_books_list_in_order() -> None:
    assert numbered_rules("## 3. GPUGroups (v1alpha1)") == [name for _, name in GPU_GROUP_RULES]


def test_the_leaders_reason_is_read_on_the_settled_ballot() -> None:
    # chat (Ready, idle) is preempted by coder: the swap itself is DemandPreemption, but
    # once written chat's preemption starts the cooldown, which is what holds the card.
    models = [
        member("chat", phase=READY, shared_state=ACTIVE, last_active=ago(minutes=10)),
        member("coder", priority=200, last_active=ago(1)),
    ]
    decision = decide_group(models, now=T0)
    assert (decision.leader, decision.reason) == ("coder", reasons.DEMAND_PREEMPTION)
    assert decision.member("coder").reason == reasons.SWAP_COOLDOWN
    ballot = Ballot.of(models, now=T0)
    settled = ballot.settled(decision.members)
    assert settled is not None and settled.holder is not None
    assert settled.holder.name == "coder"
    assert {m.name: m.phase for m in settled.members} == {
        "coder": Phase.IDLE,
        "chat": Phase.PREEMPTED,
    }
    assert ballot.holder is not None and ballot.holder.name == "chat"  # the ballot is a value
    # Writing the same decision again changes nothing the election reads.
    assert settled.settled(decision.members) is None
    # A member going from no state to Queued is not something the election reads.
    fresh = Ballot.of([member("a", phase=READY)], now=T0)
    assert fresh.settled([Written("a", SharedState.QUEUED, READY, None)]) is None
    assert fresh.settled([Written("a", ACTIVE, READY, None)]) is not None


class Written(NamedTuple):
    name: str
    state: SharedState | None
    phase: Phase
    preempted_at: datetime | None


def test_every_threshold_is_listed_and_worded_by_one_rule() -> None:
    models = [
        member("chat", phase=Phase.LOADING, shared_state=ACTIVE, last_active=ago(30)),
        member(
            "coder",
            phase=Phase.PREEMPTED,
            preempted_at=ago(10),
            last_active=ago(20),
            default_member=True,
        ),
        member(
            "embed",
            phase=Phase.DRAINING,
            draining_since=ago(5),
            in_flight=2,
            in_flight_at=ago(1),
        ),
    ]
    expired = GpuLease(name="ft", group="homelab-gpu", expires_at=ago(minutes=1))
    ballot = Ballot.of(models, now=T0)
    for rule in (*CHAIN, *STAGES):
        for instant in rule.crossings(ballot, None) if rule.crossings is not None else ():
            crossing = Crossing(*instant)
            owners = [r.name for r in (*CHAIN, *STAGES) if r.says(ballot, crossing) is not None]
            assert owners in ([rule.name], []), (crossing, owners)
    kinds = {c.kind for c in thresholds(models, now=T0, leases=[expired])}
    assert kinds == set(Threshold)
    # The words explain prints for a crossing come from the rule that lists it.
    cooldown = next(c for c in thresholds(models, now=T0) if c.kind is Threshold.SWAP_COOLDOWN)
    assert describe_threshold(models, cooldown, now=T0) == (
        "the 5m swap cooldown after coder's preemption ends"
    )


def test_under_a_lease_only_the_leases_expiry_is_a_threshold() -> None:
    lease = GpuLease(name="ft", group="homelab-gpu", expires_at=T0 + timedelta(hours=1))
    models = [member("chat", phase=READY, shared_state=ACTIVE, last_active=ago(30))]
    assert [c.kind for c in crossings(Ballot.of(models, now=T0, leases=[lease]))] == [
        Threshold.LEASE_EXPIRY
    ]
    assert next_change_at(models, now=T0, leases=[lease]) == lease.expires_at


@pytest.mark.parametrize(
    ("phase", "ends"),
    [(Phase.PREEMPTED, T0 + timedelta(minutes=4)), (READY, None)],
)
def test_the_cooldown_end_is_the_swap_cooldown_rules(phase: Phase, ends: object) -> None:
    models = [
        member("chat", phase=READY, shared_state=ACTIVE),
        member("coder", phase=phase, preempted_at=ago(minutes=1)),
    ]
    assert cooldown_ends_at(Ballot.of(models, now=T0)) == ends


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=3),
            st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
        ),
        max_size=8,
    )
)
def test_the_ballots_order_is_the_candidate_rank(rows: list[tuple[int, int | None]]) -> None:
    """The ballot sorts with three cheap stable sorts; the order must be `better`'s."""
    models = [
        member(
            f"m{index}",
            priority=100 * priority,
            last_active=None if seconds is None else ago(seconds),
        )
        for index, (priority, seconds) in enumerate(rows)
    ]
    assert list(ranked(models)) == sorted(models, key=candidate_rank)
    assert list(ranked(reversed(models))) == sorted(models, key=candidate_rank)
