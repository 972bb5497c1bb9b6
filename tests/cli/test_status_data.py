"""`flexinfer status` rows for every kind of group, from a view filled with manifests.

The live-cluster tests (test_commands_cluster.py) cover shared groups and `-w`; these
cover a GPUGroup held back by a gate, a standalone ModelDeployment's scale-down timer
and a Model that shares no card, without a cluster.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import yaml

from flexinfer_cli.manifests import load_manifests
from flexinfer_cli.status import status_data, status_text
from flexinfer_core import DEFAULT_POLICY

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
REPORT = (
    '{"queued": 1, "oldestWaiting": "2026-12-01T11:59:55Z", "reportedAt": "2026-12-01T11:59:59Z"}'
)
OBJECTS = [
    {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPUGroup",
        "metadata": {"name": "card", "annotations": {"demand.ai.flexinfer/b": REPORT}},
        "spec": {"models": [{"name": "a"}, {"name": "b"}]},
        "status": {"activeModel": "a", "lastSwapTime": "2026-12-01T11:50:00Z", "swapCount": 4},
    },
    *(
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": name},
            "spec": {"backend": "vllm", "model": "m"},
            "status": {"lastAccessTime": "2026-12-01T11:59:00Z"} if name == "a" else {},
        }
        for name in ("a", "b")
    ),
    {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "solo"},
        "spec": {"backend": "vllm", "model": "m", "minReplicas": 0, "idleTimeoutSeconds": 300},
        "status": {"lastAccessTime": "2026-12-01T11:58:00Z"},
    },
    {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": "lonely"},
        "spec": {"backend": "vllm", "source": "HF://org/lonely"},
        "status": {"lastActiveTime": "2026-12-01T11:59:00Z"},
    },
]


def test_rows_for_gpu_groups_standalone_deployments_and_unshared_models(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(OBJECTS))
    view = load_manifests([str(path)], namespace="ai")
    data = status_data(view, now=NOW, policy=DEFAULT_POLICY)

    (group,) = data["gpuGroups"]
    assert (group["name"], group["active"], group["gate"]) == ("card", "a", "QueueBelowThreshold")
    assert group["queue"] == [{"name": "b", "queued": 1}]
    assert group["swaps"] == 4

    (solo,) = data["modelDeployments"]  # a and b belong to the GPUGroup
    assert (solo["name"], solo["desiredReplicas"], solo["reason"]) == ("solo", 1, "InUse")
    assert solo["scalesDownAt"] == "2026-12-01T12:03:00Z"

    (lonely,) = data["models"]
    assert (lonely["name"], lonely["desiredReplicas"]) == ("lonely", 1)
    assert data["sharedGroups"] == []

    text = status_text(data, now=NOW, namespace="ai")
    assert "GPUGroups:\nGPUGROUP   ACTIVE   PHASE" in text
    assert "in 3m to 0" in text  # solo scales down when its idle timeout lapses


def _draining_group() -> list[dict[str, object]]:
    """A shared group in the middle of a drain: low lost the card to high with one
    request in flight (docs/election.md 1.6); low's pod still serves it."""
    def model(name: str, priority: int, status: dict[str, object]) -> dict[str, object]:
        return {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": name},
            "spec": {"backend": "vllm", "source": f"HF://org/{name}",
                     "gpu": {"shared": "card", "priority": priority}},
            "status": status,
        }  # fmt: skip

    labels = {"app.kubernetes.io/managed-by": "flexinfer", "ai.flexinfer/model": "low"}
    return [
        model("low", 100, {
            "phase": "Draining", "lastActiveTime": "2026-12-01T11:59:50Z",
            "inFlight": {"count": 1, "reportedAt": "2026-12-01T11:59:58Z"},
            "sharedGroup": {"state": "Queued", "queuePosition": 1, "preemptedBy": "high",
                            "drainingSince": "2026-12-01T11:59:40Z"},
        }),
        model("high", 300, {
            "phase": "Idle", "lastActiveTime": "2026-12-01T11:59:59Z",
            "sharedGroup": {"state": "Active", "queuePosition": 0},
        }),
        {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "low", "namespace": "ai", "labels": labels,
                         "ownerReferences": [{"apiVersion": "ai.flexinfer/v1alpha2",
                                              "kind": "Model", "name": "low", "uid": "u",
                                              "controller": True}]},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}},
        },
        {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "low-1", "namespace": "ai", "labels": labels},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        },
    ]  # fmt: skip


def test_a_draining_member_is_shown_as_draining(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(_draining_group()))
    view = load_manifests([str(path)], namespace="ai")
    data = status_data(view, now=NOW, policy=DEFAULT_POLICY)
    (group,) = data["sharedGroups"]
    assert (group["holder"], group["reason"]) == ("high", "DemandPreemption")
    assert group["queue"] == [{"name": "low", "position": 1, "reason": "Draining"}]
    assert group["next"]["when"] == (
        "low's 1m drain timeout ends: it is scaled to 0 whatever is still in flight"
    )
    assert "low (draining)" in status_text(data, now=NOW, namespace="ai")


def _packed_group(budgets: dict[str, str]) -> list[dict[str, object]]:
    """Three Models of one budgeted group (docs/election.md 1.7), all asked for just now:
    chat leads, embed fits beside it, coder (16 GiB) does not."""
    sizes = {"chat": ("5632Mi", 300), "embed": ("4Gi", 200), "coder": ("16Gi", 100)}
    return [
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": name},
            "spec": {
                "backend": "vllm",
                "source": f"HF://org/{name}",
                "gpu": {"shared": "card", "priority": priority, "vramEstimate": size,
                        "vramBudget": budgets[name]},
            },
            "status": {"lastActiveTime": "2026-12-01T11:59:59Z"},
        }
        for name, (size, priority) in sizes.items()
    ]  # fmt: skip


def test_a_packed_group_shows_its_holders_and_the_budget_use(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    same = dict.fromkeys(("chat", "embed", "coder"), "24Gi")
    path.write_text(yaml.safe_dump_all(_packed_group(same)))
    view = load_manifests([str(path)], namespace="ai")
    # As for a controller started with --gpu-device-class (the cluster shares cards).
    data = status_data(view, now=NOW, policy=DEFAULT_POLICY, shared_card=True)
    (group,) = data["sharedGroups"]
    assert group["holders"] == ["chat", "embed"]
    assert group["vram"] == {
        "budgetBytes": 24 * 2**30,
        "usedBytes": 9728 * 2**20,
        "conflict": None,
        "sharedCard": True,
    }
    assert [q["name"] for q in group["queue"]] == ["coder"]
    text = status_text(data, now=NOW, namespace="ai")
    assert "9.5/24GiB:chat,embed" in text
    assert text.splitlines()[1].split()[:5] == ["GROUP", "HOLDER", "PHASE", "REASON", "VRAM"]


def test_a_budget_conflict_is_shown(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    budgets = {"chat": "24Gi", "embed": "16Gi", "coder": "24Gi"}
    path.write_text(yaml.safe_dump_all(_packed_group(budgets)))
    view = load_manifests([str(path)], namespace="ai")
    data = status_data(view, now=NOW, policy=DEFAULT_POLICY, shared_card=True)
    (group,) = data["sharedGroups"]
    assert group["holders"] == ["chat"]
    assert group["vram"]["budgetBytes"] is None
    assert "members disagree on spec.gpu.vramBudget" in group["vram"]["conflict"]
    assert " conflict " in status_text(data, now=NOW, namespace="ai")


def test_without_a_budget_the_table_is_as_before(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(_draining_group()))
    view = load_manifests([str(path)], namespace="ai")
    data = status_data(view, now=NOW, policy=DEFAULT_POLICY)
    assert data["sharedGroups"][0]["vram"] is None
    text = status_text(data, now=NOW, namespace="ai")
    assert "VRAM" not in text


def test_without_a_shared_card_a_budgeted_group_is_shown_one_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    same = dict.fromkeys(("chat", "embed", "coder"), "24Gi")
    path.write_text(yaml.safe_dump_all(_packed_group(same)))
    view = load_manifests([str(path)], namespace="ai")
    data = status_data(view, now=NOW, policy=DEFAULT_POLICY)  # no --gpu-device-class
    (group,) = data["sharedGroups"]
    assert group["holders"] == ["chat"]
    assert group["vram"]["sharedCard"] is False and group["vram"]["usedBytes"] is None
    assert [q["name"] for q in group["queue"]] == ["embed", "coder"]
    assert " one-at-a-time " in status_text(data, now=NOW, namespace="ai")
