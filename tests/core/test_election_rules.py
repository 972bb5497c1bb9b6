"""docs/election.md 1.1–1.2: each rule of the election, in order."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flexinfer_core import (
    GpuLease,
    LeaseSource,
    Phase,
    Serverless,
    SharedState,
    better,
    elect_leader,
    reasons,
)

from .builders import T0, ago, member

READY = Phase.READY
ACTIVE = SharedState.ACTIVE


# --- 1.1 order of candidates ------------------------------------------------------


def test_better_prefers_priority_then_recency_then_name() -> None:
    high = member("z", priority=200)
    low_recent = member("a", priority=100, last_active=ago(1))
    low_old = member("b", priority=100, last_active=ago(100))
    low_never = member("c", priority=100)
    assert better(high, low_recent)
    assert better(low_recent, low_old)
    assert better(low_old, low_never)  # absent counts as oldest
    assert better(member("a"), member("b"))  # then the smaller name
    assert not better(member("b"), member("a"))


def test_result_independent_of_input_order() -> None:
    models = [
        member("a", priority=100, phase=READY, last_active=ago(minutes=10)),
        member("b", priority=100, last_active=ago(5)),
        member("c", priority=50, last_active=ago(1)),
    ]
    leaders = {elect_leader(list(p), now=T0).leader_name for p in _rotations(models)}
    assert leaders == {"b"}


def _rotations(items: list) -> list[list]:  # type: ignore[type-arg]
    return [items[i:] + items[:i] for i in range(len(items))] + [items[::-1]]


# --- 1.2 the rules -----------------------------------------------------------------


def test_rule1_empty_group_has_no_leader() -> None:
    election = elect_leader([], now=T0)
    assert election.leader is None
    assert election.reason == reasons.EMPTY_GROUP


def test_rule2_active_lease_parks_everyone_even_force_promoted() -> None:
    models = [member("a", force_promotion=True, phase=READY), member("b", last_active=ago(1))]
    lease = GpuLease(name="train", group="homelab-gpu", owner="finetune-job")
    election = elect_leader(models, now=T0, leases=[lease])
    assert election.leader is None
    assert election.reason == reasons.GPU_LEASE_HELD == "GPULeaseHeld"
    assert "gpu-lease/finetune-job" in election.message


def test_rule2_expired_lease_is_ignored() -> None:
    lease = GpuLease(name="train", group="homelab-gpu", expires_at=T0)
    election = elect_leader([member("a", phase=READY)], now=T0, leases=[lease])
    assert election.leader_name == "a"


def test_rule2_lease_of_another_group_or_namespace_is_ignored() -> None:
    other_group = GpuLease(name="x", group="other")
    other_ns = GpuLease(name="y", group="homelab-gpu", namespace="elsewhere")
    election = elect_leader([member("a", phase=READY)], now=T0, leases=[other_group, other_ns])
    assert election.leader_name == "a"


def test_rule2_configmap_lease_parks_too() -> None:
    lease = GpuLease(
        name="gpu-lease-homelab-gpu",
        group="homelab-gpu",
        source=LeaseSource.CONFIG_MAP,
        expires_at=T0 + timedelta(hours=1),
    )
    assert elect_leader([member("a", phase=READY)], now=T0, leases=[lease]).leader is None


def test_rule2_unreadable_lease_fails_open_and_says_so() -> None:
    election = elect_leader(
        [member("a", phase=READY)], now=T0, unreadable_lease_sources=["gpuleases", "configmaps"]
    )
    assert election.leader_name == "a"
    assert election.reason == reasons.READY_LEADER  # the rule that decided
    assert election.unreadable_lease_sources == ("configmaps", "gpuleases")
    assert election.lease_unreadable
    assert election.message == (
        "GPU leases could not be read (configmaps, gpuleases); proceeding as unleased "
        "(fail open): a is ready and keeps the card"
    )


def test_rule2_a_lease_that_was_read_parks_even_when_another_source_is_unreadable() -> None:
    lease = GpuLease(name="train", group="homelab-gpu", source=LeaseSource.CONFIG_MAP)
    election = elect_leader(
        [member("a", phase=READY)], now=T0, leases=[lease], unreadable_lease_sources=["gpuleases"]
    )
    assert (election.leader, election.reason, election.lease) == (
        None,
        reasons.GPU_LEASE_HELD,
        lease,
    )
    assert not election.lease_unreadable
    assert "fail open" not in election.message


def test_rule2_a_lease_whose_expiry_does_not_parse_fails_open_and_says_why() -> None:
    """Read as "no expiry" it would park the group forever; the spec says fail open."""
    broken = GpuLease(
        name="gpu-lease-homelab-gpu",
        group="homelab-gpu",
        source=LeaseSource.CONFIG_MAP,
        problem="data.expiresAt: 'tomorrow' is not an RFC 3339 time",
    )
    election = elect_leader([member("a", phase=READY)], now=T0, leases=[broken])
    assert (election.leader_name, election.reason) == ("a", reasons.READY_LEADER)
    assert election.unreadable_leases == (broken,)
    assert election.lease_unreadable
    assert election.message == (
        "GPU lease ConfigMap gpu-lease-homelab-gpu cannot be read (data.expiresAt: "
        "'tomorrow' is not an RFC 3339 time); proceeding as unleased (fail open): a is ready "
        "and keeps the card"
    )
    # A readable lease beside it still parks the group.
    held = GpuLease(name="train", group="homelab-gpu")
    parked = elect_leader([member("a", phase=READY)], now=T0, leases=[broken, held])
    assert (parked.leader, parked.lease, parked.lease_unreadable) == (None, held, False)


def test_rule2_a_model_outside_any_shared_group_never_fails_open() -> None:
    solo = member("solo", group="", phase=READY)
    election = elect_leader([solo], now=T0, unreadable_lease_sources=["gpuleases"])
    assert (election.leader_name, election.lease_unreadable) == ("solo", False)


def test_rule3_force_promotion_beats_cooldown_priority_and_readiness() -> None:
    models = [
        member("big", priority=900, phase=READY, shared_state=ACTIVE, last_active=ago(1)),
        member("forced", priority=10, force_promotion=True, preempted_at=ago(5)),
        member("forced2", priority=5, force_promotion=True),
    ]
    election = elect_leader(models, now=T0)
    assert election.leader_name == "forced"
    assert election.reason == reasons.FORCE_PROMOTED


def test_rule4_cooldown_keeps_the_active_holder_against_higher_priority_demand() -> None:
    models = [
        member("holder", priority=10, shared_state=ACTIVE, phase=Phase.LOADING),
        member("victim", priority=100, preempted_at=ago(60), phase=Phase.PREEMPTED),
        member("vip", priority=1000, last_active=ago(1), phase=READY),
    ]
    election = elect_leader(models, now=T0)
    assert election.leader_name == "holder"
    assert election.reason == reasons.SWAP_COOLDOWN


def test_rule4_cooldown_is_the_largest_in_group_with_default_for_unset() -> None:
    # b sets 1m, a has none (contributes the 5m default): 4 minutes after the
    # preemption the group is still cooling down.
    models = [
        member("a", shared_state=ACTIVE, phase=READY),
        member(
            "b",
            priority=500,
            swap_cooldown=timedelta(minutes=1),
            preempted_at=ago(minutes=4),
            last_active=ago(1),
        ),
    ]
    assert elect_leader(models, now=T0).reason == reasons.SWAP_COOLDOWN
    shorter = [
        m
        if m.name != "a"
        else member("a", shared_state=ACTIVE, phase=READY, swap_cooldown=timedelta(minutes=1))
        for m in models
    ]
    assert elect_leader(shorter, now=T0).leader_name == "b"


def test_rule4_cooldown_ends_exactly_at_preempted_at_plus_cooldown() -> None:
    models = [
        member("a", shared_state=ACTIVE, phase=READY),
        member("b", priority=500, preempted_at=ago(minutes=5), last_active=ago(1)),
    ]
    assert elect_leader(models, now=T0).reason == reasons.DEMAND_PREEMPTION
    just_inside = T0 - timedelta(microseconds=1)
    models_inside = [
        models[0],
        member(
            "b",
            priority=500,
            preempted_at=ago(minutes=5),
            last_active=just_inside - timedelta(seconds=1),
        ),
    ]
    assert elect_leader(models_inside, now=just_inside).reason == reasons.SWAP_COOLDOWN


def test_rule4_needs_an_active_member() -> None:
    models = [
        member("a", phase=READY),
        member("b", priority=500, preempted_at=ago(10), last_active=ago(1)),
    ]
    assert elect_leader(models, now=T0).leader_name == "b"


def test_rule5_loading_holder_keeps_card_against_equal_or_lower_demand() -> None:
    models = [
        member(
            "loading",
            priority=100,
            shared_state=ACTIVE,
            phase=Phase.LOADING,
            last_active=ago(minutes=4),
        ),
        member("other", priority=100, phase=READY, last_active=ago(1)),
    ]
    election = elect_leader(models, now=T0)
    assert election.leader_name == "loading"
    assert election.reason == reasons.LOADING_HOLDER


def test_rule5_strictly_higher_priority_demand_interrupts_a_load() -> None:
    models = [
        member(
            "loading", priority=100, shared_state=ACTIVE, phase=Phase.PENDING, last_active=ago(30)
        ),
        member("vip", priority=101, last_active=ago(1)),
    ]
    election = elect_leader(models, now=T0)
    assert election.leader_name == "vip"


def test_rule5_protection_lasts_max_of_recent_window_and_cold_start() -> None:
    slow = Serverless(cold_start_timeout=timedelta(minutes=10))
    loading = member(
        "loading",
        shared_state=ACTIVE,
        phase=Phase.LOADING,
        last_active=ago(minutes=8),
        serverless=slow,
    )
    ready_other = member("other", phase=READY)
    assert elect_leader([loading, ready_other], now=T0).reason == reasons.LOADING_HOLDER
    # With the default 60s cold start the 5m recent window bounds it: 8m is too long.
    plain = member("loading", shared_state=ACTIVE, phase=Phase.LOADING, last_active=ago(minutes=8))
    assert elect_leader([plain, ready_other], now=T0).leader_name == "other"


def test_rule5_boundary_is_inclusive() -> None:
    at_edge = member(
        "loading", shared_state=ACTIVE, phase=Phase.LOADING, last_active=ago(minutes=5)
    )
    other = member("other", phase=READY)
    assert elect_leader([at_edge, other], now=T0).reason == reasons.LOADING_HOLDER


def test_rule6_unrunnable_members_are_not_classified() -> None:
    models = [
        member("failed", priority=900, phase=Phase.FAILED, last_active=ago(1)),
        member("nocache", priority=800, cache_ready=False, last_active=ago(1)),
        member("ok", priority=100, phase=READY),
    ]
    assert elect_leader(models, now=T0).leader_name == "ok"


def test_rule7_higher_priority_demand_preempts_busy_ready_leader() -> None:
    models = [
        member("leader", priority=100, phase=READY, shared_state=ACTIVE, last_active=ago(5)),
        member("vip", priority=200, last_active=ago(10)),
    ]
    election = elect_leader(models, now=T0)
    assert election.leader_name == "vip"
    assert election.reason == reasons.DEMAND_PREEMPTION


def test_rule7_equal_priority_takes_only_an_idle_leader() -> None:
    busy = member("leader", phase=READY, shared_state=ACTIVE, last_active=ago(30))
    idle = member("leader", phase=READY, shared_state=ACTIVE, last_active=ago(minutes=3))
    asker = member("asker", last_active=ago(1))
    assert elect_leader([busy, asker], now=T0).leader_name == "leader"
    assert elect_leader([idle, asker], now=T0).leader_name == "asker"


def test_rule7_leader_never_active_counts_as_idle() -> None:
    leader = member("leader", phase=READY, shared_state=ACTIVE)
    asker = member("asker", last_active=ago(1))
    assert elect_leader([leader, asker], now=T0).leader_name == "asker"


def test_rule7_lower_priority_never_preempts_ready_leader_even_idle() -> None:
    leader = member(
        "leader", priority=500, phase=READY, shared_state=ACTIVE, last_active=ago(minutes=30)
    )
    asker = member("asker", priority=100, last_active=ago(1))
    election = elect_leader([leader, asker], now=T0)
    assert election.leader_name == "leader"
    assert election.reason == reasons.READY_LEADER


def test_rule7_at_exactly_the_demand_window_the_leader_is_neither_busy_nor_idle() -> None:
    """spec 1.2: demanded is "younger than" the window, idle "older than" it; both strict."""
    asker = member("asker", last_active=ago(1))

    def leader_aged(age: timedelta) -> str | None:
        leader = member("leader", phase=READY, shared_state=ACTIVE, last_active=T0 - age)
        return elect_leader([leader, asker], now=T0).leader_name

    tick = timedelta(microseconds=1)
    assert leader_aged(timedelta(minutes=2) - tick) == "leader"  # busy
    assert leader_aged(timedelta(minutes=2)) == "leader"  # neither: no preemption yet
    assert leader_aged(timedelta(minutes=2) + tick) == "asker"  # idle
    asker_at_edge = member("asker", last_active=ago(minutes=2))
    idle = member("leader", phase=READY, shared_state=ACTIVE, last_active=ago(minutes=3))
    # A challenger exactly at the window is no longer demanded either.
    assert elect_leader([idle, asker_at_edge], now=T0).leader_name == "leader"


def test_rule8_ready_member_leads_without_demand() -> None:
    models = [member("ready", phase=READY), member("idle", priority=900)]
    election = elect_leader(models, now=T0)
    assert election.leader_name == "ready"
    assert election.reason == reasons.READY_LEADER


def test_rule9_recent_member_leads_when_none_ready() -> None:
    models = [member("recent", last_active=ago(minutes=4)), member("never", priority=900)]
    election = elect_leader(models, now=T0)
    assert election.leader_name == "recent"
    assert election.reason == reasons.RECENT_DEMAND


@pytest.mark.parametrize(
    ("serverless", "expected"),
    [
        (Serverless(min_replicas=1), "warm"),
        (Serverless(enabled=False), "warm"),
        (Serverless(), "zz-top"),
    ],
)
def test_rule10_fallback_prefers_a_member_that_would_run(
    serverless: Serverless, expected: str
) -> None:
    models = [member("warm", priority=1, serverless=serverless), member("zz-top", priority=999)]
    election = elect_leader(models, now=T0)
    assert election.leader_name == expected
    assert election.reason == reasons.FALLBACK


def test_rule10_fallback_to_unrunnable_when_nothing_runs() -> None:
    models = [member("a", phase=Phase.FAILED), member("b", cache_ready=False, priority=300)]
    assert elect_leader(models, now=T0).leader_name == "b"


def test_rule4_a_ready_members_own_stamp_does_not_hold_the_card() -> None:
    # Back to Ready within its own cooldown (e.g. after a short lease): its stamp is
    # cleared by this decision, so it must not keep the card now and lose it on the
    # next reconcile.
    back = member(
        "back", phase=READY, shared_state=ACTIVE, preempted_at=ago(30), last_active=ago(minutes=10)
    )
    vip = member("vip", priority=500, last_active=ago(1))
    election = elect_leader([back, vip], now=T0)
    assert election.leader_name == "vip"
    assert election.reason == reasons.DEMAND_PREEMPTION
