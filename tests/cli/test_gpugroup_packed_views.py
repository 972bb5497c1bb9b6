"""`flexinfer explain`, `status` and `doctor` decide a budgeted GPUGroup as the controller
does (docs/election.md 3, "Packing"): given `--gpu-device-class`, packed; without it,
one member at a time. From manifests, without a cluster.

The group: a 24 GiB card, `chat` (8 GiB) led it and idled out (its last request 15
minutes ago, its idle timeout 5 minutes), `embed` (8 GiB) sits beside it and was asked
for 5 s ago, `big` (20 GiB) asked for a minute ago but its proxy's report went stale.
Section 3 alone idles the group; packed, `embed` keeps the card (no swap).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer_cli.__main__ import main
from flexinfer_cli.doctor import Settings, demand_reaches_controller
from flexinfer_cli.manifests import load_manifests
from flexinfer_cli.status import status_data, status_text
from flexinfer_core import DEFAULT_POLICY

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
AT = "2026-12-01T12:00:00Z"
CLASS = "gpu.amd.com"
STALE = json.dumps(
    {"queued": 1, "oldestWaiting": "2026-12-01T11:49:00Z", "reportedAt": "2026-12-01T11:50:00Z"}
)


def member(name: str, last_access: str | None) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "backend": "llama-cpp",
            "model": f"huggingface://org/{name}/{name}.gguf",
            "gpuGroupRef": "card",
            "idleTimeoutSeconds": 300,
            "resources": {"limits": {"amd.com/gpu": "1"}},
        },
        "status": {"lastAccessTime": last_access} if last_access else {},
    }


def objects(*, leader_rows: tuple[str, ...] = ("chat", "embed")) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "GPUGroup",
            "metadata": {"name": "card", "annotations": {"demand.ai.flexinfer/big": STALE}},
            "spec": {
                "vramBudget": "24Gi",
                "models": [
                    {"name": "chat", "priority": 200, "vramEstimate": "8Gi"},
                    {"name": "embed", "priority": 100, "vramEstimate": "8Gi"},
                    {"name": "big", "priority": 50, "vramEstimate": "20Gi"},
                ],
            },
            "status": {
                "activeModel": "chat",
                "lastSwapTime": "2026-12-01T11:45:00Z",
                "swapCount": 1,
                "modelStatuses": [
                    {"name": n, "state": "Active" if n in leader_rows else "Idle"}
                    for n in ("chat", "embed", "big")
                ],
            },
        },
        member("chat", "2026-12-01T11:45:00Z"),
        member("embed", "2026-12-01T11:59:55Z"),
        member("big", None),
    ]


def dump(tmp_path: Path, objs: list[dict[str, Any]]) -> Path:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objs))
    return path


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["explain", *args, "--at", AT, "-o", "json"])
    assert code == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_explain_packs_a_budgeted_gpu_group_with_a_device_class(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = str(dump(tmp_path, objects()))
    packed = explain(capsys, "gpugroup/card", "-f", path, "--gpu-device-class", CLASS)
    assert (packed["leader"], packed["holders"]) == ("embed", ["embed"])
    assert packed["message"] == "embed keeps the GPU: it is still in use"
    assert packed["packed"]["reason"] == "Fits"
    assert packed["packed"]["message"] == "embed holds the card: fits: 8 of 24 GiB used"
    seats = {m["name"]: m["seat"] for m in packed["members"]}
    # As the status reads once written: chat gave up its seat, so it is simply unasked.
    assert seats["chat"] == {
        "admitted": False,
        "reason": "Queued",
        "message": "chat has no queued requests",
    }
    assert seats["embed"]["admitted"] is True
    assert seats["embed"]["message"].endswith("fits: 8 of 24 GiB used")
    # Without the flag: section 3 alone, which idles the group, and Packed says why.
    plain = explain(capsys, "gpugroup/card", "-f", path)
    assert (plain["leader"], plain["holders"]) == (None, [])
    assert plain["packed"]["reason"] == "NoSharedCard"
    assert all(m["seat"] is None for m in plain["members"])
    # The table's card column is there only when the group packs.
    for flags, shown in (((), False), (("--gpu-device-class", CLASS), True)):
        assert main(["explain", "gpugroup/card", "-f", path, "--at", AT, *flags]) == 0
        assert ("CARD" in capsys.readouterr().out) is shown


def test_explain_says_why_a_member_is_or_is_not_beside_the_leader(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Two members asked for at once (two --demand on one GPUGroup: both reports kept)
    share the card; a third that does not fit and may not evict waits, in the words of
    the status condition `Packed`."""
    objs = objects(leader_rows=())
    objs[0]["metadata"]["annotations"] = {}
    objs[0]["status"] = {}
    path = str(dump(tmp_path, objs))
    asked = ("--demand", "chat", "--demand", "embed", "--demand", "big")
    data = explain(capsys, "md/big", "-f", path, *asked, "--gpu-device-class", CLASS)
    assert data["member"] == "big"
    assert (data["leader"], data["holders"]) == ("chat", ["chat", "embed"])
    seats = {m["name"]: m["seat"] for m in data["members"]}
    assert seats["embed"] == {
        "admitted": True,
        "reason": "CoResident",
        "message": "fits: 16 of 24 GiB used",
    }
    assert seats["big"]["admitted"] is False
    assert seats["big"]["reason"] == "WaitingForVram"
    assert seats["big"]["message"].startswith("big needs 20 GiB, 8 free")
    assert data["packed"]["message"].startswith(
        "chat, embed hold the card together: fits: 16 of 24 GiB used; big needs 20 GiB, 8 free"
    )
    code = main(["explain", "md/big", "-f", path, *asked, "--gpu-device-class", CLASS, "--at", AT])
    assert code == 0
    text = capsys.readouterr().out
    assert "On the card beside the leader: off (WaitingForVram): big needs 20 GiB, 8 free" in text
    assert "On the card: chat, embed" in text


def test_status_decides_a_budgeted_gpu_group_as_the_controller(tmp_path: Path) -> None:
    view = load_manifests([str(dump(tmp_path, objects()))], namespace="ai")
    (packed,) = status_data(view, now=NOW, policy=DEFAULT_POLICY, device_class=CLASS)["gpuGroups"]
    assert (packed["active"], packed["holders"]) == ("embed", ["embed"])
    assert packed["vram"] == {"budgetBytes": 24 * 2**30, "usedBytes": 8 * 2**30, "sharedCard": True}
    (plain,) = status_data(view, now=NOW, policy=DEFAULT_POLICY)["gpuGroups"]
    assert (plain["active"], plain["vram"]["sharedCard"]) == (None, False)
    text = status_text(status_data(view, now=NOW, policy=DEFAULT_POLICY), now=NOW, namespace="ai")
    assert "one-at-a-time" in text


def test_status_shows_every_holder_of_a_packed_gpu_group(tmp_path: Path) -> None:
    objs = objects()
    objs[1]["status"] = {"lastAccessTime": "2026-12-01T11:59:50Z"}  # chat in use again
    view = load_manifests([str(dump(tmp_path, objs))], namespace="ai")
    data = status_data(view, now=NOW, policy=DEFAULT_POLICY, device_class=CLASS)
    (group,) = data["gpuGroups"]
    assert (group["active"], group["holders"]) == ("chat", ["chat", "embed"])
    assert group["vram"]["usedBytes"] == 16 * 2**30
    assert "16/24GiB:chat,embed" in status_text(data, now=NOW, namespace="ai")


def _settings(device_class: str) -> Settings:
    return Settings(
        now=NOW,
        policy=DEFAULT_POLICY,
        grace=timedelta(seconds=30),
        swap_window=timedelta(minutes=30),
        max_swaps=6,
        proxy_account="flexinfer-system/flexinfer-proxy",
        shared_card=bool(device_class),
        device_class=device_class,
    )


def test_doctor_judges_a_packed_gpu_group_by_the_packed_decision(tmp_path: Path) -> None:
    """Once the controller (with --gpu-device-class) has kept embed on the card as the
    leader, doctor with the same flag finds nothing; before, it says embed should lead
    (section 3 alone would say nobody)."""
    acted = objects()
    acted[0]["status"]["activeModel"] = "embed"
    acted[0]["status"]["modelStatuses"][0]["state"] = "Idle"
    view = load_manifests([str(dump(tmp_path, acted))], namespace="ai")
    assert demand_reaches_controller(view, "ai", [], settings=_settings(CLASS)) == []
    view = load_manifests([str(dump(tmp_path, objects()))], namespace="ai")
    (finding,) = demand_reaches_controller(view, "ai", [], settings=_settings(CLASS))
    assert "the active model should be embed" in finding.message
    (plain,) = demand_reaches_controller(view, "ai", [], settings=_settings(""))
    assert "the active model should be none" in plain.message
