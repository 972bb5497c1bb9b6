"""A group decision's writes, and the one order they go out in.

Both group reconcilers (a shared group of Models, a GPUGroup) translate their
decision into a `WritePlan`; `apply_plan` writes it in the safe order:

1. statuses, each conditional on the resourceVersion it was decided on (a status
   records a preemption, so it comes before the scale-down that makes the phase
   unreadable);
2. scale-downs through `deployments/scale`, then the Events of the statuses written
   (once their status is written, so a retry never repeats them; after the
   scale-downs, which are what frees the card);
3. scale-ups, only after a *live* Pod list (not the cache), selected by the group
   label every rendered pod carries, shows no pod of another member that the
   decision did not account for (`Interlock`): break-before-make must not rest on a
   watch that is a few milliseconds behind, nor on a memory a restart would lose;
4. the trailing statuses (a GPUGroup's members' observed status).

A status write that fails never holds back the scale-downs that park members: a
refused one (422) is counted, logged once per object and message, and its Events
recorded then (no status will hold them); a conflict (`RetryNow`) means the decision
was made on a stale object, so the Events of the statuses written so far are recorded
and the key decides again at once, unless its last attempts all conflicted
(`insist`), in which case the scale-downs go out first. Scale-ups always wait for a
decision whose statuses were written (or refused).

This module writes; it decides nothing: what to write is the reconcilers' translation
of the core's decision.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any

import attrs

from flexinfer_core import Event, SpecProblem
from flexinfer_core.packing import format_gib
from flexinfer_k8s.apply import RetryNow
from flexinfer_k8s.cache import live_occupants
from flexinfer_k8s.outcome import Applied, Refusals, Wiring, record_events
from flexinfer_k8s.status_diff import status_differs
from flexinfer_kube.kubeapi import JSON, Rejected
from flexinfer_kube.objects import name_of, namespace_of
from flexinfer_kube.resources import Resource

log = logging.getLogger("flexinfer.apply")


@attrs.frozen
class StatusWrite:
    """A status merge patch for `obj`, with the Events to record once it is written
    (each on its involved object; None: gone, counted but not written), and, for an
    object whose spec cannot be read, the problem to log when that is news."""

    resource: Resource
    obj: JSON
    status: JSON
    events: tuple[tuple[Mapping[str, Any] | None, Event], ...] = ()
    problem: SpecProblem | None = None


@attrs.frozen
class Scale:
    """A member's Deployment (named like it) from `replicas_from` to `replicas_to`."""

    name: str
    replicas_from: int
    replicas_to: int

    @property
    def down(self) -> bool:
        return self.replicas_to < self.replicas_from

    @property
    def up(self) -> bool:
        return self.replicas_to > self.replicas_from


@attrs.frozen
class Interlock:
    """What a scale-up must see first in a live Pod list of the group (`group` "": a
    Model alone, nothing to check): no pod of a member other than the one scaled up,
    except the members in `accounted` (pods the decision saw and chose to start
    beside: a GPUGroup with `Immediate` preemption, or past its drain timeout).

    With a `budget` (a shared group whose members' pods share one card, docs/election.md
    1.7, "Break-before-make by memory"), other members' pods may be live beside it as
    long as the footprints of every member with live pods (terminating ones included)
    plus its own fit the budget; a member missing from `footprints` (unknown, or its
    pods cannot share the card, or no member any more) takes the whole card."""

    group: str
    kind: str
    accounted: frozenset[str] = frozenset()
    budget: int | None = None
    footprints: tuple[tuple[str, int], ...] = ()

    def waits_for(self, name: str, occupied: AbstractSet[str]) -> str:
        """Why `name` may not scale up while the members `occupied` have live pods (a
        sentence), or "" when it may."""
        others = sorted(occupied - self.accounted - {name})
        if not others:
            return ""
        sizes = dict(self.footprints)
        own = sizes.get(name)
        unknown = [other for other in others if other not in sizes]
        if self.budget is None or own is None or unknown:
            whose = ", ".join(unknown if own is not None and self.budget is not None else others)
            return f"other members still have pods: {whose}"
        held = sum(sizes[other] for other in others)
        if held + own <= self.budget:
            return ""
        return (
            f"waits for {format_gib(own)} GiB: {format_gib(held)} of "
            f"{format_gib(self.budget)} GiB held by the pods of {', '.join(others)}"
        )


@attrs.frozen
class WritePlan:
    """Everything one decision writes. `group` and `kind` (`shared`, `gpugroup`) label
    the Events' counters and the logs."""

    namespace: str
    group: str
    kind: str
    interlock: Interlock
    statuses: tuple[StatusWrite, ...] = ()
    scales: tuple[Scale, ...] = ()
    trailing: tuple[StatusWrite, ...] = ()


class Written(enum.Enum):
    """How one status write went."""

    WROTE = "wrote"
    GONE = "gone"  # the object no longer exists
    REFUSED = "refused"  # 422, said before
    REFUSED_NEWS = "refused-news"  # 422, said now: record what it would have held

    @property
    def news(self) -> bool:
        """Its Events and problem are to be said now."""
        return self in (Written.WROTE, Written.REFUSED_NEWS)


def write_status(wiring: Wiring, refusals: Refusals, write: StatusWrite) -> Written:
    """Patch one status (conditional on the observed resourceVersion); a conflict raises
    `RetryNow` (the object has been re-read)."""
    try:
        written = wiring.writer.patch_status(write.resource, write.obj, write.status)
    except Rejected as error:
        if refusals.refused(write.resource, write.obj, error=error):
            return Written.REFUSED_NEWS
        return Written.REFUSED
    if written is None:
        return Written.GONE
    refusals.accepted(write.resource, write.obj)
    return Written.WROTE


def say_problem(write: StatusWrite) -> None:
    """One log line for an object whose spec cannot be read, when that is news."""
    problem = write.problem
    if problem is None or problem.event is None:
        return
    log.warning(
        "spec cannot be read; it runs nothing until it is fixed",
        extra={
            "fields": {
                "kind": write.resource.kind,
                "namespace": namespace_of(write.obj),
                "name": name_of(write.obj),
                "field": problem.field,
                "message": problem.message,
            }
        },
    )


def apply_plan(
    wiring: Wiring, refusals: Refusals, plan: WritePlan, *, now: datetime, insist: bool
) -> Applied:
    """Write `plan` in the order the module docstring gives; raises `RetryNow` when a
    status conflicted (after the scale-downs when `insist`)."""
    applied = Applied.NOTHING
    events: list[tuple[Mapping[str, Any] | None, Event]] = []
    stale: RetryNow | None = None

    def record() -> None:
        record_events(
            wiring, events, namespace=plan.namespace, group=plan.group, kind=plan.kind, now=now
        )
        events.clear()

    # 1. statuses.
    for write in plan.statuses:
        try:
            written = write_status(wiring, refusals, write)
        except RetryNow as conflict:
            stale = conflict
            break
        if written is Written.WROTE:
            applied = Applied.WROTE
        if written.news:
            events.extend(write.events)
            say_problem(write)
    if stale is not None and not insist:
        record()  # the statuses written so far keep their Events
        raise stale

    # 2. scale-downs, then the Events.
    for scale in plan.scales:
        if scale.down and wiring.writer.scale(plan.namespace, scale.name, scale.replicas_to):
            applied = Applied.WROTE
    record()
    if stale is not None:
        raise stale  # the rest waits for a decision on a fresh view

    # 3. scale-ups, after the live check.
    ups = [scale for scale in plan.scales if scale.up]
    lock = plan.interlock
    occupied = (
        live_occupants(wiring.api, plan.namespace, group=lock.group, kind=lock.kind)
        if ups and lock.group
        else set()
    )
    for scale in ups:
        why = lock.waits_for(scale.name, occupied)
        if why:
            log.info(
                "scale-up deferred: other members still have pods",
                extra={
                    "fields": {
                        "namespace": plan.namespace,
                        "group": plan.group,
                        "kind": plan.kind,
                        "model": scale.name,
                        "occupied": sorted(occupied - lock.accounted - {scale.name}),
                        "why": why,
                    }
                },
            )
            applied = Applied.DEFERRED
            break
        if wiring.writer.scale(plan.namespace, scale.name, scale.replicas_to):
            applied = Applied.WROTE
        if lock.budget is not None:
            occupied = occupied | {scale.name}  # its pods come: the next one counts them

    # 4. trailing statuses.
    for write in plan.trailing:
        written = write_status(wiring, refusals, write)
        if written is Written.WROTE and applied is Applied.NOTHING:
            applied = Applied.WROTE
        if written.news:
            say_problem(write)
            record_events(
                wiring,
                write.events,
                namespace=plan.namespace,
                group=plan.group,
                kind=plan.kind,
                now=now,
            )
    return applied


def write_spec_problem(
    wiring: Wiring,
    refusals: Refusals,
    *,
    resource: Resource,
    obj: Mapping[str, Any],
    problem: SpecProblem,
    status: JSON,
    now: datetime,
) -> bool:
    """Write the status of an object whose spec cannot be read (flexinfer_core.invalid)
    on its own, and say it once: the Warning Event and one log line go with the status
    write that records it, or with that write's first refusal (an object whose stored
    spec the real CRD no longer accepts refuses every status write). True when it
    wrote."""
    if not status_differs(obj.get("status"), status):
        return False
    write = StatusWrite(
        resource,
        dict(obj),
        status,
        events=((obj, problem.event),) if problem.event is not None else (),
        problem=problem,
    )
    written = write_status(wiring, refusals, write)
    if written.news:
        say_problem(write)
        record_events(wiring, write.events, namespace=namespace_of(obj), group="", kind="", now=now)
    return written is Written.WROTE
