"""`python -m flexinfer_devcluster.devcluster up --detach | env | down`, as a person runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flexinfer_devcluster.assets import ENV_ASSETS, ENV_CACHE, ensure_assets
from flexinfer_devcluster.localcluster import processes_mentioning

pytestmark = pytest.mark.k8s


def _devcluster(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flexinfer_devcluster.devcluster", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def test_up_env_down(tmp_path: Path) -> None:
    env = dict(os.environ)
    env[ENV_ASSETS] = str(ensure_assets(build=False))
    env[ENV_CACHE] = str(tmp_path / "cache")  # a private state file

    started = _devcluster("up", "--detach", "--nodes", "1", "--gpus", "2", env=env)
    assert started.returncode == 0, started.stderr
    state = json.loads((tmp_path / "cache" / "devcluster" / "state.json").read_text())
    try:
        assert started.stdout.strip() == f"export KUBECONFIG={state['kubeconfig']}"
        assert _devcluster("env", env=env).stdout == started.stdout

        kubectl = Path(env[ENV_ASSETS]) / "kubectl"
        nodes = subprocess.run(
            [str(kubectl), "get", "nodes", "-o", "json"],
            capture_output=True,
            text=True,
            env={**env, "KUBECONFIG": state["kubeconfig"]},
            timeout=60,
            check=True,
        )
        allocatable = {
            node["metadata"]["name"]: node["status"]["allocatable"]
            for node in json.loads(nodes.stdout)["items"]
        }
        # One GPU node of two GPUs, and the untainted CPU node beside it.
        assert sorted(allocatable) == ["kwok-cpu-0", "kwok-gpu-0"]
        assert allocatable["kwok-gpu-0"]["amd.com/gpu"] == "2"
        assert "amd.com/gpu" not in allocatable["kwok-cpu-0"]

        again = _devcluster("up", "--detach", env=env)
        assert again.returncode == 0 and again.stdout == started.stdout, "one dev cluster at a time"
    finally:
        stopped = _devcluster("down", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert processes_mentioning(state["workdir"]) == []
    assert not Path(state["workdir"]).exists()
    assert _devcluster("env", env=env).returncode == 1
