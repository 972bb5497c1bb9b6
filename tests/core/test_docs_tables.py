"""Each row of the tables in docs/election.md, as a named test.

`test_every_documented_row_is_tested` reads the tables from the docs, so a row
added to the docs without a case here (or a case whose row was deleted) fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from flexinfer_core import (
    GpuLease,
    ModelState,
    Phase,
    Policy,
    Serverless,
    SharedState,
    apply_decision,
    decide_group,
    desired_replicas,
    elect_leader,
    finetune_lease_ttl,
    lease_is_active,
    reasons,
)

from .builders import T0, ago, member

DOC = Path(__file__).resolve().parents[2] / "docs" / "election.md"
READY, ACTIVE = Phase.READY, SharedState.ACTIVE


def doc_table(heading: str) -> list[str]:
    """First-column cells of the table under `## heading`."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [re.split(r"\s*\|\s*", row.strip())[1] for row in rows[2:]]


# --- Timing defaults -----------------------------------------------------------------


def timing_demand_window() -> None:
    assert Policy().demand_window == timedelta(minutes=2)
    leader = member("leader", phase=READY, shared_state=ACTIVE)
    asker = member("asker", last_active=ago(1))
    busy = [member("leader", phase=READY, shared_state=ACTIVE, last_active=ago(119)), asker]
    edge = [member("leader", phase=READY, shared_state=ACTIVE, last_active=ago(120)), asker]
    idle = [member("leader", phase=READY, shared_state=ACTIVE, last_active=ago(120.001)), asker]
    assert elect_leader(busy, now=T0).leader_name == "leader"
    # Demanded is "younger than" the window and idle "older than" it: at 2m, neither.
    assert elect_leader(edge, now=T0).leader_name == "leader"
    assert elect_leader(idle, now=T0).leader_name == "asker"
    assert leader.name == "leader"


def timing_recent_window() -> None:
    assert (
        elect_leader([member("a", last_active=ago(299)), member("b", priority=999)], now=T0).reason
        == reasons.RECENT_DEMAND
    )
    assert (
        elect_leader(
            [member("a", last_active=ago(300)), member("b", priority=999)], now=T0
        ).leader_name
        == "b"
    )


def timing_swap_cooldown() -> None:
    def group(preempted: float) -> list[ModelState]:
        return [
            member("holder", shared_state=ACTIVE, phase=READY),
            member("vip", priority=900, preempted_at=ago(preempted), last_active=ago(1)),
        ]

    assert elect_leader(group(299), now=T0).reason == reasons.SWAP_COOLDOWN
    assert elect_leader(group(300), now=T0).leader_name == "vip"


def timing_idle_timeout() -> None:
    assert desired_replicas(member("a", last_active=ago(300)), now=T0) == 1
    assert desired_replicas(member("a", last_active=ago(301)), now=T0) == 0


def timing_cold_start_timeout() -> None:
    assert Serverless().cold_start_timeout == timedelta(seconds=60)
    long_load = Serverless(cold_start_timeout=timedelta(minutes=9))
    loading = member(
        "big",
        shared_state=ACTIVE,
        phase=Phase.LOADING,
        last_active=ago(minutes=8),
        serverless=long_load,
    )
    assert (
        elect_leader([loading, member("other", phase=READY)], now=T0).reason
        == reasons.LOADING_HOLDER
    )


def timing_gpu_lease_ttl() -> None:
    assert finetune_lease_ttl(None) == timedelta(seconds=21600 + 600)
    lease = GpuLease(name="ft", group="g", expires_at=T0 + finetune_lease_ttl(3600))
    assert lease_is_active(lease, T0 + timedelta(seconds=3599))
    assert not lease_is_active(lease, T0 + timedelta(seconds=3600))


def timing_drain_timeout() -> None:
    assert member("a").drain_timeout == timedelta(seconds=60)
    busy = member(
        "busy", phase=READY, shared_state=ACTIVE, last_active=ago(1), replicas=1,
        in_flight=1, in_flight_at=ago(1),
    )  # fmt: skip
    vip = member("vip", priority=900, last_active=ago(1))
    started = apply_decision([busy, vip], decide_group([busy, vip], now=T0))
    assert [m.phase for m in started] == [Phase.DRAINING, Phase.IDLE]
    at_deadline = decide_group(started, now=T0 + timedelta(seconds=60), running={"busy"})
    assert at_deadline.member("busy").phase is Phase.PREEMPTED
    assert decide_group(started, now=T0 + timedelta(seconds=59), running={"busy"}).member(
        "busy"
    ).phase is Phase.DRAINING


TIMING: dict[str, Callable[[], None]] = {
    "demand window": timing_demand_window,
    "recent window": timing_recent_window,
    "swap cooldown": timing_swap_cooldown,
    "idle timeout": timing_idle_timeout,
    "cold start timeout": timing_cold_start_timeout,
    "GPU lease TTL": timing_gpu_lease_ttl,
    "drain timeout": timing_drain_timeout,
}


# --- Priority semantics -----------------------------------------------------------------

LEADER_BUSY = {"phase": READY, "shared_state": ACTIVE, "last_active": ago(10)}
LEADER_IDLE = {"phase": READY, "shared_state": ACTIVE, "last_active": ago(minutes=20)}

PRIORITY: dict[str, tuple[list[ModelState], list[GpuLease], str | None, str]] = {
    "higher-priority model demanded, leader Ready and busy": (
        [member("leader", **LEADER_BUSY), member("asker", priority=200, last_active=ago(1))],
        [],
        "asker",
        reasons.DEMAND_PREEMPTION,
    ),
    "equal-priority model demanded, leader Ready and busy": (
        [member("leader", **LEADER_BUSY), member("asker", last_active=ago(1))],
        [],
        "leader",
        reasons.READY_LEADER,
    ),
    "equal-priority model demanded, leader Ready and idle": (
        [member("leader", **LEADER_IDLE), member("asker", last_active=ago(1))],
        [],
        "asker",
        reasons.DEMAND_PREEMPTION,
    ),
    "lower-priority model demanded, leader Ready (busy or idle)": (
        [member("leader", **LEADER_IDLE), member("asker", priority=99, last_active=ago(1))],
        [],
        "leader",
        reasons.READY_LEADER,
    ),
    "a member has `forcePromotion: true`": (
        [
            member("leader", priority=1000, **LEADER_BUSY),
            member("forced", priority=0, force_promotion=True),
        ],
        [],
        "forced",
        reasons.FORCE_PROMOTED,
    ),
    "a GPU lease is active on the group": (
        [member("leader", **LEADER_BUSY), member("forced", force_promotion=True)],
        [GpuLease(name="ft", group="homelab-gpu", owner="trainer")],
        None,
        reasons.GPU_LEASE_HELD,
    ),
    "higher-priority model demanded during a swap cooldown": (
        [
            member("leader", **LEADER_BUSY),
            member("victim", phase=Phase.PREEMPTED, preempted_at=ago(30)),
            member("asker", priority=900, last_active=ago(1)),
        ],
        [],
        "leader",
        reasons.SWAP_COOLDOWN,
    ),
    "leader still loading, equal-priority model demanded": (
        [
            member("leader", phase=Phase.LOADING, shared_state=ACTIVE, last_active=ago(40)),
            member("asker", last_active=ago(1)),
        ],
        [],
        "leader",
        reasons.LOADING_HOLDER,
    ),
    "nobody else demanded, the holder idle past its idle timeout and scaled to zero, "
    "the group has a default": (
        [
            member("leader", phase=Phase.IDLE, shared_state=ACTIVE, last_active=ago(301)),
            member("chat", priority=50, default_member=True),
        ],
        [],
        "chat",
        reasons.RETURN_TO_DEFAULT,
    ),
    "lower-priority model demanded, the default holds the card idle past its own idle timeout": (
        [
            member("chat", default_member=True, **LEADER_IDLE),
            member("asker", priority=50, last_active=ago(1)),
        ],
        [],
        "asker",
        reasons.DEFAULT_YIELDS,
    ),
}


# --- Troubleshooting ------------------------------------------------------------------


def trouble_lower_priority_never_preempts() -> None:
    leader = member(
        "big", priority=500, phase=READY, shared_state=ACTIVE, last_active=ago(minutes=4)
    )
    small = member("small", priority=100, last_active=ago(1))
    decision = decide_group([leader, small], now=T0)
    assert decision.leader == "big"
    # Once the leader has idled out and scaled to zero (no longer Ready), it goes.
    scaled_down = member(
        "big", priority=500, phase=Phase.IDLE, shared_state=ACTIVE, last_active=ago(minutes=6)
    )
    assert decide_group([scaled_down, small], now=T0).leader == "small"


def trouble_swap_loop_prevented_by_cooldown() -> None:
    models = [
        member("a", phase=READY, shared_state=ACTIVE, last_active=ago(minutes=3)),
        member("b", last_active=ago(1)),
    ]
    first = decide_group(models, now=T0)
    assert first.leader == "b"  # a was idle, equal priority: b takes over
    models = list(apply_decision(models, first))
    # One minute later a is asked for again; b is now Loading and a was just evicted.
    later = T0 + timedelta(minutes=1)
    models = [m if m.name != "a" else _evolve(m, last_active=later) for m in models]
    models = [
        m if m.name != "b" else _evolve(m, phase=Phase.READY, last_active=ago(minutes=1))
        for m in models
    ]
    second = decide_group(models, now=later)
    assert second.leader == "b"
    assert second.reason == reasons.SWAP_COOLDOWN


def trouble_rollout_restart_of_leader() -> None:
    restarting = member("chat", phase=Phase.LOADING, shared_state=ACTIVE, last_active=ago(30))
    other = member("other", phase=Phase.PREEMPTED)
    decision = decide_group([restarting, other], now=T0)
    assert decision.leader == "chat"
    assert decision.reason == reasons.LOADING_HOLDER
    assert decision.member("chat").desired_replicas == 1


def trouble_demand_expiring_after_two_minutes() -> None:
    leader = member("leader", phase=READY, shared_state=ACTIVE, last_active=ago(minutes=30))
    asked_once = member("asker", priority=50, last_active=ago(minutes=2))
    assert decide_group([leader, asked_once], now=T0).leader == "leader"
    decision = decide_group(
        [
            member("leader", phase=Phase.IDLE, shared_state=ACTIVE),
            member("asker", last_active=ago(119)),
        ],
        now=T0,
    )
    assert decision.leader == "asker"
    assert decision.next_change_at == T0 + timedelta(seconds=1)


def trouble_training_job_parks_everyone() -> None:
    lease = GpuLease(name="ft", group="homelab-gpu", expires_at=T0 + timedelta(hours=1))
    decision = decide_group(
        [member("a", phase=READY, shared_state=ACTIVE, last_active=ago(1))], now=T0, leases=[lease]
    )
    assert decision.member("a").state is SharedState.QUEUED
    assert decision.member("a").desired_replicas == 0
    assert decision.next_change_at == lease.expires_at


def trouble_waiting_for_gpu() -> None:
    models = [member("old", phase=Phase.PREEMPTED), member("new", last_active=ago(1))]
    decision = decide_group(models, now=T0, running={"old"})
    assert decision.member("new").reason == reasons.WAITING_FOR_GPU


def trouble_default_does_not_come_back() -> None:
    chat = member("chat", default_member=True)
    coder = {"shared_state": ACTIVE, "phase": READY}

    def leader(*others: ModelState, **holder: object) -> str | None:
        models = [chat, member("coder", **{**coder, **holder}), *others]
        return elect_leader(models, now=T0).leader_name

    # Waits while another member is demanded, while the holder is inside its idle
    # timeout, and while it is still Ready (it scales itself to zero first) ...
    assert leader(last_active=ago(10)) == "coder"
    assert leader(last_active=ago(200)) == "coder"
    assert leader(last_active=ago(301)) == "coder"
    assert leader(member("asker", priority=0, last_active=ago(119)), phase=Phase.IDLE) == "asker"
    # ... during a swap cooldown and under a lease ...
    cooling = member("asker", phase=Phase.PREEMPTED, preempted_at=ago(60))
    assert leader(cooling, phase=Phase.IDLE, last_active=ago(301)) == "coder"
    lease = GpuLease(name="ft", group="homelab-gpu")
    holder = member("coder", shared_state=ACTIVE, phase=Phase.IDLE, last_active=ago(301))
    assert elect_leader([chat, holder], now=T0, leases=[lease]).leader_name is None
    # ... and returns once none of them holds.
    assert leader(member("asker", priority=0, last_active=ago(121)), phase=Phase.IDLE) == "chat"


TROUBLE: dict[str, Callable[[], None]] = {
    "lower-priority model never preempts": trouble_lower_priority_never_preempts,
    "continuous swap loop prevented by cooldown": trouble_swap_loop_prevented_by_cooldown,
    "rollout restart of the leader": trouble_rollout_restart_of_leader,
    "demand expiring after 2 minutes": trouble_demand_expiring_after_two_minutes,
    "model stays Queued while a training job runs": trouble_training_job_parks_everyone,
    "leader reports `WaitingForGPU`": trouble_waiting_for_gpu,
    "the default model does not come back": trouble_default_does_not_come_back,
}


def _evolve(model: ModelState, **changes: object) -> ModelState:
    import attrs

    return attrs.evolve(model, **changes)  # type: ignore[arg-type]


# --- the tests ----------------------------------------------------------------------


@pytest.mark.parametrize("row", list(TIMING))
def test_timing_defaults(row: str) -> None:
    TIMING[row]()


@pytest.mark.parametrize("row", list(PRIORITY))
def test_priority_semantics(row: str) -> None:
    models, leases, leader, reason = PRIORITY[row]
    election = elect_leader(models, now=T0, leases=leases)
    assert (election.leader_name, election.reason) == (leader, reason)
    assert f"`{reason}`" in next(
        line
        for line in DOC.read_text(encoding="utf-8").splitlines()
        if line.startswith(f"| {row} |")
    )


@pytest.mark.parametrize("row", list(TROUBLE))
def test_troubleshooting(row: str) -> None:
    TROUBLE[row]()


@pytest.mark.parametrize(
    ("heading", "cases"),
    [("Timing defaults", TIMING), ("Priority semantics", PRIORITY), ("Troubleshooting", TROUBLE)],
)
def test_every_documented_row_is_tested(heading: str, cases: dict[str, object]) -> None:
    assert doc_table(heading) == list(cases)
