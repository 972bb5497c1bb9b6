"""`make demo` stays true: the whole story runs on a real local control plane."""

from __future__ import annotations

import io

from flexinfer_cli.demo import run_demo


def test_demo_tells_the_whole_story() -> None:
    out = io.StringIO()
    assert run_demo(out=out) == 0
    text = out.getvalue()
    act2 = text.split("2. A request for coder")[1].split("3. A fine-tuning job")[0]
    assert "chat's pod was gone before coder's pod was created" in act2
    assert "event Preempted on chat" in act2
    assert "{'chat': '', 'coder': 'coder'}" in act2
    act3 = text.split("3. A fine-tuning job")[1].split("4. The training job ends")[0]
    assert act3.count("GPULeaseHeld: parked") == 2
    assert "{'chat': '', 'coder': ''}" in act3
    act4 = text.split("4. The training job ends")[1]
    assert " Ready " in act4 and " Active " in act4
    assert text.rstrip().endswith("the control plane is stopped and its files removed.")
