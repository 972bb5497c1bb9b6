"""`flexinfer` (also `kubectl flexinfer`): one command for people.

    flexinfer explain KIND/NAME        who holds the card, why, and what happens next
    flexinfer status [-w]              per group: holder, queue, cooldown, lease
    flexinfer leases | lease acquire|release GROUP
                                       GPU leases: list them, park a group by hand
    flexinfer cache status             ModelCaches: strategy, path, ready, source
    flexinfer doctor                   the troubleshooting cases as checks, with fixes
    flexinfer nodes label [--apply]    GPU nodes' flexinfer.ai/gpu.vendor from their capacity
    flexinfer bench --url URL --model NAME
                                       tokens/s (and time to first token) of a model
    flexinfer simulate SCENARIO.yaml   play a shared group's decisions over time
    flexinfer demo                     a local control plane, the controller, two models
    flexinfer dev cluster up|down|env  a local control plane to point kubectl at
    flexinfer controller ...           the controller (same as python -m flexinfer_k8s)
    flexinfer proxy ...                the proxy (same as python -m flexinfer_proxy)

Each subcommand parses its arguments and calls into the packages; nothing here
decides anything. Exit codes as kubectl: 0 fine, 1 a failed check or an unreachable
cluster, 2 bad usage.
"""

from __future__ import annotations

# Before anything of the extra is imported: without it, say what to install.
from flexinfer_kube.extras import require_extra

require_extra("cli", what="the flexinfer command")

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flexinfer_cli.output import FAILED, USAGE, CommandError
from flexinfer_core import FlexinferError
from flexinfer_core.simulate import Timeline
from flexinfer_kube.kubeapi import KubeError


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # Subcommands that own their whole argument list are handed it untouched.
    if args[:2] == ["dev", "cluster"]:
        devcluster = _dev_module("flexinfer_devcluster.devcluster", "dev cluster")
        return 2 if devcluster is None else int(devcluster.main(args[2:]))
    if args[:1] == ["controller"]:
        from flexinfer_k8s.__main__ import main as controller_main

        return controller_main(args[1:])
    if args[:1] == ["proxy"]:
        from flexinfer_proxy.__main__ import main as proxy_main

        return proxy_main(args[1:])
    parser = build_parser(prog_name())
    parsed = parser.parse_args(args)
    try:
        if getattr(parsed, "run", None) is not None:
            return int(parsed.run(parsed))
        if parsed.command == "simulate":
            return run_simulate(
                parsed.scenario, as_json=parsed.json, plot=parsed.plot, progress=parsed.progress
            )
        if parsed.command == "demo":
            demo = _dev_module("flexinfer_cli.demo", "demo")
            return 2 if demo is None else int(demo.run_demo(keep=parsed.keep))
    except CommandError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return err.code
    except FlexinferError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return USAGE
    except KubeError as err:
        print(f"{parser.prog}: the cluster refused: {err}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        return 130
    parser.print_help()
    return USAGE


def prog_name() -> str:
    """`kubectl flexinfer` when run as the kubectl plugin, else `flexinfer`."""
    invoked = Path(sys.argv[0]).name
    return "kubectl flexinfer" if invoked.startswith("kubectl-flexinfer") else "flexinfer"


def build_parser(prog: str = "flexinfer") -> argparse.ArgumentParser:
    from flexinfer_cli import bench, caches, doctor, explain, leases, nodes, status

    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        epilog="Exit codes: 0 fine, 1 a failed check or an unreachable cluster, 2 bad usage.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    explain.add_parser(sub)
    status.add_parser(sub)
    leases.add_parsers(sub)
    caches.add_parser(sub)
    doctor.add_parser(sub)
    nodes.add_parser(sub)
    bench.add_parser(sub)
    sim = sub.add_parser("simulate", help="play a scenario through the election core")
    sim.add_argument("scenario", type=Path)
    sim.add_argument("--json", action="store_true", help="print the timeline as JSON")
    sim.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="draw the timeline (holder, requests, waits, leases, swaps) into a PNG; "
        "needs the `plot` extra: pip install 'flexinfer[plot]'",
    )
    sim.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar while plotting (auto: on a terminal, for traces of 2000 or more "
        "steps and requests)",
    )
    demo = sub.add_parser("demo", help="local control plane + controller + two models")
    demo.add_argument("--keep", action="store_true", help="leave the cluster running")
    sub.add_parser("dev", help="`flexinfer dev cluster up|down|env`: a local control plane")
    sub.add_parser("controller", help="run the controller (`flexinfer controller --help`)")
    sub.add_parser("proxy", help="run the OpenAI-compatible proxy (`flexinfer proxy --help`)")
    return parser


DEV_PACKAGES = ("flexinfer_devcluster", "cryptography")


def _dev_module(module: str, verb: str) -> Any:
    """Import a dev verb's module, or tell the user what to install (and return None).

    The dev control plane is not part of the wheel or the image: it comes with a
    source checkout and the `dev` extra.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in DEV_PACKAGES:
            raise
        print(
            f"flexinfer {verb}: the local control plane is not installed ({error.name} is "
            "missing). It comes with a source checkout and the `dev` extra: "
            "git clone the repository, then `pip install -e '.[dev]'` (or `make demo`).",
            file=sys.stderr,
        )
        return None


def run_simulate(
    path: Path, *, as_json: bool, plot: Path | None = None, progress: str = "auto"
) -> int:
    from flexinfer_cli.scenario import load_scenario

    if not path.is_file():
        print(f"flexinfer: scenario file {str(path)!r} does not exist", file=sys.stderr)
        return 2
    scenario = load_scenario(path)
    timeline = scenario.simulate()
    if plot is not None:
        from flexinfer_cli.plot import plot_timeline

        plot_timeline(scenario, timeline, plot, progress=progress)
    if as_json:
        print(json.dumps(timeline_json(timeline, scenario.start), indent=2))
    else:
        print(render_timeline(timeline, scenario.start))
    return 0


def _offset(at: object, start: object) -> str:
    from datetime import datetime, timedelta

    from flexinfer_core import format_duration

    assert isinstance(at, datetime) and isinstance(start, datetime)
    # Thresholds lapse one microsecond after a boundary; people read whole seconds.
    return format_duration(timedelta(seconds=round((at - start).total_seconds())))


def timeline_json(timeline: Timeline, start: object) -> dict[str, object]:
    return {
        "swaps": timeline.swaps,
        "max_members_with_pods": timeline.max_members_with_pods,
        "steps": [
            {
                "at": _offset(step.at, start),
                "leader": step.leader,
                "holders": list(step.holders),
                "reason": step.reason,
                "message": step.message,
                "events": [
                    {"model": e.model, "reason": e.reason, "message": e.message}
                    for e in step.events
                ],
                "pods": {name: {"pods": n, "ready": r} for name, n, r in step.pods},
            }
            for step in timeline.steps
        ],
        "requests": [
            {
                "at": _offset(outcome.request.at, start),
                "model": outcome.request.model,
                "served": None if outcome.served_at is None else _offset(outcome.served_at, start),
                "refused": [_offset(at, start) for at in outcome.refusals],
                "gaveUp": outcome.gave_up,
            }
            for outcome in timeline.requests
        ],
    }


def render_timeline(timeline: Timeline, start: object) -> str:
    lines = [f"{'AT':>8}  {'LEADER':<14} {'REASON':<17} PODS (ready/total)  WHY"]
    for step in timeline.steps:
        pods = " ".join(f"{name}={r}/{n}" for name, n, r in step.pods if n)
        lines.append(
            f"{_offset(step.at, start):>8}  {step.leader or '-':<14} {step.reason:<17} "
            f"{pods or '-':<19} {step.message}"
        )
        if len(step.holders) > 1:
            lines.append(f"{'':>8}  holders: {', '.join(step.holders)}")
        for event in step.events:
            lines.append(f"{'':>8}  event {event.reason} on {event.model}: {event.message}")
    waited = [o for o in timeline.requests if o.served_at != o.request.at]
    if waited:
        lines.append("requests that waited (a 503 when the proxy's queue wait ran out):")
    for outcome in waited:
        refused = "".join(f", 503 at {_offset(at, start)}" for at in outcome.refusals)
        if outcome.served_at is not None:
            end = f", served at {_offset(outcome.served_at, start)}"
        else:
            end = ", gave up" if outcome.gave_up else ", still waiting at the end"
        arrived = _offset(outcome.request.at, start)
        lines.append(f"{'':>8}  {outcome.request.model} at {arrived}{refused}{end}")
    lines.append(
        f"swaps: {timeline.swaps}; most members with pods at once: {timeline.max_members_with_pods}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
