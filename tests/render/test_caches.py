"""ModelCache storage: claims, download Jobs, serving mounts, the flash loader (run for
real with /bin/sh on temporary directories) and the finetune Job."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.cache import (
    COMPLETE_MARKER,
    FLASH_LOADER_SCRIPT,
    CacheImages,
    cache_from_k8s,
    claim_manifest,
    download_job,
)
from flexinfer_k8s.render.finetune import finetune_job
from tests.render.test_backends import cache, model, pod, render, server

IMAGES = CacheImages()


def test_shared_pvc_creates_an_owned_rwx_claim_of_the_storage_size() -> None:
    spec = cache_from_k8s(cache("c", storageSize="20Gi"))
    claim = claim_manifest(spec)
    assert claim is not None
    assert claim["metadata"]["name"] == "c-models"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"] == {"requests": {"storage": "20Gi"}}
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "ModelCache"
    assert spec.path == "pvc://c-models/c"


def test_an_existing_claim_is_used_and_none_is_created() -> None:
    spec = cache_from_k8s(cache("c", existingClaimName="nfs-models", modelPath="qwen/7b"))
    assert claim_manifest(spec) is None
    assert spec.path == "pvc://nfs-models/qwen/7b"


def test_no_claim_for_strategies_that_do_not_use_one() -> None:
    selector = {"kubernetes.io/hostname": "n1"}
    for strategy in ("NodeLocal", "Memory"):
        spec = cache_from_k8s(cache("c", storageStrategy=strategy, nodeSelector=selector))
        assert claim_manifest(spec) is None


def test_node_local_needs_a_node() -> None:
    with pytest.raises(InvalidFieldError, match=r"nodeSelector: \{\} is required for NodeLocal"):
        cache_from_k8s(cache("c", storageStrategy="NodeLocal"))


def test_serving_pods_mount_each_strategy_and_pin_to_node_bound_copies() -> None:
    selector = {"kubernetes.io/hostname": "n1"}
    for strategy, volume in (
        ("SharedPVC", {"persistentVolumeClaim": {"claimName": "c-models", "readOnly": True}}),
        ("NodeLocal", {"hostPath": {"path": "/var/lib/flexinfer/models/ns/c",
                                    "type": "Directory"}}),
        ("Memory", {"hostPath": {"path": "/dev/shm/flexinfer/ns/c",
                                 "type": "DirectoryOrCreate"}}),
    ):
        rendered = render(
            model(backend="vllm", cache={"modelCacheRef": "c"}),
            cache("c", storageStrategy=strategy, nodeSelector=selector),
        )
        p = pod(rendered)
        volumes = {v["name"]: v for v in p["volumes"]}
        assert {k: v for k, v in volumes["model-cache"].items() if k != "name"} == volume
        mount = next(m for m in server(rendered)["volumeMounts"] if m["name"] == "model-cache")
        assert mount["mountPath"] == "/models/c" and mount["readOnly"] is True
        assert server(rendered)["args"][1] == "/models/c"
        if strategy == "SharedPVC":
            assert "nodeSelector" not in p
            assert mount["subPath"] == "c"
        else:
            assert p["nodeSelector"] == selector


def test_a_memory_pod_fills_its_ram_copy_with_the_flash_loader_first() -> None:
    rendered = render(
        model(cache={"modelCacheRef": "ram"}),
        cache("ram", storageStrategy="Memory", nodeSelector={"kubernetes.io/hostname": "n1"}),
    )
    p = pod(rendered)
    (loader,) = p["initContainers"]
    assert loader["name"] == "flash-loader"
    assert loader["image"] == "busybox:1.36"
    assert loader["command"][-1] == "/models/ram"
    mounts = {m["mountPath"]: m for m in loader["volumeMounts"]}
    assert mounts["/cache-source"]["readOnly"] is True
    assert "readOnly" not in mounts["/models/ram"]
    volumes = {v["name"]: v for v in p["volumes"]}
    assert volumes["cache-source"]["hostPath"]["path"] == "/var/lib/flexinfer/models/ns/ram"


def test_a_cache_on_another_node_than_the_model_asks_for_is_refused() -> None:
    with pytest.raises(InvalidFieldError, match=r"spec.nodeSelector\[kubernetes.io/hostname\]"):
        render(
            model(cache={"modelCacheRef": "c"}, nodeSelector={"kubernetes.io/hostname": "a"}),
            cache("c", storageStrategy="NodeLocal", nodeSelector={"kubernetes.io/hostname": "b"}),
        )


# --- the flash loader, for real --------------------------------------------------------


def load(source: Path, target: Path) -> subprocess.CompletedProcess[str]:
    script = FLASH_LOADER_SCRIPT.replace("/cache-source", str(source))
    return subprocess.run(["sh", "-c", script, "flash-loader", str(target)],
                          capture_output=True, text=True, timeout=30)


def test_the_flash_loader_copies_changes_deletes_stale_files_and_marks_last(
    tmp_path: Path,
) -> None:
    source, target = tmp_path / "source", tmp_path / "ram"
    (source / "sub").mkdir(parents=True)
    (source / "weights.bin").write_bytes(b"new weights")
    (source / "sub" / "tokenizer.json").write_text("{}")
    (source / COMPLETE_MARKER).touch()
    # A stale copy of an earlier model: a shard the source no longer has, and a file
    # of the same name and size but older.
    target.mkdir()
    (target / "old-shard.bin").write_bytes(b"stale")
    (target / "weights.bin").write_bytes(b"old weights")
    os.utime(target / "weights.bin", (1, 1))
    (target / COMPLETE_MARKER).touch()

    result = load(source, target)
    assert result.returncode == 0, result.stderr
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == [
        COMPLETE_MARKER, "sub/tokenizer.json", "weights.bin",
    ]
    assert (target / "weights.bin").read_bytes() == b"new weights"
    # The marker is the newest file: written after every copy.
    newest = max((p for p in target.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime_ns)
    assert newest.name == COMPLETE_MARKER


def test_the_flash_loader_skips_unchanged_files(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "ram"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"w" * 1000)
    (source / COMPLETE_MARKER).touch()
    assert load(source, target).returncode == 0
    inode = (target / "weights.bin").stat().st_ino
    assert load(source, target).returncode == 0
    assert (target / "weights.bin").stat().st_ino == inode  # not copied again


def test_the_flash_loader_refuses_an_incomplete_backing_copy(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "ram"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"half")
    result = load(source, target)
    assert result.returncode != 0
    assert "incomplete" in result.stderr
    assert not (target / COMPLETE_MARKER).exists()


# --- download Jobs ------------------------------------------------------------------


def job_container(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize(
    ("source", "image", "fragment"),
    [
        ("HF://org/repo", "python:3.12-slim", "snapshot_download"),
        ("file:///srv/models/qwen", "busybox:1.36", "cp -a /source/qwen /target/"),
        ("pvc://models/qwen/7b", "busybox:1.36", "cp -a /source/qwen/7b /target/"),
        ("pvc://models", "busybox:1.36", "cp -a /source/. /target/"),
        ("ollama://llama3.2:1b", "ollama/ollama:latest", "ollama pull llama3.2:1b"),
    ],
)
def test_one_download_job_per_scheme_writes_the_marker_last(
    source: str, image: str, fragment: str
) -> None:
    spec = cache_from_k8s(cache("c", source=source))
    job = download_job(spec, IMAGES)
    container = job_container(job)
    assert container["image"] == image
    script = container["command"][-1]
    assert fragment in script
    # The marker goes first, then any earlier copy: a new source never mixes with old files.
    assert script.startswith(
        f"set -eu; rm -f /target/{COMPLETE_MARKER}; find /target -mindepth 1 -delete;"
    )
    assert script.endswith(f"touch /target/{COMPLETE_MARKER}")
    assert job["metadata"]["name"] == "c-download"
    assert job["metadata"]["ownerReferences"][0]["name"] == "c"


def test_the_download_image_is_overridable_per_cache() -> None:
    spec = cache_from_k8s(cache("c", downloadImage="mirror.local/hf:1"))
    assert job_container(download_job(spec, IMAGES))["image"] == "mirror.local/hf:1"


def test_a_node_local_download_writes_on_the_cache_node() -> None:
    spec = cache_from_k8s(cache("c", storageStrategy="NodeLocal",
                                nodeSelector={"kubernetes.io/hostname": "n1"}))
    job = download_job(spec, IMAGES)
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    target = next(v for v in pod_spec["volumes"] if v["name"] == "target")
    assert target["hostPath"] == {"path": "/var/lib/flexinfer/models/ns/c",
                                  "type": "DirectoryOrCreate"}


# --- finetune -------------------------------------------------------------------------


def test_the_finetune_job_carries_the_training_settings_and_the_cache() -> None:
    obj = cache("ft", storageStrategy="NodeLocal", nodeSelector={"kubernetes.io/hostname": "n1"},
                finetune={"mode": "lora", "dataset": "file:///data/tickets.jsonl",
                          "epochs": 2, "batchSize": 8, "learningRate": "1e-4",
                          "maxSeqLen": 4096, "timeoutSeconds": 3600,
                          "image": "trainer:1"})
    job = finetune_job(cache_from_k8s(obj), obj, default_image="")
    pod_spec = job["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {
        "FLEXINFER_FINETUNE_MODE": "lora",
        "FLEXINFER_BASE_MODEL": "/cache",
        "FLEXINFER_DATASET": "/dataset/tickets.jsonl",
        "FLEXINFER_EPOCHS": "2",
        "FLEXINFER_BATCH_SIZE": "8",
        "FLEXINFER_LEARNING_RATE": "1e-4",
        "FLEXINFER_MAX_SEQ_LEN": "4096",
        "FLEXINFER_OUTPUT_DIR": "/cache/finetune-output",
    }
    assert container["resources"]["limits"] == {"amd.com/gpu": "1"}
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    assert job["spec"]["backoffLimit"] == 0
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"/cache", "/dataset/tickets.jsonl", "/dev/shm"}
    assert pod_spec["securityContext"] == {"supplementalGroups": [44, 109]}  # ROCm devices


def test_a_finetune_without_a_trainer_image_says_what_to_set() -> None:
    obj = cache("ft", finetune={"mode": "qlora"})
    with pytest.raises(InvalidFieldError, match=r"spec.finetune.image.*--finetune-image"):
        finetune_job(cache_from_k8s(obj), obj, default_image="")
