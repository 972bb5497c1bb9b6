"""`flexinfer simulate SCENARIO --plot FILE.png`: the simulated timeline as a picture.

One row per model: who held the card (a wide bar), when its pods served (a thin
bar inside), each request (a tick) and how long it waited for a serving pod (a line
from the tick, ending in a cross where its client gave up after its last 503), GPU
lease spans shaded across every row, and each swap annotated with the reason the
election gave. Drawn with matplotlib's Agg canvas (no display,
no pyplot state), from the core's `Timeline` only. matplotlib and tqdm come with
the `plot` extra; without them the command says what to install. A progress bar
(tqdm, on stderr) follows the drawing of long traces.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import attrs

from flexinfer_cli.output import UsageError
from flexinfer_cli.scenario import Scenario
from flexinfer_core.simulate import Step, Timeline

# Draw a progress bar when there are at least this many steps and requests.
LONG_TRACE = 2000
_T = TypeVar("_T")


@attrs.frozen
class Span:
    model: str
    start: float  # minutes since the start
    end: float


@attrs.frozen
class Wait:
    model: str
    arrived: float
    served: float | None  # None: never served before the end
    gave_up: float | None = None  # its last 503, after which its client stopped asking


@attrs.frozen
class Swap:
    at: float
    leader: str | None
    reason: str


@attrs.frozen
class Picture:
    """Everything the plot shows, in minutes since the scenario's start."""

    models: tuple[str, ...]
    holds: tuple[Span, ...]
    serving: tuple[Span, ...]
    waits: tuple[Wait, ...]
    leases: tuple[tuple[str, float, float], ...]
    swaps: tuple[Swap, ...]
    end: float


def plot_timeline(
    scenario: Scenario, timeline: Timeline, path: Path, *, progress: str = "auto"
) -> None:
    """Draw the simulated `timeline` of `scenario` into `path` (PNG)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ModuleNotFoundError as error:
        raise UsageError(
            f"--plot needs matplotlib ({error.name} is missing): pip install 'flexinfer[plot]'"
        ) from None
    picture = build_picture(scenario, timeline, progress=progress)
    figure = Figure(figsize=(12, 1.6 + 0.9 * len(picture.models)), dpi=100)
    FigureCanvasAgg(figure)
    draw(figure, picture, scenario=scenario)
    try:
        figure.savefig(path, format="png")
    except OSError as error:
        raise UsageError(f"--plot: cannot write {path}: {error}") from None


def _minutes(at: datetime, start: datetime) -> float:
    return (at - start).total_seconds() / 60


def _progress(items: Sequence[_T], *, mode: str, total: int, what: str) -> Iterator[_T]:
    show = mode == "always" or (mode == "auto" and total >= LONG_TRACE and sys.stderr.isatty())
    if not show:
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=what, unit="item", file=sys.stderr, leave=False)


def build_picture(scenario: Scenario, timeline: Timeline, *, progress: str = "auto") -> Picture:
    start = scenario.start
    end = _minutes(scenario.until, start)
    models = tuple(m.name for m in scenario.models)
    steps = timeline.steps
    total = len(steps) + len(scenario.requests)
    times = [_minutes(s.at, start) for s in steps]
    holds, serving, swaps = _spans(steps, times, models, end=end, progress=progress, total=total)
    waits = tuple(
        Wait(
            outcome.request.model,
            _minutes(outcome.request.at, start),
            None if outcome.served_at is None else _minutes(outcome.served_at, start),
            _minutes(outcome.refusals[-1], start) if outcome.gave_up else None,
        )
        for outcome in _progress(timeline.requests, mode=progress, total=total, what="requests")
    )
    leases = tuple(
        (
            window.lease.name,
            _minutes(window.start, start),
            min(
                end,
                *(
                    _minutes(t, start)
                    for t in (window.end, window.lease.expires_at)
                    if t is not None
                ),
            ),
        )
        for window in scenario.leases
    )
    return Picture(models, holds, serving, waits, leases, swaps, end)


def _spans(
    steps: Sequence[Step],
    times: Sequence[float],
    models: Sequence[str],
    *,
    end: float,
    progress: str,
    total: int,
) -> tuple[tuple[Span, ...], tuple[Span, ...], tuple[Swap, ...]]:
    holds: list[Span] = []
    serving: list[Span] = []
    swaps: list[Swap] = []
    leader: str | None = None
    # Every member that holds the card, since when (more than one in a packed group,
    # docs/election.md 1.7): each gets its own wide bar.
    holding: dict[str, float] = {}
    ready_since: dict[str, float | None] = dict.fromkeys(models)
    indexed = list(zip(steps, times, strict=True))
    for step, at in _progress(indexed, mode=progress, total=total, what="steps"):
        if step.leader != leader:
            if step.leader is not None or leader is not None:
                swaps.append(Swap(at, step.leader, step.reason))
            leader = step.leader
        now_holding = set(step.holders) or ({step.leader} if step.leader is not None else set())
        for name in sorted(set(holding) - now_holding):
            holds.append(Span(name, holding.pop(name), at))
        for name in sorted(now_holding - set(holding)):
            holding[name] = at
        for name, _, ready in step.pods:
            since = ready_since.get(name)
            if ready and since is None:
                ready_since[name] = at
            elif not ready and since is not None:
                serving.append(Span(name, since, at))
                ready_since[name] = None
    holds += [Span(name, since, end) for name, since in sorted(holding.items())]
    serving += [Span(n, s, end) for n, s in ready_since.items() if s is not None]
    return tuple(holds), tuple(serving), tuple(swaps)


def draw(figure: Any, picture: Picture, *, scenario: Scenario) -> None:
    axes = figure.add_subplot(1, 1, 1)
    rows = {name: i for i, name in enumerate(picture.models)}
    colors = [f"C{i % 10}" for i in range(len(picture.models))]
    for name, start, stop in picture.leases:
        axes.axvspan(start, stop, facecolor="0.93", edgecolor="0.6", hatch="//", lw=0, zorder=0)
        axes.text(start, len(rows) - 0.45, f"lease {name}", fontsize=8, va="bottom")
    for span in picture.holds:
        row = rows[span.model]
        axes.broken_barh(
            [(span.start, span.end - span.start)], (row - 0.35, 0.7), color=colors[row], alpha=0.35
        )
    for span in picture.serving:
        row = rows[span.model]
        axes.broken_barh(
            [(span.start, span.end - span.start)], (row - 0.12, 0.24), color=colors[row]
        )
    for wait in picture.waits:
        row = rows[wait.model]
        axes.plot([wait.arrived], [row + 0.42], marker="v", color="black", markersize=5)
        until = wait.served if wait.served is not None else wait.gave_up
        if until is None:
            until = picture.end
        if until > wait.arrived:
            axes.plot([wait.arrived, until], [row + 0.42, row + 0.42], color="red", linewidth=1)
        if wait.gave_up is not None:
            axes.plot([until], [row + 0.42], marker="x", color="red", markersize=5)
    for number, swap in enumerate(picture.swaps):
        axes.axvline(swap.at, color="0.4", linewidth=0.6, linestyle=":")
        axes.annotate(
            f"{swap.leader or 'nobody'}: {swap.reason}",
            xy=(swap.at, -0.6 - 0.25 * (number % 3)),
            fontsize=7,
            rotation=0,
            annotation_clip=False,
        )
    axes.set_yticks(list(rows.values()), list(rows))
    axes.set_ylim(-1.5, len(rows) - 0.2)
    axes.set_xlim(0, picture.end)
    axes.set_xlabel("minutes since start")
    axes.set_title(
        f"{scenario_title(scenario)}: holders (wide bars), serving (thin bar), requests (▼) and "
        "waits (red), leases (hatched), swaps (dotted, with the reason)",
        fontsize=9,
    )
    figure.tight_layout()


def scenario_title(scenario: Scenario) -> str:
    group = scenario.models[0].group if scenario.models else ""
    return f"group {group}" if group else "scenario"
