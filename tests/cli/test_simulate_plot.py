"""`flexinfer simulate --plot`: every shipped scenario draws a valid PNG, and long traces
get a progress bar."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
import yaml

from flexinfer_cli.__main__ import main
from flexinfer_cli.plot import build_picture
from flexinfer_cli.scenario import load_scenario

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "examples" / "scenarios").glob("*.yaml"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND", f"{path} is truncated"
    return width, height


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_shipped_scenario_plots_a_png(scenario: Path, tmp_path: Path) -> None:
    out = tmp_path / f"{scenario.stem}.png"
    assert main(["simulate", str(scenario), "--plot", str(out)]) == 0
    width, height = png_size(out)
    assert width >= 800 and height >= 200


def test_the_picture_holds_what_the_timeline_says() -> None:
    scenario = load_scenario(next(p for p in SCENARIOS if p.stem == "priority-and-lease"))
    timeline = scenario.simulate()
    picture = build_picture(scenario, timeline, progress="never")
    # coder (priority 500) takes the card at 2m, announced with the election's reason.
    assert any(
        s.leader == "coder" and s.at == 2.0 and s.reason == "DemandPreemption"
        for s in picture.swaps
    )
    # The lease from 8m to 18m parks everyone: nobody holds the card in between.
    assert ("qwen-ft-gpu-lease", 8.0, 18.0) in picture.leases
    assert not [h for h in picture.holds if h.start < 18.0 and h.end > 8.0 and h.start >= 8.0]
    # chat's request at 3m waits in the proxy's queue; after its third 503 (at 6m30s) its
    # client gives up. chat's request at 20m waits for chat's load. Every request is drawn.
    assert len(picture.waits) == len(scenario.requests)
    waited = next(w for w in picture.waits if w.model == "chat" and w.arrived == 3.0)
    assert waited.served is None and waited.gave_up == 6.5
    loaded = next(w for w in picture.waits if w.model == "chat" and w.arrived == 20.0)
    assert loaded.served == 20.75 and loaded.gave_up is None


def test_a_long_trace_shows_a_progress_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = [{"at": f"{i}s", "model": "a" if (i // 90) % 2 else "b"} for i in range(0, 3000)]
    path = tmp_path / "long.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "group": "g",
                "until": "60m",
                "models": [{"name": "a"}, {"name": "b"}],
                "requests": requests,
            }
        )
    )
    out = tmp_path / "long.png"
    assert main(["simulate", str(path), "--plot", str(out), "--progress", "always"]) == 0
    png_size(out)
    err = capsys.readouterr().err
    assert "requests" in err and "it" in err  # tqdm's bar on stderr


def test_without_matplotlib_the_command_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in [m for m in sys.modules if m.startswith("matplotlib")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code = main(["simulate", str(SCENARIOS[0]), "--plot", str(tmp_path / "x.png")])
    assert code == 2
    assert "pip install 'flexinfer[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_a_packed_group_draws_every_holder() -> None:
    """examples/scenarios/packed-group.yaml (docs/election.md 1.7): chat and embed hold
    the card together from 0s; coder joins them at 3m; vision's eviction at 6m ends
    chat's and embed's holds; chat holds again from 11m beside coder."""
    scenario = load_scenario(next(p for p in SCENARIOS if p.stem == "packed-group"))
    picture = build_picture(scenario, scenario.simulate(), progress="never")
    # (An idle timeout ends a microsecond after it lapses: rounded to the millisecond.)
    held = {(h.model, round(h.start, 3), round(h.end, 3)) for h in picture.holds}
    assert ("chat", 0.0, 6.0) in held and ("embed", 0.0, 6.0) in held
    assert ("coder", 3.0, 12.0) in held
    assert ("vision", 6.0, 11.0) in held
    assert ("chat", 11.0, 12.0) in held
    # At 4m three members hold the card at once.
    assert sorted(h.model for h in picture.holds if h.start <= 4.0 < h.end) == [
        "chat",
        "coder",
        "embed",
    ]
