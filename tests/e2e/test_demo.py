"""`make demo` stays true: the whole story runs on a real local control plane, with
real llama-server processes answering through the proxy."""

from __future__ import annotations

import io
import re

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
    assert "{'chat': '', 'coder': 'coder'}" in act2
    act3 = text.split("3. A fine-tuning job")[1].split("4. The training job ends")[0]
    assert act3.count("GPULeaseHeld: parked") == 2
    assert "{'chat': '', 'coder': ''}" in act3
    act4 = text.split("4. The training job ends")[1]
    assert re.search(r"coder answered after [0-9.]+s: '[^']+'", act4), act4
    assert text.rstrip().endswith("the control plane is stopped and its files removed.")
