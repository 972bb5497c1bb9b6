"""`python -m flexinfer_devcluster.devcluster up|down|env`: a LocalCluster for a person to use.

`up` runs the cluster in the foreground until Ctrl-C or SIGTERM (or, with `--detach`, in
a background process) and records it in a state file; `env` prints the `KUBECONFIG`
export for a shell; `down` ends the recorded cluster. The `flexinfer dev cluster`
command wraps this module; it holds no logic of its own beyond the state file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flexinfer_devcluster.assets import AssetsError, cache_root
from flexinfer_devcluster.localcluster import LocalCluster, LocalClusterError, default_nodes


def state_dir() -> Path:
    return cache_root() / "devcluster"


def state_file() -> Path:
    return state_dir() / "state.json"


def read_state() -> dict[str, Any] | None:
    """The running dev cluster's record, or None (a stale record is removed)."""
    try:
        state = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not process_alive(int(state.get("pid", 0))):
        with contextlib.suppress(OSError):
            state_file().unlink()
        return None
    return state


def process_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def env_lines(state: dict[str, Any]) -> list[str]:
    return [f"export KUBECONFIG={state['kubeconfig']}"]


def up(*, nodes: int, gpus: int) -> int:
    if (state := read_state()) is not None:
        print(f"a dev cluster is already running (pid {state['pid']}):", file=sys.stderr)
        print("\n".join(env_lines(state)))
        return 1
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    cluster = LocalCluster(nodes=default_nodes(nodes, gpus=gpus), name="flexinfer-dev")
    try:
        cluster.start()
    except (LocalClusterError, AssetsError) as error:
        print(f"flexinfer dev cluster: {error}", file=sys.stderr)
        return 1
    try:
        state = {
            "pid": os.getpid(),
            "kubeconfig": str(cluster.kubeconfig),
            "server": cluster.server,
            "workdir": str(cluster.workdir),
            "processes": cluster.pids(),
            "started_seconds": round(cluster.started_seconds or 0.0, 2),
        }
        state_dir().mkdir(parents=True, exist_ok=True)
        temporary = state_file().with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=2) + "\n")
        temporary.rename(state_file())
        print(
            f"# dev cluster up in {state['started_seconds']}s at {cluster.server}; "
            "Ctrl-C or `python -m flexinfer_devcluster.devcluster down` stops it"
        )
        print("\n".join(env_lines(state)), flush=True)
        while not stop.wait(1.0):
            try:
                cluster.check_alive()
            except LocalClusterError as error:
                print(f"flexinfer dev cluster: {error}", file=sys.stderr)
                return 1
        return 0
    finally:
        cluster.stop()
        with contextlib.suppress(OSError):
            if json.loads(state_file().read_text()).get("pid") == os.getpid():
                state_file().unlink()


def up_detached(*, nodes: int, gpus: int, timeout: float = 300.0) -> int:
    if (state := read_state()) is not None:
        print("\n".join(env_lines(state)))
        return 0
    state_dir().mkdir(parents=True, exist_ok=True)
    log = state_dir() / "up.log"
    with log.open("wb") as log_file:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flexinfer_devcluster.devcluster",
                "up",
                f"--nodes={nodes}",
                f"--gpus={gpus}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_state()
        if state is not None and state.get("pid") == child.pid:
            print("\n".join(env_lines(state)))
            return 0
        if child.poll() is not None:
            print(
                f"flexinfer dev cluster: `up` exited with {child.returncode}; {log}:",
                file=sys.stderr,
            )
            print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"flexinfer dev cluster: not up after {timeout:.0f}s; see {log}", file=sys.stderr)
    return 1


def down(*, timeout: float = 30.0) -> int:
    state = read_state()
    if state is None:
        print("no dev cluster is running", file=sys.stderr)
        return 0
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if process_alive(pid):
        print(f"dev cluster (pid {pid}) did not stop in {timeout:.0f}s", file=sys.stderr)
        return 1
    with contextlib.suppress(OSError):
        state_file().unlink()
    print(f"stopped the dev cluster (pid {pid})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flexinfer_devcluster.devcluster")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start a local control plane")
    start.add_argument("--detach", action="store_true", help="run in the background")
    start.add_argument("--nodes", type=int, default=2, help="kwok nodes (default 2)")
    start.add_argument("--gpus", type=int, default=1, help="amd.com/gpu per node (default 1)")
    commands.add_parser("down", help="stop the running dev cluster")
    commands.add_parser("env", help="print `export KUBECONFIG=...` for the running cluster")
    args = parser.parse_args(argv)
    if args.command == "up":
        if args.detach:
            return up_detached(nodes=args.nodes, gpus=args.gpus)
        return up(nodes=args.nodes, gpus=args.gpus)
    if args.command == "down":
        return down()
    state = read_state()
    if state is None:
        print("no dev cluster is running; start one with `up --detach`", file=sys.stderr)
        return 1
    print("\n".join(env_lines(state)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
