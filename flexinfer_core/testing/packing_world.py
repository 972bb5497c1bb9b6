"""A small pure world for VRAM co-residency (docs/election.md 1.7): a group stepped
through time with the packing applied and pods started only through `memory_gate`.

It stands in for the controller, which does not act on packing yet: each step the
members asked for are stamped, the election and `pack` decide the set, evicted
members are stamped `preemptedAt` and their pods terminate (a terminating pod lives
one more step and still counts), and an admitted member that wants replicas starts a
pod only when `memory_gate` lets it. A started pod loads for one step, then is Ready.
Used by the property suite; no I/O, time is the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

import attrs

from flexinfer_core.election import Ballot, elect, idle_past_timeout
from flexinfer_core.group import desired_replicas
from flexinfer_core.packing import Packing, group_budget, memory_gate, pack
from flexinfer_core.snapshot import ModelState, Phase, SharedState

LIVE, TERMINATING = "live", "terminating"


@attrs.frozen
class Step:
    """What one step decided and what was on the card after it."""

    at: datetime
    packing: Packing
    pods: tuple[tuple[str, str], ...]  # (member, LIVE or TERMINATING), by name
    started: tuple[str, ...]


@attrs.frozen
class PackingWorld:
    members: tuple[ModelState, ...]
    pods: tuple[tuple[str, str], ...] = ()

    def footprint_on_card(self) -> int | None:
        """The sum of the footprints of every member with a pod (None: one is unknown)."""
        by_name = {m.name: m for m in self.members}
        sizes = [by_name[name].vram_estimate for name, _ in self.pods]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)

    def step(self, *, now: datetime, asked: Iterable[str] = ()) -> tuple[PackingWorld, Step]:
        wanted = set(asked)
        members = [
            attrs.evolve(m, last_active=now) if m.name in wanted else m for m in self.members
        ]
        # Pods that were terminating are gone now.
        pods = {name: state for name, state in self.pods if state == LIVE}
        ballot = Ballot.of(members, now=now)
        election = elect(ballot)
        packing = pack(ballot, election)
        holders = set(packing.holders)
        by_name = {m.name: m for m in members}
        out: dict[str, ModelState] = {}
        for m in ballot.members:
            phase = m.phase
            if m.name in holders:
                state: SharedState | None = SharedState.ACTIVE
                want = desired_replicas(m, now=now)
            else:
                state = SharedState.QUEUED if m.shared_state is not None else None
                want = 0
            preempted_at = m.preempted_at
            # Losing the card while serving is a preemption (docs/election.md 1.3),
            # unless the member leaves its seat because it idled out.
            if m.name in packing.evicted or (
                m.name not in holders and phase is Phase.READY and not idle_past_timeout(m, now)
            ):
                phase, preempted_at = Phase.PREEMPTED, now
            if want == 0 and pods.get(m.name) == LIVE:
                pods[m.name] = TERMINATING
            if m.name not in pods and phase in (Phase.READY, Phase.LOADING, Phase.PENDING):
                phase = Phase.IDLE
            out[m.name] = attrs.evolve(
                m,
                shared_state=state,
                phase=phase,
                preempted_at=preempted_at,
                replicas=want,
            )
        started = []
        for name in packing.holders:
            m = out[name]
            if m.replicas and name not in pods:
                ok, _ = memory_gate(
                    name,
                    members=members,
                    running=pods.keys(),
                    budget=group_budget(members).size,
                )
                if ok:
                    pods[name] = LIVE
                    started.append(name)
                    out[name] = attrs.evolve(m, phase=Phase.LOADING)
            elif pods.get(name) == LIVE and m.phase is Phase.LOADING:
                out[name] = attrs.evolve(m, phase=Phase.READY, preempted_at=None)
            elif pods.get(name) == LIVE and m.phase is not Phase.READY:
                out[name] = attrs.evolve(m, phase=Phase.LOADING)
        world = PackingWorld(
            tuple(out[m.name] for m in self.members if m.name in by_name),
            tuple(sorted(pods.items())),
        )
        return world, Step(now, packing, world.pods, tuple(started))


def run(
    members: Sequence[ModelState], arrivals: Sequence[tuple[datetime, Iterable[str]]]
) -> list[Step]:
    """Step the world at each arrival instant (the names asked for then)."""
    world = PackingWorld(tuple(members))
    steps = []
    for at, asked in arrivals:
        world, step = world.step(now=at, asked=asked)
        steps.append(step)
    return steps
