"""Measured swap times, and the wait estimates a held request is given from them.

A *swap time* is what the proxy itself saw: from the moment a request first had to
wait for a model that was not Ready until that model was Ready and the first
waiting request was let go (docs/proxy.md, "Queue position and wait estimate").
`SwapTimes` keeps the last `samples` of them per model (and node, when the caller
knows it; a model's observations on any node stand in for a node not seen yet)
and estimates the next one as a nearest-rank percentile of them (the smallest
observation with at least that fraction of them at or below it): the median
(`TYPICAL`) for what a waiting client is told, the 90th percentile (`CAUTIOUS`) for
when a refused one should come back. Before a model has any, both are the `prior`
(`--swap-time-prior`).

Why the median for the told wait, not the 90th percentile: the 90th percentile errs
long on every swap by the spread of the last N, which grows with the node's load and
is, for short swaps, most of a ±20 % allowance; the median errs by about half of it
either way (docs/proxy.md, "Queue position and wait estimate"). A client retrying
too early is refused again, so `Retry-After` keeps erring long.

The remaining wait of a swap in progress is the estimate less the time it has run,
never below `MIN_REMAINING_SECONDS`: a swap that overran its estimate is still
expected to end, soon, not to have ended.

This module computes; it reads no clock (callers pass `now`), touches no queue and
no HTTP, and keeps a bounded amount of state (`samples` per key, `RECENT_KEPT`
recent observations for the live page).
"""

from __future__ import annotations

import math
from collections import deque
from datetime import datetime

import attrs

DEFAULT_PRIOR_SECONDS = 30.0
DEFAULT_SAMPLES = 20
# Flag bounds (`--swap-time-prior`, `--swap-time-samples`): a prior longer than an
# hour or a memory longer than a thousand swaps describes no card we serve.
MAX_PRIOR_SECONDS = 3600.0
MAX_SAMPLES = 1000
# A swap that ran past its estimate is said to need at least this much more.
MIN_REMAINING_SECONDS = 1.0
# Recent observations kept across every model, newest last (for the live page).
RECENT_KEPT = 100
TYPICAL = 0.5  # the wait a held request is told (its headers, comments, the live page)
CAUTIOUS = 0.9  # the wait behind `Retry-After`: a client back too early is refused again


def nearest_rank(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of non-empty `values` (`fraction` in (0, 1])."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


@attrs.frozen
class SwapObservation:
    """One measured swap: the model's `namespace/name`, its node when known."""

    model: str
    node: str | None
    seconds: float
    ended_at: datetime


class SwapTimes:
    """The last `samples` swap times per (model, node) and per model."""

    def __init__(
        self, *, prior: float = DEFAULT_PRIOR_SECONDS, samples: int = DEFAULT_SAMPLES
    ) -> None:
        if not 0 < prior <= MAX_PRIOR_SECONDS:
            raise ValueError(f"swap time prior must be in (0, {MAX_PRIOR_SECONDS:g}]s, got {prior}")
        if not 1 <= samples <= MAX_SAMPLES:
            raise ValueError(f"swap time samples must be in [1, {MAX_SAMPLES}], got {samples}")
        self.prior = prior
        self.samples = samples
        self._by_key: dict[tuple[str, str | None], deque[float]] = {}
        self._recent: deque[SwapObservation] = deque(maxlen=RECENT_KEPT)

    def observe(
        self, model: str, seconds: float, *, ended_at: datetime, node: str | None = None
    ) -> None:
        """Record one swap of `model` (on `node`, when known) that took `seconds`."""
        seconds = max(0.0, seconds)
        keys = [(model, None)] if node is None else [(model, node), (model, None)]
        for key in keys:
            kept = self._by_key.get(key)
            if kept is None:
                kept = self._by_key[key] = deque(maxlen=self.samples)
            kept.append(seconds)
        self._recent.append(SwapObservation(model, node, seconds, ended_at))

    def observed(self, model: str, *, node: str | None = None) -> int:
        """How many swaps of `model` (on `node`) the estimate is made from (at most N)."""
        return len(self._by_key.get((model, node), ()))

    def estimate(
        self, model: str, *, node: str | None = None, percentile: float = TYPICAL
    ) -> float:
        """Seconds the next swap of `model` is expected to take: the `percentile` of the
        last N swaps on `node`, else on any node, else the prior."""
        kept = self._by_key.get((model, node)) or self._by_key.get((model, None))
        if not kept:
            return self.prior
        return nearest_rank(list(kept), percentile)

    def remaining(
        self,
        model: str,
        *,
        started: datetime,
        now: datetime,
        node: str | None = None,
        percentile: float = TYPICAL,
    ) -> float:
        """Seconds still expected of a swap of `model` that started at `started`."""
        elapsed = (now - started).total_seconds()
        expected = self.estimate(model, node=node, percentile=percentile)
        return max(MIN_REMAINING_SECONDS, expected - elapsed)

    def recent(self) -> tuple[SwapObservation, ...]:
        """The last `RECENT_KEPT` swaps over every model, oldest first (read-only view)."""
        return tuple(self._recent)
