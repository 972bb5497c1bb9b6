"""`flexinfer doctor`: one fixture per check on the local control plane.

Each fixture builds, in a fresh namespace, the situation the docs' troubleshooting
case describes; doctor must fail that check (exit 1), name the object and give the
fix, and leave the other checks alone. A healthy namespace passes (exit 0).
"""

# The fixtures come from tests/k8s/harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_cli.__main__ import main
from flexinfer_core.timestamps import format_rfc3339
from flexinfer_kube.resources import (
    EVENTS,
    GPU_LEASES,
    MODEL_CACHES,
    MODELS,
    SERVICE_ACCOUNTS,
)
from tests.k8s.harness import (  # noqa: F401  (fixtures)
    Cluster,
    cluster,
    controller,
    crds,
    kubectl,
)

pytestmark = pytest.mark.k8s


def doctor(
    c: Cluster, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, dict[str, Any]]:
    code = main(
        [
            "doctor",
            "--kubeconfig",
            str(c.local.kubeconfig),
            "-n",
            c.namespace,
            "-o",
            "json",
            # Only this namespace's ServiceAccount is asked about unless a test says so.
            "--proxy-service-account",
            f"{c.namespace}/no-proxy-here",
            *args,
        ]
    )
    return code, json.loads(capsys.readouterr().out)


def findings(data: dict[str, Any], check: str) -> list[dict[str, Any]]:
    (found,) = [c for c in data["checks"] if c["check"] == check]
    return list(found["findings"])


def failing(data: dict[str, Any]) -> set[str]:
    return {c["check"] for c in data["checks"] if c["status"] == "fail"}


def model_cache(c: Cluster, name: str, **spec: Any) -> dict[str, Any]:
    return c.api.create(
        MODEL_CACHES,
        c.namespace,
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "ModelCache",
            "metadata": {"name": name},
            "spec": {"source": f"HF://org/{name}", **spec},
        },
    )


def lease(
    c: Cluster, name: str, *, owner_refs: list[dict[str, Any]] | None = None, **spec: Any
) -> None:
    metadata: dict[str, Any] = {"name": name}
    if owner_refs:
        metadata["ownerReferences"] = owner_refs
    c.api.create(
        GPU_LEASES,
        c.namespace,
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "GPULease",
            "metadata": metadata,
            "spec": spec,
        },
    )


def test_a_healthy_namespace_passes(
    local_cluster: object, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    # A healthy cluster's GPU nodes carry the vendor label (check gpu-node-label).
    main(["nodes", "label", "--apply", "--kubeconfig", str(c.local.kubeconfig)])
    capsys.readouterr()
    c.add_model("a")
    c.add_model("b")
    c.demand("a")
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        c.wait_serving("a")
        code, data = doctor(
            c,
            capsys,
            "--demand-window",
            "4s",
            "--recent-window",
            "6s",
            "--default-swap-cooldown",
            "3s",
        )
    assert code == 0, data
    assert {c["status"] for c in data["checks"]} == {"ok"}
    main(["doctor", "--kubeconfig", str(c.local.kubeconfig), "-n", c.namespace])
    out = capsys.readouterr().out
    assert "ok    priority-gate: every model can win its group's card" in out
    assert out.rstrip().endswith("0 failed, 0 warning(s)")


def test_runnable_member(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster
    for name in ("a", "b"):
        body = {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": name},
            "spec": {
                "backend": "vllm",
                "source": f"HF://org/{name}",
                "gpu": {"shared": "g"},
                "cache": {"modelCacheRef": "missing"},
            },
        }
        c.api.create(MODELS, c.namespace, body)
    code, data = doctor(c, capsys, "--grace", "1h")
    assert code == 1
    (finding,) = findings(data, "runnable-member")
    assert finding["object"] == "group/g"
    assert "a (cache not ready), b (cache not ready)" in finding["message"]
    assert "flexinfer cache status" in finding["fix"]
    assert failing(data) == {"runnable-member"}


def test_priority_gate(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster
    c.add_model("chat", priority=200, min_replicas=1)
    c.add_model("coder", priority=100)
    code, data = doctor(c, capsys, "--grace", "1h")
    assert code == 1
    (finding,) = findings(data, "priority-gate")
    assert finding["object"] == "model/coder"
    assert "chat (priority 200) runs without demand (minReplicas 1)" in finding["message"]
    assert finding["fix"] == (
        "Raise coder's spec.gpu.priority above 200, or set chat's spec.serverless.minReplicas "
        "to 0 so it yields when idle."
    )
    assert failing(data) == {"priority-gate"}


def test_swap_loop(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster
    c.add_model("a", swap_cooldown="0s")
    c.add_model("b", swap_cooldown="0s")
    now = datetime.now(UTC).replace(microsecond=0)
    for i in range(7):
        name = "a" if i % 2 else "b"
        model = c.model(name)
        stamp = format_rfc3339(now - timedelta(minutes=i))
        c.api.create(
            EVENTS,
            c.namespace,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{name}.swap{i}"},
                "involvedObject": {
                    "apiVersion": "ai.flexinfer/v1alpha2",
                    "kind": "Model",
                    "name": name,
                    "namespace": c.namespace,
                    "uid": model["metadata"]["uid"],
                },
                # One Event a handover: Preempted on the member that was serving,
                # Promoted on the new holder when none was.
                "reason": "Preempted" if i % 3 else "Promoted",
                "message": f"{name} was preempted" if i % 3 else f"{name} holds the GPU",
                "type": "Warning" if i % 3 else "Normal",
                "source": {"component": "flexinfer-controller"},
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            },
        )
    code, data = doctor(c, capsys, "--grace", "1h")
    assert code == 1
    (finding,) = findings(data, "swap-loop")
    assert (finding["object"], finding["message"]) == ("group/g", "swapped 7 times in the last 30m")
    assert "swapCooldown" in finding["fix"]
    # Fewer swaps than the threshold is no loop.
    code, data = doctor(c, capsys, "--grace", "1h", "--max-swaps", "8")
    assert findings(data, "swap-loop") == []


def test_lease_owner(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster
    cache = model_cache(c, "ft")
    owner = {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelCache",
        "name": "ft",
        "uid": cache["metadata"]["uid"],
    }
    lease(c, "ft-gpu-lease", owner_refs=[owner], group="g", owner="ft")
    past = format_rfc3339(datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1))
    lease(c, "old", group="g", owner="alice", expiresAt=past)
    lease(c, "forever", group="h", owner="bob")
    code, data = doctor(c, capsys)
    assert code == 1
    found = {f["object"]: f for f in findings(data, "lease-owner")}
    assert set(found) == {"gpulease/ft-gpu-lease", "gpulease/old", "gpulease/forever"}
    assert found["gpulease/ft-gpu-lease"]["severity"] == "fail"
    assert (
        "finetune Job ft-finetune (ModelCache ft) does not exist"
        in found["gpulease/ft-gpu-lease"]["message"]
    )
    assert found["gpulease/old"]["severity"] == "warn"
    assert "never released" in found["gpulease/old"]["message"]
    assert found["gpulease/forever"]["severity"] == "warn"
    assert "--ttl" in found["gpulease/forever"]["fix"]


def test_memory_cache(cluster: Cluster, kubectl: Any, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster
    model_cache(
        c, "unused", storageStrategy="Memory", nodeSelector={"kubernetes.io/hostname": "n1"}
    )
    model_cache(
        c, "broken", storageStrategy="Memory", nodeSelector={"kubernetes.io/hostname": "n1"}
    )
    kubectl.patch_status(
        c.namespace,
        "modelcache/broken",
        {"status": {"phase": "Failed", "message": "401 Unauthorized"}},
    )
    code, data = doctor(c, capsys)
    assert code == 1
    found = {f["object"]: f for f in findings(data, "memory-cache")}
    assert found["modelcache/unused"]["severity"] == "warn"
    assert "/dev/shm/flexinfer/" in found["modelcache/unused"]["message"]
    assert "rm -rf" in found["modelcache/unused"]["fix"]
    assert found["modelcache/broken"]["severity"] == "fail"
    assert "401 Unauthorized" in found["modelcache/broken"]["message"]


def test_demand_never_reaching_the_controller(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    c.add_model("a")
    c.demand("a")
    # No controller runs: nothing ever writes the status.
    code, data = doctor(c, capsys, "--grace", "0s")
    assert code == 1
    found = findings(data, "demand-reaches-controller")
    assert {f["object"] for f in found} == {"model/a"}
    messages = sorted(f["message"] for f in found)
    assert messages[0].startswith("demanded at ")
    assert messages[0].endswith(
        "but the controller has not acted: it should be Active with 1 replica(s) (RecentDemand)"
    )
    assert messages[1] == "the controller has never written this Model's status"
    assert all("flexinfer-controller" in f["fix"] for f in found)
    # Within the grace the controller is given time: no finding.
    code, data = doctor(c, capsys, "--grace", "1h")
    assert (code, findings(data, "demand-reaches-controller")) == (0, [])


def test_a_proxy_not_allowed_to_record_demand(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    c.api.create(
        SERVICE_ACCOUNTS,
        c.namespace,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "proxy"}},
    )
    c.add_model("a")
    code, data = doctor(
        c, capsys, "--grace", "1h", "--proxy-service-account", f"{c.namespace}/proxy"
    )
    assert code == 1
    found = findings(data, "demand-reaches-controller")
    assert {f["object"] for f in found} == {"serviceaccount/proxy"}
    assert any("may not patch models/status" in f["message"] for f in found)
    assert "kubectl apply -k deploy/" in found[0]["fix"]
