"""`flexinfer explain -f`: a cluster dump replayed with no cluster, and bad manifests refused.

A bad manifest exits 2 with a message naming the file, the object and the field,
checked against the CRDs' own schemas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer_cli.__main__ import main

AT = "2026-12-01T12:00:00Z"


def model(
    name: str, *, priority: int = 100, status: dict[str, Any] | None = None, **gpu: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": "ai"},
        "spec": {
            "backend": "vllm",
            "source": f"HF://org/{name}",
            "gpu": {"shared": "homelab-gpu", "priority": priority, **gpu},
        },
    }
    if status is not None:
        body["status"] = status
    return body


def dump(tmp_path: Path, *objects: dict[str, Any], name: str = "dump.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(objects)}))
    return path


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["explain", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


COOLDOWN = (
    model(
        "chat",
        status={
            "phase": "Ready",
            "lastActiveTime": "2026-12-01T11:57:00Z",
            "sharedGroup": {"groupName": "homelab-gpu", "state": "Active", "queuePosition": 0},
        },
    ),
    model(
        "coder",
        status={
            "phase": "Preempted",
            "lastActiveTime": "2026-12-01T11:59:50Z",
            "sharedGroup": {
                "groupName": "homelab-gpu",
                "state": "Queued",
                "queuePosition": 1,
                "preemptedBy": "chat",
                "preemptedAt": "2026-12-01T11:59:30Z",
            },
        },
    ),
)


def test_a_dump_replays_with_its_status(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = dump(tmp_path, *COOLDOWN)
    code, out, _ = explain(
        capsys, "group/homelab-gpu", "-f", str(path), "-n", "ai", "--at", AT, "-o", "json"
    )
    assert code == 0
    data = json.loads(out)
    assert {"group", "leader", "reason", "message", "rules", "members", "next_change_at"} <= set(
        data
    )
    assert (data["group"], data["leader"], data["reason"]) == (
        "homelab-gpu",
        "chat",
        "SwapCooldown",
    )
    assert [r["number"] for r in data["rules"]] == list(range(1, 13))
    assert [r["number"] for r in data["rules"] if r["applied"]] == [4]
    assert all({"applied", "why"} <= set(r) for r in data["rules"])
    members = {m["name"]: m for m in data["members"]}
    assert members["coder"]["state"] == "Queued"
    assert members["coder"]["queuePosition"] == 1
    assert members["chat"]["desiredReplicas"] == 1
    # The recorded phases are replayed: chat has no Deployment in the dump, yet is Ready.
    assert members["chat"]["phase"] == "Ready"
    # The controller's timer: coder's demand leaves the 2m window.
    assert data["next_change_at"] == "2026-12-01T12:01:50Z"
    coder_takes = next(c for c in data["next"] if c["leader"] == "coder")
    assert coder_takes["at"] == "2026-12-01T12:04:30Z"
    assert coder_takes["when"] == "the 5m swap cooldown after coder's preemption ends"


def test_the_text_names_every_rule_and_what_happens_next(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = dump(tmp_path, *COOLDOWN)
    code, out, _ = explain(capsys, "model/coder", "-f", str(path), "-n", "ai", "--at", AT)
    assert code == 0
    assert "Holder: chat (SwapCooldown)" in out
    assert "4    swap cooldown       DECIDED" in out
    assert (
        "2026-12-01 12:04:30 UTC (in 4m30s): coder can take the card, when the 5m swap "
        "cooldown after coder's preemption ends"
    ) in out
    assert "(assuming requests for coder keep coming)" in out


def test_what_if_a_lease_were_taken(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = dump(tmp_path, *COOLDOWN)
    code, out, _ = explain(
        capsys,
        "group/homelab-gpu",
        "-f",
        str(path),
        "-n",
        "ai",
        "--at",
        AT,
        "--lease",
        "homelab-gpu",
        "-o",
        "json",
    )
    assert code == 0
    data = json.loads(out)
    assert (data["leader"], data["reason"]) == (None, "GPULeaseHeld")
    assert data["lease"]["name"] == "what-if"
    assert {m["reason"] for m in data["members"]} == {"GPULeaseHeld"}


def test_what_if_a_higher_priority_model_were_asked_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ready = model(
        "chat",
        status={
            "phase": "Ready",
            "lastActiveTime": "2026-12-01T11:59:00Z",
            "sharedGroup": {"groupName": "homelab-gpu", "state": "Active", "queuePosition": 0},
        },
    )
    path = dump(tmp_path, ready, model("coder", priority=300))
    code, out, _ = explain(
        capsys, "group/homelab-gpu", "-f", str(path), "-n", "ai", "--at", AT, "-o", "json"
    )
    assert json.loads(out)["leader"] == "chat"
    code, out, _ = explain(
        capsys,
        "group/homelab-gpu",
        "-f",
        str(path),
        "-n",
        "ai",
        "--at",
        AT,
        "--demand",
        "coder",
        "-o",
        "json",
    )
    data = json.loads(out)
    assert (code, data["leader"], data["reason"]) == (0, "coder", "DemandPreemption")
    assert data["whatIf"] == {"demand": ["coder"], "lease": None}


def test_at_takes_a_relative_instant(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    idle = model(
        "chat",
        status={
            "phase": "Ready",
            "lastActiveTime": "2026-12-01T11:59:00Z",
            "sharedGroup": {"groupName": "homelab-gpu", "state": "Active", "queuePosition": 0},
        },
    )
    path = dump(tmp_path, idle)
    _, out, _ = explain(capsys, "model/chat", "-f", str(path), "-n", "ai", "--at", AT, "-o", "json")
    assert json.loads(out)["members"][0]["desiredReplicas"] == 1
    later = "2026-12-01T12:10:00Z"
    _, out, _ = explain(
        capsys, "model/chat", "-f", str(path), "-n", "ai", "--at", later, "-o", "json"
    )
    assert json.loads(out)["members"][0]["desiredReplicas"] == 0  # past its 5m idle timeout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: [", "not valid YAML"),
        ("apiVersion: v1\nmetadata: {name: x}\n", "document 1: kind: required"),
        (
            "kind: Model\napiVersion: ai.flexinfer/v1alpha2\n",
            "document 1: Model: metadata.name: required",
        ),
        (
            "kind: Model\napiVersion: ai.flexinfer/v1alpha1\nmetadata: {name: x}\n",
            "Model x: apiVersion: 'ai.flexinfer/v1alpha1' is not ai.flexinfer/v1alpha2",
        ),
        (
            "kind: Modle\napiVersion: ai.flexinfer/v1alpha2\nmetadata: {name: x}\n",
            "Modle x: kind: not a flexinfer kind",
        ),
        (
            "kind: Model\napiVersion: ai.flexinfer/v1alpha2\nmetadata: {name: x}\n"
            "spec: {backend: vllm, source: 'HF://a/b', gpu: {priority: 5000}}\n",
            "Model x: spec.gpu.priority: 5000 is greater than the maximum of 1000",
        ),
        (
            "kind: Model\napiVersion: ai.flexinfer/v1alpha2\nmetadata: {name: x}\n"
            "spec: {backend: vllm, source: 'HF://a/b', gpu: {swapCooldown: 5 minutes}}\n",
            "Model x: spec.gpu.swapCooldown: '5 minutes' does not match",
        ),
        (
            "kind: Model\napiVersion: ai.flexinfer/v1alpha2\nmetadata: {name: x}\n"
            "spec: {backend: vllm, source: 'HF://a/b'}\nstatus: {lastActiveTime: yesterday}\n",
            "Model x: status.lastActiveTime: 'yesterday' is not a 'date-time'",
        ),
        (
            "kind: Model\napiVersion: ai.flexinfer/v1alpha2\nmetadata: {name: x}\nspec: {source: 'HF://a/b'}\n",
            "Model x: spec: 'backend' is a required property",
        ),
        (
            "kind: GPUGroup\napiVersion: ai.flexinfer/v1alpha1\nmetadata: {name: g}\n"
            "spec: {models: [{name: a, priority: -1}]}\n",
            "GPUGroup g: spec.models[0].priority: -1 is less than the minimum of 0",
        ),
    ],
)
def test_a_bad_manifest_exits_2_naming_the_file_and_field(
    content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    code, _, err = explain(capsys, "model/x", "-f", str(path))
    assert code == 2
    assert str(path) in err
    assert message in err


def test_a_missing_file_or_bad_target_or_flag_is_usage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert explain(capsys, "model/x", "-f", str(tmp_path / "nope.yaml"))[0] == 2
    path = dump(tmp_path, *COOLDOWN)
    code, _, err = explain(capsys, "pod/x", "-f", str(path))
    assert code == 2 and "KIND/NAME" in err
    code, _, err = explain(capsys, "model/chat", "-f", str(path), "-n", "ai", "--at", "soon")
    assert code == 2 and "--at" in err
    code, _, err = explain(
        capsys, "model/chat", "-f", str(path), "-n", "ai", "--demand-window", "2 min"
    )
    assert code == 2 and "--demand-window" in err
    with pytest.raises(SystemExit) as done:
        main(["explain", "model/chat", "-o", "xml"])
    assert done.value.code == 2


def test_an_unknown_object_is_a_failure_not_usage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = dump(tmp_path, *COOLDOWN)
    code, _, err = explain(capsys, "model/nobody", "-f", str(path), "-n", "ai")
    assert code == 1
    assert "Model 'nobody' not found in namespace ai" in err


def test_examples_replay(capsys: pytest.CaptureFixture[str]) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    code, out, _ = explain(
        capsys, "group/homelab-gpu", "-f", str(examples / "shared-gpu-models.yaml"), "-o", "json"
    )
    assert code == 0
    assert {m["name"] for m in json.loads(out)["members"]} == {"qwen-chat", "qwen-coder"}


def test_a_gpu_group_replays_with_its_steps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    report = json.dumps(
        {"queued": 1, "oldestWaiting": "2026-12-01T11:59:55Z", "reportedAt": "2026-12-01T11:59:59Z"}
    )
    objects = [
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "GPUGroup",
            "metadata": {
                "name": "card",
                "namespace": "ai",
                "annotations": {"demand.ai.flexinfer/b": report},
            },
            "spec": {"models": [{"name": "a"}, {"name": "b"}]},
            "status": {"activeModel": "a", "lastSwapTime": "2026-12-01T11:50:00Z"},
        },
        *(
            {
                "apiVersion": "ai.flexinfer/v1alpha1",
                "kind": "ModelDeployment",
                "metadata": {"name": name, "namespace": "ai"},
                "spec": {"backend": "vllm", "model": "m", "gpuGroupRef": "card"},
                "status": {"lastAccessTime": "2026-12-01T11:59:00Z"} if name == "a" else {},
            }
            for name in ("a", "b")
        ),
    ]
    path = dump(tmp_path, *objects)
    code, out, _ = explain(capsys, "md/b", "-f", str(path), "-n", "ai", "--at", AT, "-o", "json")
    data = json.loads(out)
    assert (code, data["kind"], data["leader"], data["reason"]) == (
        0,
        "GPUGroup",
        "a",
        "QueueBelowThreshold",
    )
    assert [r["number"] for r in data["rules"] if r["applied"]] == [6]
    assert data["next"][0]["what"] == "b takes the GPU"
    assert data["next"][0]["at"] == "2026-12-01T12:04:00Z"
    # What if b's queue were the threshold's worth? --demand adds to the proxy's report.
    _, out, _ = explain(
        capsys,
        "gpugroup/card",
        "-f",
        str(path),
        "-n",
        "ai",
        "--at",
        AT,
        "--demand",
        "b",
        "-o",
        "json",
    )
    assert json.loads(out)["whatIf"]["demand"] == ["b"]


def test_changes_bounds_how_far_ahead_it_looks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = dump(tmp_path, *COOLDOWN)
    args = ("group/homelab-gpu", "-f", str(path), "-n", "ai", "--at", AT, "-o", "json")
    code, out, _ = explain(capsys, *args, "--changes", "1")
    (only,) = json.loads(out)["next"]
    assert (code, only["what"]) == (0, "chat scales from 1 to 0")
    code, _, err = explain(capsys, *args, "--changes", "0")
    assert code == 2 and "--changes: must be at least 1" in err


def test_the_packed_example_packs_only_with_a_device_class(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """examples/packed-group.yaml (docs/election.md 1.7): as a controller started with
    --gpu-device-class decides, chat and coder share the card; without it, as a
    controller without a DRA driver decides, one member at a time."""
    example = str(Path(__file__).resolve().parents[2] / "examples" / "packed-group.yaml")
    asked = ("--demand", "small-chat", "--demand", "small-coder")
    code, out, _ = explain(
        capsys, "group/small-card", "-f", example, *asked, "--gpu-device-class", "gpu.amd.com",
        "-o", "json",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert "small-coder: fits: 9 of 22 GiB used" in data["packing"]
    states = {m["name"]: m["state"] for m in data["members"]}
    assert states == {"small-chat": "Active", "small-coder": "Active", "small-helper": "Queued"}
    code, out, _ = explain(capsys, "group/small-card", "-f", example, *asked, "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert "the group runs one member at a time" in data["packing"]
    assert [m["name"] for m in data["members"] if m["state"] == "Active"] == ["small-chat"]
