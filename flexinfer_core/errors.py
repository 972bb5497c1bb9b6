"""Errors the core raises for invalid input.

Expected outcomes ("no leader: a GPU lease is held") are decision values, never
exceptions. Only input that breaks the snapshot's own rules raises, and the message
names the field and the value so a user can find the bad line of YAML.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class FlexinferError(Exception):
    """Base class of every error the core raises."""


class InvalidFieldError(FlexinferError, ValueError):
    """A snapshot field holds a value outside its documented range or form.

    `attribute` is the snapshot attribute a validator rejected (empty otherwise): an
    adapter uses it to name the same field in its user's terms (`spec.gpu.priority`
    rather than `ModelState(a).priority`); see `renamed`.
    """

    def __init__(self, field: str, value: Any, problem: str, *, attribute: str = "") -> None:
        self.field = field
        self.value = value
        self.problem = problem
        self.attribute = attribute
        super().__init__(f"{field}: {_show(value)} {problem}")

    def renamed(self, field: str, value: Any) -> InvalidFieldError:
        """The same problem, said of `field` holding `value` (as the user wrote them)."""
        return type(self)(field, value, self.problem, attribute=self.attribute)


def _show(value: Any) -> str:
    # A timedelta's repr ("days=-1, seconds=86395") hides the value a user wrote.
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    return repr(value)


class DurationError(InvalidFieldError):
    """A Go-style duration string could not be parsed."""


class InconsistentGroupError(FlexinferError, ValueError):
    """Members handed to one group decision do not form one group."""
