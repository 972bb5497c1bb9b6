"""Shared builders for the core's table tests: a fixed epoch and terse members."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer_core import ModelState

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def ago(seconds: float = 0, *, minutes: float = 0) -> datetime:
    return T0 - timedelta(seconds=seconds, minutes=minutes)


def member(name: str, **fields: Any) -> ModelState:
    fields.setdefault("group", "homelab-gpu")
    return ModelState(name=name, **fields)
