"""A member whose spec cannot be read: what it is told, and when to say it again.

A stored value no decision can use (a duration beyond Go's range, replicas beyond
int32, a window past ten years: an `InvalidFieldError` naming the field and the
value) must not take its whole group down, nor loop. The adapters leave such a member
out of its group's decision (its pods still count as holding the card, and it is held
at zero replicas; a GPUGroup whose own spec cannot be read decides nothing and leaves
its members as they are) and write what this module says: `Ready=False` with reason
`InvalidSpec` and the error as message (a Model's `Active` condition too), and one
Warning Event, only when that condition is not already what the object records. No
I/O: the adapters pass the conditions the object holds.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from flexinfer_core import reasons
from flexinfer_core.errors import InvalidFieldError
from flexinfer_core.group import Event
from flexinfer_core.snapshot import Condition


class Scope(enum.StrEnum):
    """What an unreadable spec stops, as the message says it."""

    MEMBER = "it is left out of its group and runs nothing"
    ALONE = "it runs nothing"
    GROUP = "the group decides nothing and its members keep their replicas"


@attrs.frozen
class SpecProblem:
    """What a member whose spec cannot be read is told."""

    name: str
    field: str
    message: str
    conditions: tuple[Condition, ...]
    # Set when the object does not already record this problem: it is news.
    event: Event | None

    @property
    def reason(self) -> str:
        return reasons.INVALID_SPEC


def spec_problem(
    name: str,
    error: InvalidFieldError,
    *,
    recorded: Iterable[Condition],
    condition_types: tuple[str, ...] = ("Ready",),
    scope: Scope = Scope.MEMBER,
) -> SpecProblem:
    """The conditions (`condition_types`, all False with reason `InvalidSpec`) and the
    Event for `name`, whose spec raised `error`; `recorded` are the conditions the
    object holds now (the Event is for a change only); `scope` says what stops."""
    message = f"{error}; {scope.value} until that is fixed"
    conditions = tuple(
        Condition(kind, False, reasons.INVALID_SPEC, message) for kind in condition_types
    )
    said = {c.type: c for c in recorded}
    news = said.get(condition_types[0]) != conditions[0]
    return SpecProblem(
        name=name,
        field=error.field,
        message=message,
        conditions=conditions,
        event=Event(name, reasons.INVALID_SPEC, message, type="Warning") if news else None,
    )


def reports_spec_problem(recorded: Iterable[Condition], *, condition_type: str = "Ready") -> bool:
    """Whether the object's conditions still say its spec could not be read (so that a
    spec that reads again is noticed once)."""
    return any(
        c.type == condition_type and not c.status and c.reason == reasons.INVALID_SPEC
        for c in recorded
    )
