"""ModelCache storage: claims, download Jobs, serving mounts, the flash loader and the
download and cleanup scripts (run for real with /bin/sh on temporary directories) and
the finetune Job."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.cache import (
    CacheImages,
    cache_from_k8s,
    claim_manifest,
    cleanup_job,
    download_job,
    serving_mount,
)
from flexinfer_k8s.render.cache_dir import (
    BUSY_MARKER,
    COMPLETE_MARKER,
    FLASH_LOADER_SCRIPT,
    REFUSED_EXIT_CODE,
    DirResult,
    parse_result,
)
from flexinfer_k8s.render.finetune import finetune_job, finetune_volumes
from flexinfer_k8s.render.local_volume import host_path_type
from flexinfer_k8s.render.policy import AdminPolicy
from tests.render.host_dirs import host_dir, node_terms
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
    for strategy, where in (
        ("SharedPVC", None),
        ("NodeLocal", "/var/lib/flexinfer/models/ns/c"),
        ("Memory", "/dev/shm/flexinfer/ns/c"),
    ):
        cache_obj = cache("c", storageStrategy=strategy, nodeSelector=selector)
        rendered = render(model(backend="vllm", cache={"modelCacheRef": "c"}), cache_obj)
        p = pod(rendered)
        volumes = {v["name"]: v for v in p["volumes"]}
        mount = next(m for m in server(rendered)["volumeMounts"] if m["name"] == "model-cache")
        assert mount["mountPath"] == "/models/c" and mount["readOnly"] is True
        assert server(rendered)["args"][1] == "/models/c"
        assert all("hostPath" not in v for v in p["volumes"])
        if where is None:
            assert volumes["model-cache"]["persistentVolumeClaim"] == {
                "claimName": "c-models", "readOnly": True}
            assert "nodeSelector" not in p
            assert mount["subPath"] == "c"
        else:
            # The node directory through the namespace's `local` volume on n1.
            needed = cache_from_k8s(cache_obj).host_volumes(AdminPolicy())
            assert host_dir(volumes["model-cache"], mount, needed) == where
            assert all(node_terms(v) == [("kubernetes.io/hostname", "In", ["n1"])]
                       for v in needed)
            assert p["nodeSelector"] == selector


def test_a_memory_pod_fills_its_ram_copy_with_the_flash_loader_first() -> None:
    rendered = render(
        model(cache={"modelCacheRef": "ram"}),
        cache("ram", storageStrategy="Memory", nodeSelector={"kubernetes.io/hostname": "n1"}),
    )
    p = pod(rendered)
    # The RAM copy is filled first; the /models layout links it afterwards.
    loader, layout = p["initContainers"]
    assert layout["name"] == "models-layout"
    assert loader["name"] == "flash-loader"
    assert loader["image"] == "busybox:1.36"
    assert loader["command"][-1] == "/models/ram"
    mounts = {m["mountPath"]: m for m in loader["volumeMounts"]}
    assert mounts["/cache-source"]["readOnly"] is True
    assert "readOnly" not in mounts["/models/ram"]
    volumes = {v["name"]: v for v in p["volumes"]}
    needed = cache_from_k8s(
        cache("ram", storageStrategy="Memory", nodeSelector={"kubernetes.io/hostname": "n1"})
    ).host_volumes(AdminPolicy())
    assert host_dir(volumes["cache-source"], mounts["/cache-source"], needed) == (
        "/var/lib/flexinfer/models/ns/ram")
    assert host_dir(volumes["model-cache"], mounts["/models/ram"], needed) == (
        "/dev/shm/flexinfer/ns/ram")


def test_a_cache_on_another_node_than_the_model_asks_for_is_refused() -> None:
    with pytest.raises(InvalidFieldError, match=r"spec.nodeSelector\[kubernetes.io/hostname\]"):
        render(
            model(cache={"modelCacheRef": "c"}, nodeSelector={"kubernetes.io/hostname": "a"}),
            cache("c", storageStrategy="NodeLocal", nodeSelector={"kubernetes.io/hostname": "b"}),
        )


# --- the flash loader, for real --------------------------------------------------------


def load(source: Path, target: Path, *trust: str) -> subprocess.CompletedProcess[str]:
    script = FLASH_LOADER_SCRIPT.replace("/cache-source", str(source))
    return subprocess.run(["sh", "-c", script, "flash-loader", str(target), *trust],
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


def test_the_flash_loader_takes_an_adopted_copy_and_never_replaces_a_foreign_ram_dir(
    tmp_path: Path,
) -> None:
    source, target = tmp_path / "source", tmp_path / "ram"
    mlc_model(source)
    result = load(source, target, "adopted")  # a user's copy has no marker of ours
    assert result.returncode == 0, result.stderr
    assert (target / "lib_rocm_gfx1100.so").read_bytes() == (
        source / "lib_rocm_gfx1100.so").read_bytes()
    assert not (source / COMPLETE_MARKER).exists()  # the backing copy is never written
    foreign = tmp_path / "someone-elses"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    refused = load(source, foreign, "adopted")
    assert refused.returncode != 0
    assert "did not write" in refused.stderr
    assert (foreign / "keep.txt").read_text() == "mine"


# --- download Jobs ------------------------------------------------------------------


def job_container(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize(
    ("source", "image", "fragment", "args"),
    [
        ("HF://org/repo", "python:3.12-slim", "/resolve/{commit}/", []),
        ("file:///srv/models/qwen", "busybox:1.36", 'cp -a "$3" "$target"/', ["/source/qwen"]),
        ("pvc://models/qwen/7b", "busybox:1.36", 'cp -a "$3" "$target"/', ["/source/qwen/7b"]),
        ("pvc://models", "busybox:1.36", 'cp -a "$3"/. "$target"/', ["/source"]),
        ("ollama://llama3.2:1b", "ollama/ollama:latest", "ollama pull llama3.2:1b", []),
    ],
)
def test_one_download_job_per_scheme_under_the_ownership_rules(
    source: str, image: str, fragment: str, args: list[str]
) -> None:
    spec = cache_from_k8s(cache("c", source=source))
    job = download_job(spec, IMAGES)
    container = job_container(job)
    assert container["image"] == image
    sh, dash_c, script, name, *rest = container["command"]
    assert (sh, dash_c, name) == ("sh", "-c", "download")
    assert rest == ["/target", "/dev/termination-log", *args]
    assert fragment in script
    # The guard runs before the body, the completion marker after it.
    busy = script.index('> "$busy_marker"')
    assert busy < script.index(fragment) < script.index('mv "$done_marker.partial"')
    assert "find /target -mindepth 1 -delete" not in script
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FLEXINFER_SOURCE"] == source
    assert job["metadata"]["name"] == "c-download"
    assert job["metadata"]["ownerReferences"][0]["name"] == "c"
    # A directory the script must not write fails the Job at once, not after retries.
    rule = job["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"]["values"] == [REFUSED_EXIT_CODE]


def test_download_jobs_have_resources_and_a_deadline_with_overrides() -> None:
    job = download_job(cache_from_k8s(cache("c")), IMAGES)
    assert job["spec"]["activeDeadlineSeconds"] == 21600
    assert job_container(job)["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"memory": "4Gi"},
    }
    tuned = download_job(cache_from_k8s(cache(
        "c", downloadTimeoutSeconds=600,
        downloadResources={"limits": {"memory": "8Gi", "cpu": "2"}})), IMAGES)
    assert tuned["spec"]["activeDeadlineSeconds"] == 600
    assert job_container(tuned)["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"memory": "8Gi", "cpu": "2"},
    }
    with pytest.raises(InvalidFieldError, match=r"spec.downloadResources.limits.amd.com/gpu"):
        cache_from_k8s(cache("c", downloadResources={"limits": {"amd.com/gpu": "1"}}))


def test_the_cache_tolerations_reach_every_job_pod() -> None:
    taint = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    obj = cache("c", storageStrategy="NodeLocal", nodeSelector={"kubernetes.io/hostname": "n1"},
                tolerations=[taint], finetune={"image": "trainer:1"})
    spec = cache_from_k8s(obj)
    download = download_job(spec, IMAGES)["spec"]["template"]["spec"]
    cleanup = cleanup_job(spec, IMAGES, deadline_seconds=60)
    assert cleanup is not None
    finetune = finetune_job(spec, obj, default_image="")["spec"]["template"]["spec"]
    for pod_spec in (download, cleanup["spec"]["template"]["spec"], finetune):
        assert pod_spec["tolerations"] == [taint]
        assert pod_spec["nodeSelector"] == {"kubernetes.io/hostname": "n1"}


def test_file_host_paths_say_whether_they_are_a_file_or_a_directory() -> None:
    assert host_path_type("/srv/models/qwen.gguf") == "File"
    assert host_path_type("/data/tickets.jsonl") == "File"
    assert host_path_type("/srv/models/qwen") == "Directory"
    assert host_path_type("/srv/models/Qwen3-8B-q4f32_1-MLC/") == "Directory"
    # Under an administrator's prefix: that prefix is the volume, the rest its subPath.
    policy = AdminPolicy(host_path_prefixes=("/srv", "/data"))
    spec = cache_from_k8s(cache("c", source="file:///srv/m/model.gguf"))
    pod_spec = download_job(spec, IMAGES, policy=policy)["spec"]["template"]["spec"]
    source = next(v for v in pod_spec["volumes"] if v["name"] == "source")
    mount = next(m for m in pod_spec["containers"][0]["volumeMounts"] if m["name"] == "source")
    assert mount["subPath"] == "m/model.gguf" and mount["readOnly"] is True
    assert host_dir(source, mount, spec.host_volumes(policy)) == "/srv/m/model.gguf"
    obj = cache("ft", finetune={"image": "t:1", "dataset": "file:///data/tickets.jsonl"})
    spec = cache_from_k8s(obj)
    pod_spec = finetune_job(spec, obj, default_image="", policy=policy)["spec"]["template"]["spec"]
    dataset = next(v for v in pod_spec["volumes"] if v["name"] == "dataset")
    mount = next(m for m in pod_spec["containers"][0]["volumeMounts"] if m["name"] == "dataset")
    assert host_dir(dataset, mount, finetune_volumes(spec, obj, policy)) == (
        "/data/tickets.jsonl")


def test_a_cache_without_a_source_only_adopts_and_one_that_makes_its_claim_needs_one() -> None:
    with pytest.raises(InvalidFieldError, match=r"spec.source.*existingClaimName"):
        cache_from_k8s(cache("c", source=None))
    spec = cache_from_k8s(cache("c", source=None, existingClaimName="models",
                                modelPath="Qwen3-8B-q4f32_1-MLC"))
    assert spec.source is None
    env = {e["name"]: e.get("value") for e in job_container(download_job(spec, IMAGES))["env"]}
    assert env["FLEXINFER_SOURCE"] == ""


# --- the download script on real directories --------------------------------------------


def run_download(spec_source: str, target: Path, tmp_path: Path,
                 **extra: Any) -> tuple[subprocess.CompletedProcess[str], Any]:
    """The rendered download Job's script, run with /bin/sh as its pod would: /target is
    `target`, the termination log a file, and a `file://` source's mount its host path."""
    obj = cache("c", source=spec_source, **extra)
    container = job_container(download_job(cache_from_k8s(obj), IMAGES))
    sh, dash_c, script, name, _target, _log, *args = container["command"]
    log = tmp_path / "termination-log"
    log.unlink(missing_ok=True)
    env = {e["name"]: e.get("value") or "" for e in container["env"] if "value" in e}
    host_args = [a.replace("/source/", f"{tmp_path}/src/", 1) for a in args]
    result = subprocess.run([sh, dash_c, script, name, str(target), str(log), *host_args],
                            capture_output=True, text=True, timeout=30,
                            env={"PATH": os.environ["PATH"], **env})
    return result, parse_result(log.read_text() if log.exists() else "")


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def mlc_model(directory: Path) -> None:
    """A compiled mlc-llm model as seed 002 keeps it on its share."""
    directory.mkdir(parents=True)
    (directory / "mlc-chat-config.json").write_text('{"model_type": "qwen3"}')
    (directory / "tensor-cache.json").write_text("{}")
    (directory / "params_shard_0.bin").write_bytes(os.urandom(4096))
    (directory / "lib_rocm_gfx1100.so").write_bytes(os.urandom(2048))


def test_a_users_model_is_adopted_byte_for_byte_and_never_written(tmp_path: Path) -> None:
    target = tmp_path / "Qwen3-8B-abliterated-q4f32_1-MLC"
    mlc_model(target)
    before = tree_hashes(target)
    result, report = run_download("huggingface://huihui-ai/Qwen3-8B-abliterated", target, tmp_path)
    assert result.returncode == 0, result.stderr
    assert report.result is DirResult.ADOPTED
    assert "mlc-chat-config.json" in report.detail
    assert tree_hashes(target) == before  # no marker, no download, nothing removed
    assert sorted(p.name for p in target.iterdir()) == sorted(before)


@pytest.mark.parametrize(
    ("files", "source", "adopted"),
    [
        ({"model.gguf": b"GGUF"}, "HF://org/repo", True),
        ({"config.json": b"{}", "model-00001-of-00002.safetensors": b"w"}, "HF://org/repo", True),
        ({"config.json": b"{}", "pytorch_model.bin": b"w"}, "HF://org/repo", True),
        ({"manifests/x": b"m", "blobs/sha256-1": b"b"}, "ollama://llama3.2:1b", True),
        ({"q8.gguf": b"GGUF"}, "HF://org/repo/q8.gguf", True),
        ({"q4.gguf": b"GGUF"}, "HF://org/repo/q8.gguf", False),  # not the file named
        ({"config.json": b"{}"}, "HF://org/repo", False),  # no weights
        ({"notes.txt": b"mine"}, "HF://org/repo", False),
    ],
)
def test_what_counts_as_a_model_to_adopt(
    tmp_path: Path, files: dict[str, bytes], source: str, adopted: bool
) -> None:
    target = tmp_path / "copy"
    for name, data in files.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(data)
    before = tree_hashes(target)
    result, report = run_download(source, target, tmp_path)
    assert tree_hashes(target) == before
    if adopted:
        assert (result.returncode, report.result) == (0, DirResult.ADOPTED)
    else:
        assert (result.returncode, report.result) == (REFUSED_EXIT_CODE, DirResult.FOREIGN)


def test_an_empty_directory_is_filled_marked_busy_first_and_complete_last(
    tmp_path: Path,
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.gguf").write_bytes(b"GGUF weights")
    target = tmp_path / "copy"
    target.mkdir()
    (target / "lost+found").mkdir()  # a fresh volume's root is still empty
    result, report = run_download("file:///models/model.gguf", target, tmp_path)
    assert result.returncode == 0, result.stderr
    assert report.result is DirResult.DOWNLOADED
    assert (target / "model.gguf").read_bytes() == b"GGUF weights"
    assert (target / COMPLETE_MARKER).read_text().strip() == "file:///models/model.gguf"
    assert not (target / BUSY_MARKER).exists()
    assert (target / "lost+found").is_dir()


def test_a_complete_copy_of_the_same_source_is_not_downloaded_again(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.gguf").write_bytes(b"v1")
    target = tmp_path / "copy"
    run_download("file:///models/model.gguf", target, tmp_path)
    (tmp_path / "src" / "model.gguf").write_bytes(b"v2")  # would show if copied again
    result, report = run_download("file:///models/model.gguf", target, tmp_path)
    assert result.returncode == 0, result.stderr
    assert report.result is DirResult.PRESENT
    assert (target / "model.gguf").read_bytes() == b"v1"


def test_flexinfers_own_copy_of_another_source_or_half_written_is_replaced(
    tmp_path: Path,
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "new.gguf").write_bytes(b"new")
    for marker in (COMPLETE_MARKER, BUSY_MARKER):
        target = tmp_path / f"copy-{marker}"
        target.mkdir()
        (target / "old.gguf").write_bytes(b"old")
        (target / marker).write_text("file:///models/old.gguf\n")
        result, report = run_download("file:///models/new.gguf", target, tmp_path)
        assert result.returncode == 0, result.stderr
        assert report.result is DirResult.DOWNLOADED
        assert sorted(p.name for p in target.iterdir()) == [COMPLETE_MARKER, "new.gguf"]


def test_no_source_and_nothing_there_says_so_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "copy"
    target.mkdir()
    obj_extra = {"existingClaimName": "models"}
    result, report = run_download("", target, tmp_path, **obj_extra)
    assert (result.returncode, report.result) == (REFUSED_EXIT_CODE, DirResult.EMPTY)
    assert list(target.iterdir()) == []
    mlc_model(target / "m")
    result, report = run_download("", target / "m", tmp_path, **obj_extra)
    assert (result.returncode, report.result) == (0, DirResult.ADOPTED)


def test_the_cleanup_removes_only_what_flexinfer_wrote(tmp_path: Path) -> None:
    ours, half, users, empty = (tmp_path / n for n in ("ours", "half", "users", "empty"))
    for d in (ours, half, users, empty):
        d.mkdir()
    (ours / COMPLETE_MARKER).write_text("HF://org/repo\n")
    (ours / "model.gguf").write_bytes(b"w")
    (half / BUSY_MARKER).write_text("HF://org/repo\n")
    mlc_model(users / "m")
    before = tree_hashes(users)
    spec = cache_from_k8s(cache("c", storageStrategy="Memory",
                                nodeSelector={"kubernetes.io/hostname": "n1"}))
    job = cleanup_job(spec, IMAGES, deadline_seconds=60)
    assert job is not None
    sh, dash_c, script, name, _log, *dirs = job_container(job)["command"]
    assert len(dirs) == 2  # the node directory and the RAM copy
    log_file = tmp_path / "log"
    result = subprocess.run(
        [sh, dash_c, script, name, str(log_file), str(ours), str(half), str(users), str(empty),
         str(tmp_path / "missing")], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert not ours.exists() and not half.exists() and not empty.exists()
    assert tree_hashes(users) == before
    report = parse_result(log_file.read_text())
    assert report is not None and report.result is DirResult.CLEANED
    assert f"kept: {users}" in report.detail


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
    mount = next(m for m in pod_spec["containers"][0]["volumeMounts"] if m["name"] == "target")
    assert host_dir(target, mount, spec.host_volumes(AdminPolicy())) == (
        "/var/lib/flexinfer/models/ns/c")


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
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi", "amd.com/gpu": "1"},
        "limits": {"memory": "32Gi", "amd.com/gpu": "1"},
    }
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    assert job["spec"]["backoffLimit"] == 0
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"/cache", "/dataset/tickets.jsonl", "/dev/shm"}
    assert pod_spec["securityContext"] == {"supplementalGroups": [44, 109]}  # ROCm devices


def test_a_finetune_without_a_trainer_image_says_what_to_set() -> None:
    obj = cache("ft", finetune={"mode": "qlora"})
    with pytest.raises(InvalidFieldError, match=r"spec.finetune.image.*--finetune-image"):
        finetune_job(cache_from_k8s(obj), obj, default_image="")


def test_a_finetune_over_an_adopted_copy_is_refused() -> None:
    obj = cache("ft", existingClaimName="models", finetune={"image": "t:1"})
    obj["status"] = {"conditions": [{"type": "Adopted", "status": "True"}]}
    with pytest.raises(InvalidFieldError, match=r"spec.finetune.*adopted"):
        finetune_job(cache_from_k8s(obj), obj, default_image="")


def test_a_claim_pinned_to_one_node_is_rwo_else_rwx_and_the_class_is_passed() -> None:
    pinned = claim_manifest(cache_from_k8s(cache(
        "c", nodeSelector={"kubernetes.io/hostname": "n1"}, storageClassName="local-path")))
    assert pinned is not None
    assert pinned["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pinned["spec"]["storageClassName"] == "local-path"
    shared = claim_manifest(cache_from_k8s(cache("c")))
    assert shared is not None
    assert shared["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "storageClassName" not in shared["spec"]
    chosen = claim_manifest(cache_from_k8s(cache("c", accessModes=["ReadWriteOnce"])))
    assert chosen is not None and chosen["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_the_flash_loader_is_told_when_the_backing_copy_was_adopted() -> None:
    obj = cache("c", storageStrategy="Memory", existingClaimName="models",
                nodeSelector={"kubernetes.io/hostname": "n1"})
    plain = serving_mount(cache_from_k8s(obj), IMAGES).init_containers[0]["command"]
    assert plain[-1] == "/models/c"
    obj["status"] = {"conditions": [{"type": "Adopted", "status": "True"}]}
    adopted = serving_mount(cache_from_k8s(obj), IMAGES).init_containers[0]["command"]
    assert adopted[-2:] == ["/models/c", "adopted"]


def test_a_missing_file_source_is_refused_not_copied_as_an_empty_model(tmp_path: Path) -> None:
    """Through a claim's subPath a missing path arrives as an empty directory the
    kubelet made: the download refuses it and writes nothing."""
    (tmp_path / "src" / "model.gguf").mkdir(parents=True)  # what the kubelet made
    target = tmp_path / "target"
    result, _ = run_download("file:///srv/m/model.gguf", target, tmp_path)
    assert result.returncode == REFUSED_EXIT_CODE, result.stdout + result.stderr
    assert "file:///srv/m/model.gguf is missing or empty on the node" in result.stdout
    assert not (target / COMPLETE_MARKER).exists()
    assert not (target / "model.gguf").exists()


def test_a_memory_cache_without_a_node_keeps_its_ram_copy_on_the_serving_pods_nodes() -> None:
    """A Memory cache on a claim may name no node: its RAM volume is then made for the
    nodes the Model selects (the Model's reconcile makes it), never for "any node"."""
    selector = {"flexinfer.ai/ram": "big"}
    cache_obj = cache("ram", storageStrategy="Memory", existingClaimName="models")
    rendered = render(model(cache={"modelCacheRef": "ram"}, nodeSelector=selector), cache_obj)
    (ram,) = rendered.host_volumes
    assert node_terms(ram) == [("flexinfer.ai/ram", "In", ["big"])]
    volumes = {v["name"]: v for v in pod(rendered)["volumes"]}
    mount = next(m for m in server(rendered)["volumeMounts"] if m["name"] == "model-cache")
    assert host_dir(volumes["model-cache"], mount, rendered.host_volumes) == (
        "/dev/shm/flexinfer/ns/ram")
    # The cache's own reconcile makes no RAM volume for "any node".
    assert cache_from_k8s(cache_obj).host_volumes(AdminPolicy()) == ()
