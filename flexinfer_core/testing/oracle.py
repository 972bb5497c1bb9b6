"""The spec's small definitions, written out again independently of the core.

Properties state their preconditions with these (docs/election.md 1.1–1.3), so a
bug in the core's own helpers (its ordering, its cooldown, its windows) cannot
hide by being used on both sides of an assertion. Only definitions live here; the
rules under test are asserted in the test modules.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from flexinfer_core import ModelState, Phase, SharedState

DEMAND_WINDOW = timedelta(minutes=2)
RECENT_WINDOW = timedelta(minutes=5)
DEFAULT_SWAP_COOLDOWN = timedelta(minutes=5)


def rank(model: ModelState) -> tuple[int, float, str]:
    """The election's `better`: priority desc, then latest lastActiveTime (absent
    oldest), then name."""
    active = model.last_active.timestamp() if model.last_active is not None else float("-inf")
    return (-model.priority, -active, model.name)


def best(models: Iterable[ModelState]) -> ModelState | None:
    return min(models, key=rank, default=None)


def runnable(model: ModelState) -> bool:
    return model.phase is not Phase.FAILED and model.cache_ready


def demanded(model: ModelState, now: datetime) -> bool:
    """lastActiveTime younger than the demand window."""
    return model.last_active is not None and now - model.last_active < DEMAND_WINDOW


def idle(model: ModelState, now: datetime) -> bool:
    """lastActiveTime absent or older than the demand window (strictly: at exactly the
    window a member is neither demanded nor idle)."""
    return model.last_active is None or now - model.last_active > DEMAND_WINDOW


def cooldown(
    models: Iterable[ModelState], *, default: timedelta = DEFAULT_SWAP_COOLDOWN
) -> timedelta:
    """The largest swapCooldown; a member without one contributes the default (5m)."""
    return max((m.swap_cooldown if m.swap_cooldown is not None else default) for m in models)


def cooldown_holds(
    models: Iterable[ModelState], now: datetime, *, default: timedelta = DEFAULT_SWAP_COOLDOWN
) -> bool:
    """Some member's preemptedAt is younger than the group cooldown (rule 4's first half).

    A member that is Ready again does not count: the decision clears its stamp, and
    counting it would hold the card for exactly one reconcile. Nor does an Active
    member observed Draining (kept, it is Ready again; evicted, stamped anew).
    """
    members = list(models)
    if not members:
        return False
    window = cooldown(members, default=default)
    return any(
        m.phase is not Phase.READY
        and not (m.phase is Phase.DRAINING and m.shared_state is SharedState.ACTIVE)
        and m.preempted_at is not None
        and now - m.preempted_at < window
        for m in members
    )


def active_members(models: Iterable[ModelState]) -> list[ModelState]:
    return [m for m in models if m.shared_state is SharedState.ACTIVE]


def group_default(models: Iterable[ModelState]) -> ModelState | None:
    """The group's default (docs/election.md 1.5): of the members with spec.gpu.default,
    the highest priority, then the alphabetically smaller name."""
    marked = [m for m in models if m.default_member and m.group]
    return min(marked, key=lambda m: (-m.priority, m.name), default=None)


def idle_past_timeout(model: ModelState, now: datetime) -> bool:
    """lastActiveTime absent or strictly older than the member's own idleTimeout."""
    return model.last_active is None or now - model.last_active > model.serverless.idle_timeout


def leader_replicas(model: ModelState, now: datetime, *, warm: bool = False) -> int:
    """The leader's desired replicas, before break-before-make; a leader whose
    ModelCache is not ready (elected only because nobody is runnable) runs nothing.
    `warm`: the leader is its group's default, which never goes below one replica."""
    if not model.cache_ready:
        return 0
    serverless = model.serverless
    if not serverless.enabled:
        return 1
    # A load goes on while someone asked for the model within the time it may take.
    grace = max(serverless.idle_timeout, serverless.cold_start_timeout)
    asked = model.last_active is not None and now - model.last_active <= grace
    if model.phase is Phase.LOADING and asked:
        return 1
    if warm:
        return max(1, serverless.min_replicas)
    if model.last_active is None or now - model.last_active > serverless.idle_timeout:
        return serverless.min_replicas
    return max(1, serverless.min_replicas)
