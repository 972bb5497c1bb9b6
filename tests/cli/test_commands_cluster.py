"""`flexinfer status [-w]`, `leases`, `lease acquire|release`, `cache status` and the
`kubectl flexinfer` plugin on the local control plane, with their columns, `-o json`
shapes and exit codes.
"""

# The fixtures come from tests/k8s/harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from flexinfer_cli.__main__ import main
from flexinfer_core.timestamps import parse_rfc3339
from flexinfer_kube.kubeapi import NotFound
from flexinfer_kube.resources import GPU_LEASES, MODEL_CACHES
from tests.k8s.harness import (  # noqa: F401  (fixtures)
    Cluster,
    cluster,
    controller,
    crds,
    kubectl,
)
from tests.k8s.kubectl import Kubectl
from tests.polling import wait_until

pytestmark = pytest.mark.k8s

BIN = Path(sys.executable).parent


def cli(c: Cluster, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*args, "--kubeconfig", str(c.local.kubeconfig), "-n", c.namespace])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_json(c: Cluster, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = cli(c, capsys, *args, "-o", "json")
    assert code == 0, err
    return json.loads(out)


def table(out: str, title: str) -> list[list[str]]:
    """The rows (header first) of the table under `title` in a status block."""
    lines = out.splitlines()
    start = lines.index(title) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def test_status_shows_groups_not_objects(
    local_cluster: object, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    c.add_model("a", priority=200)
    c.add_model("b", priority=100)
    c.demand("a")
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        c.wait_serving("a")
        data = cli_json(c, capsys, "status", "--demand-window", "4s", "--recent-window", "6s")
        code, out, _ = cli(c, capsys, "status")
    (group,) = data["sharedGroups"]
    assert (group["group"], group["holder"], group["phase"]) == ("g", "a", "Ready")
    assert [q["name"] for q in group["queue"]] == ["b"]
    assert group["lease"] is None
    assert {"cooldownEndsAt", "reason", "message", "next"} <= set(group)
    # What the controller wrote agrees (the shaping the proxy's live page shows).
    (recorded,) = data["recorded"]
    assert (recorded["name"], recorded["holder"], recorded["reason"]) == ("g", "a", "ReadyLeader")
    assert [m["name"] for m in recorded["members"]] == ["a", "b"]
    assert code == 0
    header, row = table(out, "Shared groups:")
    assert header == ["GROUP", "HOLDER", "PHASE", "REASON", "QUEUE", "COOLDOWN", "LEASE", "NEXT"]
    assert row[:5] == ["g", "a", "Ready", "ReadyLeader", "b"]


def test_status_of_an_empty_namespace(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(cluster, capsys, "status")
    assert code == 0
    assert out.strip() == f"No flexinfer resources found in {cluster.namespace} namespace."


def test_status_watch_prints_a_block_per_change(local_cluster: object, cluster: Cluster) -> None:
    c = cluster
    c.add_model("a")
    c.demand("a")
    lines: queue.Queue[str] = queue.Queue()
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        c.wait_serving("a")
        process = subprocess.Popen(
            [
                str(BIN / "flexinfer"),
                "status",
                "-w",
                "--kubeconfig",
                str(c.local.kubeconfig),
                "-n",
                c.namespace,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        reader = threading.Thread(
            target=lambda: [lines.put(line) for line in process.stdout or []], daemon=True
        )
        reader.start()
        try:
            seen: list[str] = []

            def saw(text: str) -> bool:
                while not lines.empty():
                    seen.append(lines.get())
                return any(text in line for line in seen)

            wait_until(lambda: saw("ReadyLeader"), what="the first block, with holder a")
            blocks = sum(1 for line in seen if line.startswith("--- "))
            c.api.create(
                GPU_LEASES,
                c.namespace,
                {
                    "apiVersion": "ai.flexinfer/v1alpha2",
                    "kind": "GPULease",
                    "metadata": {"name": "maint"},
                    "spec": {"group": "g", "owner": "alice"},
                },
            )
            wait_until(lambda: saw("maint(alice,no-ttl)"), what="a block showing the lease")
            assert sum(1 for line in seen if line.startswith("--- ")) > blocks
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0


def test_lease_acquire_parks_the_group_and_release_frees_it(
    local_cluster: object, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    c.add_model("a")
    c.demand("a")
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        c.wait_serving("a")
        code, out, err = cli(c, capsys, "lease", "acquire", "g", "--owner", "alice", "--ttl", "30m")
        assert code == 0, err
        assert out.startswith("gpulease/g-alice held by alice on group g until ")
        assert "parks: a" in out
        lease = c.api.get(GPU_LEASES, c.namespace, "g-alice")
        assert lease["spec"]["owner"] == "alice"
        assert parse_rfc3339(lease["spec"]["expiresAt"]) is not None
        c.wait_parked("a")
        assert c.status("a")["sharedGroup"]["preemptedBy"] == "gpu-lease/alice"

        code, out, _ = cli(c, capsys, "leases")
        header, row = [line.split() for line in out.strip().splitlines()]
        assert header == ["NAME", "GROUP", "OWNER", "NODE", "EXPIRES", "AGE"]
        assert row[:3] == ["g-alice", "g", "alice"] and row[4] == lease["spec"]["expiresAt"]
        items = cli_json(c, capsys, "leases")["items"]
        assert [(i["name"], i["active"], i["source"]) for i in items] == [
            ("g-alice", True, "GPULease")
        ]

        # The same owner refreshes it; someone else is told who holds it.
        assert cli(c, capsys, "lease", "acquire", "g", "--owner", "alice", "--ttl", "1h")[0] == 0
        code, _, err = cli(
            c, capsys, "lease", "acquire", "g", "--owner", "bob", "--name", "g-alice"
        )
        assert code == 1 and "held by alice" in err

        code, out, _ = cli(c, capsys, "lease", "release", "g", "--owner", "alice")
        assert (code, out.strip()) == (0, "gpulease/g-alice released (group g)")
        with pytest.raises(NotFound):
            c.api.get(GPU_LEASES, c.namespace, "g-alice")
        c.demand("a")
        c.wait_serving("a")
        code, _, err = cli(c, capsys, "lease", "release", "g", "--owner", "alice")
        assert code == 1 and "no GPU lease on group g held by alice" in err


def test_a_finetune_lease_is_released_only_with_force(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    cache = c.api.create(
        MODEL_CACHES,
        c.namespace,
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "ModelCache",
            "metadata": {"name": "ft"},
            "spec": {"source": "HF://org/base"},
        },
    )
    owner = {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelCache",
        "name": "ft",
        "uid": cache["metadata"]["uid"],
    }
    c.api.create(
        GPU_LEASES,
        c.namespace,
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "GPULease",
            "metadata": {"name": "ft-gpu-lease", "ownerReferences": [owner]},
            "spec": {"group": "g", "owner": "ft"},
        },
    )
    code, _, err = cli(c, capsys, "lease", "release", "g")
    assert code == 1 and "owned by a ModelCache" in err and "--force" in err
    assert cli(c, capsys, "lease", "release", "g", "--force")[0] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["lease", "acquire", "g", "--owner", "x", "--ttl", "0s"], "--ttl: must be more than 0"),
        (["lease", "acquire", "g", "--owner", "x", "--ttl", "soon"], "--ttl"),
    ],
)
def test_lease_bad_usage(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = cli(cluster, capsys, *args)
    assert code == 2 and message in err


def test_cache_status(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster
    for name, strategy in (("ram", "Memory"), ("shared", "SharedPVC")):
        c.api.create(
            MODEL_CACHES,
            c.namespace,
            {
                "apiVersion": "ai.flexinfer/v1alpha1",
                "kind": "ModelCache",
                "metadata": {"name": name},
                "spec": {
                    "source": f"HF://org/{name}",
                    "storageStrategy": strategy,
                    "nodeSelector": {"kubernetes.io/hostname": "n1"},
                },
            },
        )
    code, out, _ = cli(c, capsys, "cache", "status")
    assert code == 0
    header, *rows = [line.split() for line in out.strip().splitlines()]
    assert header == ["NAME", "STRATEGY", "PATH", "READY", "SOURCE"]
    assert [(r[0], r[1], r[-2], r[-1]) for r in rows] == [
        ("ram", "Memory", "false", "HF://org/ram"),
        ("shared", "SharedPVC", "false", "HF://org/shared"),
    ]
    code, out, _ = cli(c, capsys, "cache", "status", "-o", "wide")
    assert out.splitlines()[0].split()[5:] == ["PHASE", "JOB", "USED", "BY", "MESSAGE"]
    items = cli_json(c, capsys, "cache", "status")["items"]
    assert {"name", "strategy", "path", "ready", "source", "usedBy"} <= set(items[0])


def test_kubectl_flexinfer_plugin(
    cluster: Cluster, kubectl: Kubectl, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    c.add_model("a")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}

    def plugin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                kubectl.binary,
                "flexinfer",
                *args,
                "--kubeconfig",
                kubectl.kubeconfig,
                "-n",
                c.namespace,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )

    listed = subprocess.run(
        [kubectl.binary, "plugin", "list"], capture_output=True, text=True, env=env, check=False
    )
    assert "kubectl-flexinfer" in listed.stdout
    result = plugin("explain", "model/a", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["members"][0]["name"] == "a"
    bad = plugin("explain", "pod/a")
    assert bad.returncode == 2
    assert bad.stderr.startswith("kubectl flexinfer: ")
    missing = plugin("explain", "model/nobody")
    assert missing.returncode == 1


def test_no_cluster_is_a_failure_with_what_to_do(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["status", "--kubeconfig", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 1
    assert "no cluster to talk to" in err and "--kubeconfig" in err
