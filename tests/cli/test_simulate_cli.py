"""`flexinfer simulate`: scenarios from examples/ through the core, printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from flexinfer_cli.__main__ import main

SCENARIOS = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def run_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict:  # type: ignore[type-arg]
    assert main(["simulate", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_swap_loop_scenario_is_held_by_the_cooldown(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    guarded = run_json(capsys, SCENARIOS / "swap-loop.yaml")
    data = yaml.safe_load((SCENARIOS / "swap-loop.yaml").read_text())
    for model in data["models"]:
        model["swapCooldown"] = "0s"
    unguarded_file = tmp_path / "no-cooldown.yaml"
    unguarded_file.write_text(yaml.safe_dump(data))
    unguarded = run_json(capsys, unguarded_file)
    assert guarded["swaps"] < unguarded["swaps"]
    assert unguarded["swaps"] >= 8
    assert guarded["max_members_with_pods"] == unguarded["max_members_with_pods"] == 1


def test_swap_loop_hands_chat_the_card_once_coder_is_idle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """chat's request at 16m waits (coder holds the card inside its cooldown); the proxy's
    refreshes and the client's retries keep chat demanded, so chat takes the card at 20m,
    when coder (last asked for at 18m) is idle, as on a cluster."""
    timeline = run_json(capsys, SCENARIOS / "swap-loop.yaml")
    swaps = [(s["at"], s["leader"], s["reason"]) for s in timeline["steps"] if s["events"]]
    assert swaps[-1] == ("20m", "chat", "DemandPreemption")
    chat_16m = next(r for r in timeline["requests"] if r["at"] == "16m")
    assert chat_16m["refused"] == ["17m", "18m15s", "19m30s"] and chat_16m["gaveUp"]


def test_scenario_settings_reach_the_simulator(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`clients.retries: 0`: chat's request at 16m gets one 503 and is not asked again,
    its demand lapses at 18m, and coder keeps the card to the end."""
    data = yaml.safe_load((SCENARIOS / "swap-loop.yaml").read_text())
    data["clients"] = {"retries": 0}
    path = tmp_path / "impatient.yaml"
    path.write_text(yaml.safe_dump(data))
    timeline = run_json(capsys, path)
    leaders = [s["leader"] for s in timeline["steps"] if s["events"]]
    assert leaders[-1] == "coder"
    chat_16m = next(r for r in timeline["requests"] if r["at"] == "16m")
    assert chat_16m["refused"] == ["17m"] and chat_16m["gaveUp"]


def test_priority_and_lease_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    timeline = run_json(capsys, SCENARIOS / "priority-and-lease.yaml")
    by_time = {step["at"]: step for step in timeline["steps"]}
    assert by_time["2m"]["leader"] == "coder"
    assert by_time["2m"]["reason"] == "DemandPreemption"
    assert by_time["8m"]["leader"] is None
    assert by_time["8m"]["reason"] == "GPULeaseHeld"
    assert [e["reason"] for e in by_time["8m"]["events"]] == ["GPULeaseHeld"]


def test_table_output_names_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(SCENARIOS / "priority-and-lease.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["AT", "LEADER", "REASON"]
    assert "event Preempted on chat" in out
    assert out.rstrip().endswith("most members with pods at once: 1")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("models: [{name: a, priority: 5000}]", "priority: 5000 must be between 0 and 1000"),
        ("models: [{name: a, swapCooldown: 3x}]", "models[0].swapCooldown: '3x'"),
        ("models: []", "models: [] must list at least one model"),
        ("models: [{name: a}]\nrequests: [{at: 1m, model: b}]", "requests.model: 'b'"),
        ("models: [{name: a}]\nrequests: [{model: a}]", "requests[0].at: None is required"),
        ("models: [{name: a}]\nproxy: {minQueueWait: 1x}", "proxy.minQueueWait: '1x'"),
        ("models: [{name: a}]\nproxy: {queueWait: 1m}", "proxy.queueWait: '1m' is not a setting"),
        ("models: [{name: a}]\nclients: {retries: -1}", "clients.retries: -1 must be 0 or more"),
        ("models: [{name: a}]\npolicy: {demandWindow: -1s}", "policy.demandWindow: '-1s'"),
        ("models: [{name: a}]\npolicy: 3", "policy: 3 must be a mapping"),
    ],
)
def test_bad_scenarios_name_the_field(
    content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    assert main(["simulate", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_missing_scenario_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["simulate", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_dev_and_controller_are_handed_their_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["controller", "--help"])
    assert done.value.code == 0
    assert "--leader-elect" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["proxy", "--help"])
    assert done.value.code == 0
    assert "--max-per-backend" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["dev", "cluster", "--help"])
    assert done.value.code == 0
    assert "{up,down,env}" in capsys.readouterr().out


def test_the_card_returns_to_the_default_once_coder_is_idle(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """chat (`default: true`) takes the card with nobody asking, gives way to coder at
    once, and takes it back when coder has scaled to zero 5m after its last request;
    that return evicts nothing, so coder asked again at 15m takes the card at once.
    Without the flag chat stays parked once coder has had the card."""
    timeline = run_json(capsys, SCENARIOS / "return-to-default.yaml")
    swaps = [(s["at"], s["leader"], s["reason"]) for s in timeline["steps"] if s["events"]]
    assert swaps == [
        ("0s", "chat", "ReturnToDefault"),
        ("1m", "coder", "DemandPreemption"),
        ("8m5s", "chat", "ReturnToDefault"),
        ("15m", "coder", "DemandPreemption"),
        ("20m5s", "chat", "ReturnToDefault"),
    ]
    data = yaml.safe_load((SCENARIOS / "return-to-default.yaml").read_text())
    for model in data["models"]:
        model.pop("default", None)
    plain = tmp_path / "no-default.yaml"
    plain.write_text(yaml.safe_dump(data))
    timeline = run_json(capsys, plain)
    leaders = [s["leader"] for s in timeline["steps"] if s["events"]]
    assert "chat" not in leaders[1:], leaders


def test_packed_group_scenario_holds_a_set_within_its_budget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """examples/scenarios/packed-group.yaml (docs/election.md 1.7): chat and embed hold
    the card together from the start; vision evicts just enough; the pods on the card
    never sum to more than the budget; without the budget, one member at a time."""
    path = SCENARIOS / "packed-group.yaml"
    data = yaml.safe_load(path.read_text())
    gib = {"5632Mi": 5.5, "4Gi": 4, "12Gi": 12, "10Gi": 10}
    sizes = {m["name"]: gib[m["vramEstimate"]] for m in data["models"]}
    packed = run_json(capsys, path)
    assert packed["steps"][0]["holders"] == ["chat", "embed"]
    for step in packed["steps"]:
        on_card = sum(sizes[name] for name, pods in step["pods"].items() if pods["pods"])
        assert on_card <= 24, step
    served = {(r["model"], r["at"]): r["served"] for r in packed["requests"]}
    assert served[("chat", "0s")] == served[("embed", "0s")] == "30s"
    at_six = next(s for s in packed["steps"] if s["at"] == "6m")
    assert at_six["holders"] == ["coder", "vision"]
    evicted = {e["model"] for e in at_six["events"] if e["reason"] == "Preempted"}
    assert evicted == {"chat", "embed"}
    assert packed["max_members_with_pods"] == 3
    for model in data["models"]:
        del model["vramBudget"]
    alone = tmp_path / "one-at-a-time.yaml"
    alone.write_text(yaml.safe_dump(data))
    assert run_json(capsys, alone)["max_members_with_pods"] == 1


def test_a_bad_vram_quantity_names_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "chat", "vramBudget": "lots"}]}))
    assert main(["simulate", str(path)]) != 0
    assert "models[0].vramBudget" in capsys.readouterr().err
