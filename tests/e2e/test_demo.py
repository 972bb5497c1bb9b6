"""`make demo` stays true: the whole story runs on a real local control plane, with
real llama-server processes answering through the proxy."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
from pathlib import Path

from flexinfer_cli.demo import run_demo


def test_the_demo_watch_reports_an_overlap_and_a_dead_watch() -> None:
    """The summary the demo prints can say something other than "no overlap"."""
    from flexinfer_cli.demo import PodWatch

    watch = PodWatch.__new__(PodWatch)
    watch.live, watch.order, watch.overlaps, watch.error = {}, [], [], ""
    watch._added({"metadata": {"name": "chat-1", "labels": {"ai.flexinfer/model": "chat"}}})
    watch._added({"metadata": {"name": "coder-1", "labels": {"ai.flexinfer/model": "coder"}}})
    assert watch.summary().startswith("OVERLAP: pod coder-1 of coder created while ['chat']")
    assert not watch.held
    watch.overlaps, watch.error = [], "Transient: stream dropped"
    assert "the pod watch failed" in watch.summary()


def test_demo_tells_the_whole_story(llama_server: object) -> None:
    out = io.StringIO()
    assert run_demo(out=out) == 0
    text = out.getvalue()
    intro, rest = text.split("1. A request for chat", 1)
    assert "deployment.apps/chat" in intro and "service/coder" in intro  # rendered
    act1 = rest.split("2. A request for coder")[0]
    cold = re.search(r"chat answered after ([0-9.]+)s \(cold", act1)
    warm = re.search(r"the first token came after ([0-9.]+)s \(warm\)", act1)
    assert cold and warm, act1
    answer = re.search(r"\n     '([^']*)'   \(nonsense words", act1)
    assert answer and answer.group(1).strip(), act1  # real tokens came back
    act2 = text.split("2. A request for coder")[1].split("3. A fine-tuning job")[0]
    assert (
        "chat's pod was gone before coder's pod was created (watched from before the request)"
        in act2
    ), act2
    assert re.search(r"coder answered after [0-9.]+s \(cold\): '[^']+'", act2), act2
    assert "event Preempted on chat" in act2
    assert "service labels go to: ['coder']" in act2
    act3 = text.split("3. A fine-tuning job")[1].split("4. The training job ends")[0]
    assert act3.count("GPULeaseHeld: parked") == 2
    assert "service labels go to: []" in act3
    act4 = text.split("4. The training job ends")[1]
    assert re.search(r"coder answered after [0-9.]+s: '[^']+'", act4), act4
    assert text.rstrip().endswith("the control plane is stopped and its files removed.")


def test_a_kept_demo_started_in_the_background_stops_cleanly_on_sigterm(
    llama_server: object, tmp_path: Path
) -> None:
    """`flexinfer demo --keep &` ignores SIGINT (a background job); SIGTERM must still
    stop its proxy, its servers and its control plane, not orphan them."""
    process = subprocess.Popen(
        [sys.executable, "-m", "flexinfer_cli", "demo", "--keep"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    assert process.stdout is not None
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        text = "".join(lines)
        assert "Press Ctrl-C" in text, text
        kubeconfig = re.search(r"export KUBECONFIG=(\S+)", text)
        assert kubeconfig, text
        children = _descendants(process.pid)
        assert children  # the proxy, the control plane, the servers
        process.send_signal(signal.SIGTERM)
        rest = process.stdout.read()
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert "Done: the control plane is stopped" in rest, rest
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists()
             and "zombie" not in _state(pid)]
    assert alive == [], [Path(f"/proc/{pid}/cmdline").read_text() for pid in alive]


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child in Path(f"/proc/{parent}/task").glob("*/children"):
            for word in child.read_text().split():
                found.append(int(word))
                frontier.append(int(word))
    return found


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n")[0]
    except (OSError, IndexError):
        return "zombie"
