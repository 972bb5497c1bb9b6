"""How the command prints: kubectl's tables, ages and `-o json|yaml|wide`, and its exit codes.

Tables are left-aligned columns with upper-case headers, three spaces apart, as
`kubectl get` prints them; ages use kubectl's own rounding (`HumanDuration`). Every
command builds plain data (dicts and lists) once; this module turns it into a table
or into JSON/YAML, so `-o json` carries exactly what the table shows and more.
Exit codes follow kubectl: 0 fine, 1 a failed check or an unreachable cluster, 2
bad usage (a wrong flag, a bad manifest).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, TextIO

import yaml

from flexinfer_core.timestamps import format_rfc3339

OK: Final = 0
FAILED: Final = 1
USAGE: Final = 2

FORMATS: Final = ("table", "wide", "json", "yaml")


class CommandError(Exception):
    """A command cannot do what it was asked; `code` is the exit code to return."""

    def __init__(self, message: str, *, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code


class UsageError(CommandError):
    """Bad usage (flags, arguments, manifests): exit 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=USAGE)


def human_duration(value: timedelta) -> str:
    """kubectl's `HumanDuration`: `45s`, `5m30s`, `2h5m`, `3d4h`, `2y10d`."""
    seconds = int(value.total_seconds())
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        rest = seconds % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24
        rest = days % 365
        return f"{days // 365}y" if rest == 0 else f"{days // 365}y{rest}d"
    return f"{hours // 24 // 365}y"


def age(since: datetime | None, *, now: datetime) -> str:
    """How long ago, as kubectl prints an AGE column (`<none>` when unknown)."""
    return "<none>" if since is None else human_duration(now - since)


def until(at: datetime | None, *, now: datetime) -> str:
    """How long from now until `at` (`in 4m30s`), or how long ago it passed."""
    if at is None:
        return "<none>"
    if at >= now:
        return f"in {human_duration(at - now)}"
    return f"{human_duration(now - at)} ago"


def timestamp(at: datetime | None) -> str | None:
    """RFC 3339 to the second, as the API server writes times (None stays None)."""
    return None if at is None else format_rfc3339(at.replace(microsecond=0))


def clock(at: datetime) -> str:
    """An instant people read: `12:04:31 UTC` (today) or `2026-12-01 12:04:31 UTC`."""
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns as `kubectl get` aligns them; an empty cell prints `<none>`."""
    cells = [[str(h).upper() for h in headers]] + [
        ["<none>" if c is None or c == "" else str(c) for c in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("   ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def emit(data: Any, *, fmt: str, table: str, stream: TextIO | None = None) -> None:
    """Print `data` as JSON or YAML, or print the already-rendered `table`."""
    out = stream or sys.stdout
    if fmt == "json":
        out.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    elif fmt == "yaml":
        out.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    else:
        out.write(table + ("\n" if table and not table.endswith("\n") else ""))


def no_resources(namespace: str | None, what: str) -> str:
    """kubectl's wording for an empty listing."""
    where = "any namespace" if namespace is None else f"{namespace} namespace"
    return f"No {what} found in {where}."


def indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def mapping_or_empty(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
