"""benchmarks/bench_packing.py runs and says what it measured (docs/benchmarks.md).

No timing is asserted: what is checked is that both runs saw the same generated
requests, that the packed run shared the card within its budget and the other never
did, and that bad arguments are refused naming the flag.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_packing.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_packing", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_hours_packed_and_one_at_a_time(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--hours", "2", "--seed", "19"]) == 0
    data = json.loads(capsys.readouterr().out)
    sent = len(bench.day_of_requests(19, 2))
    assert sent > 0
    packed, alone = data["packed"], data["oneAtATime"]
    for run in (packed, alone):
        assert run["requests"] == sent
        assert run["served"] + run["neverServed"] == sent
        assert run["loads"] >= 1 and run["p95WaitSeconds"] is not None
        assert run["p95WaitAllSeconds"] >= run["p95WaitSeconds"]
    assert data["budgetGiB"] == 24
    # Packed: more than one server on the card at once, never more than the budget.
    assert packed["mostMembersWithPods"] > 1
    assert packed["mostHeldGiB"] <= 24
    # One at a time: never two.
    assert alone["mostMembersWithPods"] == 1


@pytest.mark.parametrize(("flag", "value"), [("--hours", "25"), ("--load", "-1")])
def test_bad_arguments_name_the_flag(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as raised:
        bench.main([flag, value])
    assert raised.value.code == 2
    assert f"{flag}: {value}" in capsys.readouterr().err
