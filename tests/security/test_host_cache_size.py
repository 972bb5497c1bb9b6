"""A node cache directory has a size bound: the policy's `hostCacheMaxSize` caps a
cache's `spec.storageSize`, and the download and the flash loader stop there. The
scripts run for real on small directories (bounds of a few KiB)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.cache import CacheImages, download_job, serving_mount
from flexinfer_k8s.render.cache_dir import (
    BUSY_MARKER,
    COMPLETE_MARKER,
    FLASH_LOADER_SCRIPT,
    REFUSED_EXIT_CODE,
    download_script,
)
from flexinfer_k8s.render.policy import AdminPolicy, admin_policy_from_yaml
from flexinfer_k8s.render.tenant_policy import cache_within_policy


def cache(**spec: Any) -> dict[str, Any]:
    body = {"source": "file:///var/lib/flexinfer/models/team-a/hand/model",
            "storageStrategy": "NodeLocal", "nodeSelector": {"kubernetes.io/hostname": "gpu-1"},
            **spec}
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "c", "namespace": "team-a", "uid": "u"}, "spec": body}


def kib_said(what: str, log: Path) -> int:
    """The KiB the script's `too large` report gives for `what` (du counts blocks)."""
    match = re.search(rf"flexinfer: too large: {what} (\d+) KiB", log.read_text())
    assert match, log.read_text()
    return int(match[1])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def test_a_node_caches_size_is_its_storage_size_within_the_administrators_bound() -> None:
    spec = cache_within_policy(cache(storageSize="50Gi"), AdminPolicy(), images=())
    assert spec.host_max_bytes == 50 * 1024**3
    container = download_job(spec, CacheImages())["spec"]["template"]["spec"]["containers"][0]
    assert env_of(container)["FLEXINFER_MAX_KIB"] == str(50 * 1024**2)
    with pytest.raises(InvalidFieldError) as raised:
        cache_within_policy(cache(storageSize="300Gi"), AdminPolicy(), images=())
    assert (raised.value.field, raised.value.value) == ("spec.storageSize", "300Gi")
    assert "hostCacheMaxSize" in str(raised.value) and "200Gi" in str(raised.value)
    larger = admin_policy_from_yaml("hostCacheMaxSize: 1Ti")
    assert cache_within_policy(cache(storageSize="300Gi"), larger, images=()).host_max_bytes


def test_a_claims_copy_is_bounded_by_its_claim_not_here() -> None:
    spec = cache_within_policy(cache(storageStrategy="SharedPVC", storageSize="10Ti"),
                               AdminPolicy(), images=())
    assert spec.host_max_bytes is None
    container = download_job(spec, CacheImages())["spec"]["template"]["spec"]["containers"][0]
    assert "FLEXINFER_MAX_KIB" not in env_of(container)


def test_the_memory_loader_is_told_the_bound() -> None:
    spec = cache_within_policy(cache(storageStrategy="Memory", storageSize="8Gi"),
                               AdminPolicy(), images=())
    (loader,) = serving_mount(spec, CacheImages()).init_containers
    assert env_of(loader)["FLEXINFER_MAX_KIB"] == str(8 * 1024**2)


def run_copy(tmp_path: Path, *, bound: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The download Job of a `file://` source, run as its pod would (the source's mount
    is its host directory), into a node directory bounded by `bound`."""
    spec = cache_within_policy(cache(storageSize=bound), AdminPolicy(), images=())
    container = download_job(spec, CacheImages())["spec"]["template"]["spec"]["containers"][0]
    sh, dash_c, script, name, _target, _log, source = container["command"]
    target = tmp_path / "node" / "c"
    env = {"PATH": os.environ["PATH"], **env_of(container)}
    result = subprocess.run(
        [sh, dash_c, script, name, str(target), str(tmp_path / "log"),
         source.replace("/source", str(tmp_path / "src"), 1)],
        capture_output=True, text=True, timeout=30, env=env)
    return result, target


def test_a_copy_larger_than_the_bound_is_refused_before_a_byte_is_written(
    tmp_path: Path,
) -> None:
    (tmp_path / "src" / "model").mkdir(parents=True)
    (tmp_path / "src" / "model" / "weights.bin").write_bytes(os.urandom(64 * 1024))
    result, target = run_copy(tmp_path, bound="16Ki")
    assert result.returncode == REFUSED_EXIT_CODE, result.stderr
    assert kib_said("the source is", tmp_path / "log") >= 64
    assert not (target / "model").exists()
    assert not (target / COMPLETE_MARKER).exists()
    result, target = run_copy(tmp_path, bound="1Mi")
    assert result.returncode == 0, result.stderr
    assert (target / "model" / "weights.bin").stat().st_size == 64 * 1024
    assert (target / COMPLETE_MARKER).exists() and not (target / BUSY_MARKER).exists()


def test_a_download_that_grows_past_the_bound_is_removed_and_never_marked(
    tmp_path: Path,
) -> None:
    """What no source can be measured for beforehand (an Ollama pull): the script checks
    the copy before its completion marker."""
    script = download_script('head -c 65536 /dev/urandom > "$target/blob"\n')
    target = tmp_path / "node" / "c"
    result = subprocess.run(
        ["sh", "-c", script, "download", str(target), str(tmp_path / "log")],
        capture_output=True, text=True, timeout=30,
        env={"PATH": os.environ["PATH"], "FLEXINFER_SOURCE": "ollama://x",
             "FLEXINFER_MAX_KIB": "16"})
    assert result.returncode == REFUSED_EXIT_CODE, result.stderr
    assert kib_said("the copy is", tmp_path / "log") >= 64
    assert not (target / "blob").exists() and not (target / COMPLETE_MARKER).exists()


def test_the_flash_loader_refuses_a_copy_larger_than_the_memory_bound(tmp_path: Path) -> None:
    source, ram = tmp_path / "backing", tmp_path / "ram"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(64 * 1024))
    (source / COMPLETE_MARKER).write_text("file:///x\n")
    script = FLASH_LOADER_SCRIPT.replace("/cache-source", str(source))

    def load(kib: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", script, "flash-loader", str(ram)],
                              capture_output=True, text=True, timeout=30,
                              env={"PATH": os.environ["PATH"], "FLEXINFER_MAX_KIB": str(kib)})

    refused = load(16)
    assert refused.returncode == 1 and "more than the cache's 16 KiB" in refused.stderr
    assert not (ram / "weights.bin").exists()
    assert load(1024).returncode == 0
    assert (ram / "weights.bin").stat().st_size == 64 * 1024
