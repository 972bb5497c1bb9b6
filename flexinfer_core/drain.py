"""Draining: a replaced holder finishes its requests in flight before it is scaled to 0.

docs/election.md 1.6. When a decision takes the card from a `Ready` member whose fresh
in-flight report (`status.inFlight`, written by the proxy) is above 0 and whose
`spec.gpu.drainTimeout` is above 0, the member becomes `Draining` instead of
`Preempted`: it keeps its replicas, and the new holder waits (break-before-make is
unchanged: the holder starts only once the drained pods are gone). The drain ends when
the report says 0 (or goes stale), or at the deadline, `drainingSince` plus the drain
timeout, whichever comes first; then the member is `Preempted` and scaled to 0 as any
other. `drainingSince` is written on the member's status, so a controller that restarts
mid-drain reads the same deadline.

A draining member still counts as *ready* for the election (its server is up): if the
election changes its mind while it drains, it is the leader again and simply goes back
to `Ready`, with no restart.

`DRAIN` is a stage of the decision with the `Rule` shape (like the leader's replicas,
`flexinfer_core.group.REPLICAS`): it never elects, but its crossings (each drain's
deadline, and the instant its in-flight report goes stale) feed `next_change_at`, and
`flexinfer explain` says them in its words. Pure: `now` is a parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final

from flexinfer_core.annotations import DEMAND_STALE_AFTER
from flexinfer_core.durations import format_duration
from flexinfer_core.election import Ballot, Crossing, Instant, Rule, Threshold
from flexinfer_core.snapshot import ModelState, Phase

_DRAINING, _READY = Phase.DRAINING, Phase.READY
_DRAIN_DEADLINE, _IN_FLIGHT_STALE = Threshold.DRAIN_DEADLINE, Threshold.IN_FLIGHT_STALE


def in_flight(model: ModelState, now: datetime) -> int:
    """The member's in-flight count as the decision reads it: 0 when never reported,
    undated, or older than `DEMAND_STALE_AFTER` (a dead proxy cannot hold a drain)."""
    at = model.in_flight_at
    if model.in_flight <= 0 or at is None or now - at > DEMAND_STALE_AFTER:
        return 0
    return model.in_flight


def starts_draining(model: ModelState, now: datetime) -> bool:
    """A `Ready` member losing the card drains first: requests in flight, a drain
    timeout above 0, and replicas to keep (a member already at 0 has nothing to drain)."""
    return (
        model.phase is _READY
        and model.replicas != 0
        and model.drain_timeout > timedelta(0)
        and in_flight(model, now) > 0
    )


def drain_deadline(model: ModelState) -> datetime | None:
    """When the member's drain ends at the latest (None: it is not draining, or its
    status does not say since when, which counts as a drain already over)."""
    if model.phase is not _DRAINING or model.draining_since is None:
        return None
    return model.draining_since + model.drain_timeout


def keeps_draining(model: ModelState, now: datetime) -> bool:
    """A `Draining` member still drains: requests in flight and its deadline ahead."""
    deadline = drain_deadline(model)
    return deadline is not None and now < deadline and in_flight(model, now) > 0


def drain_note(model: ModelState, now: datetime) -> str:
    """ "chat to drain (2 in flight, until 12:00:30)": what the holder waits for."""
    deadline = drain_deadline(model) or now + model.drain_timeout
    return (
        f"{model.name} to drain ({in_flight(model, now)} in flight, "
        f"until {deadline.strftime('%H:%M:%S')})"
    )


def _never_decides(ballot: Ballot) -> Callable[[], str]:
    draining = [m for m in ballot.members if m.phase is _DRAINING]
    if not draining:
        return lambda: "no member is draining"
    now = ballot.now
    return lambda: "; ".join(
        f"{m.name} drains its requests in flight before it is scaled to 0 "
        f"({in_flight(m, now)} in flight, deadline "
        f"{d.isoformat() if (d := drain_deadline(m)) is not None else 'passed'})"
        for m in draining
    )


def _drain_crossings(ballot: Ballot, after: datetime | None) -> list[Instant]:
    out: list[Instant] = []
    for m in ballot.members:
        if m.phase is not _DRAINING:
            continue
        deadline = drain_deadline(m)
        if deadline is not None and (after is None or deadline > after):
            out.append((deadline, _DRAIN_DEADLINE, m.name))
        # A report that goes stale counts as 0 from then: the drain ends then too.
        if m.in_flight > 0 and m.in_flight_at is not None:
            stale = m.in_flight_at + DEMAND_STALE_AFTER + _TICK
            if after is None or stale > after:
                out.append((stale, _IN_FLIGHT_STALE, m.name))
    return out


def _drain_says(ballot: Ballot, crossing: Crossing) -> str | None:
    model = ballot.member(crossing.subject)
    if model is None or model.phase is not _DRAINING:
        return None
    if crossing.kind is _DRAIN_DEADLINE:
        timeout = format_duration(model.drain_timeout)
        return (
            f"{crossing.subject}'s {timeout} drain timeout ends: it is scaled to 0 "
            "whatever is still in flight"
        )
    if crossing.kind is _IN_FLIGHT_STALE:
        return f"{crossing.subject}'s in-flight report goes stale and counts as 0"
    return None


_TICK = timedelta(microseconds=1)

# Not a rule of the election: how a member that loses the card leaves it
# (docs/election.md 1.6). Its crossings belong to the same timer.
DRAIN: Final = Rule(
    "drain", _never_decides, crossings=_drain_crossings, says=_drain_says, ticks_always=True
)
