"""Where the control-plane binaries come from: overrides, the cache, one build at a time,
and failures that name the binary. A fake `go` stands in for the toolchain."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from flexinfer_devcluster import asset_versions as pins
from flexinfer_devcluster.assets import (
    ENV_ASSETS,
    ENV_CACHE,
    ENV_KUBEBUILDER_ASSETS,
    AssetsError,
    current_key,
    ensure_assets,
)

FAKE_GO = """#!/bin/sh
if [ "$1" = version ]; then echo "go version fake"; exit 0; fi
echo "$PWD" >> "$FAKE_GO_CALLS"
if [ -n "$FAKE_GO_FAIL" ]; then echo "$FAKE_GO_FAIL" >&2; exit 1; fi
sleep "${FAKE_GO_SLEEP:-0}"
while [ $# -gt 0 ]; do
  if [ "$1" = -o ]; then out="$2"; shift 2; break; fi
  shift
done
case "$out" in
  */) for package in "$@"; do
        printf '#!/bin/sh\\n' > "$out$(basename "$package")"; chmod +x "$out$(basename "$package")"
      done ;;
  *) printf '#!/bin/sh\\n' > "$out"; chmod +x "$out" ;;
esac
"""


def _executable(path: Path, text: str = "#!/bin/sh\n") -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _full_directory(path: Path, *, without: tuple[str, ...] = ()) -> Path:
    path.mkdir(parents=True)
    for name in pins.BINARIES:
        if name not in without:
            _executable(path / name)
    return path


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache and a fake `go` first on PATH; returns the file listing its calls."""
    tools = tmp_path / "tools"
    tools.mkdir()
    _executable(tools / "go", FAKE_GO)
    calls = tmp_path / "go-calls"
    calls.touch()
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GO_CALLS", str(calls))
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_ASSETS, raising=False)
    monkeypatch.delenv(ENV_KUBEBUILDER_ASSETS, raising=False)
    return calls


def test_flexinfer_assets_overrides_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = _full_directory(tmp_path / "mine")
    monkeypatch.setenv(ENV_ASSETS, str(mine))
    monkeypatch.setenv(ENV_KUBEBUILDER_ASSETS, str(_full_directory(tmp_path / "other")))
    assert ensure_assets(build=False) == mine


def test_an_incomplete_flexinfer_assets_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_ASSETS, str(_full_directory(tmp_path / "mine", without=("kwok",))))
    with pytest.raises(AssetsError, match=r"FLEXINFER_ASSETS=.* lacks kwok"):
        ensure_assets(build=False)


def test_kubebuilder_assets_is_used_only_when_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_go: Path
) -> None:
    complete = _full_directory(tmp_path / "complete")
    monkeypatch.setenv(ENV_KUBEBUILDER_ASSETS, str(complete))
    assert ensure_assets(build=False) == complete

    envtest = _full_directory(
        tmp_path / "envtest", without=("kube-controller-manager", "kube-scheduler", "kwok")
    )
    monkeypatch.setenv(ENV_KUBEBUILDER_ASSETS, str(envtest))
    with pytest.raises(AssetsError, match=r"python -m flexinfer_devcluster\.assets"):
        ensure_assets(build=False)


def test_builds_once_into_the_versioned_cache_then_reuses_it(tmp_path: Path, fake_go: Path) -> None:
    directory = ensure_assets(log=False)
    assert directory == tmp_path / "cache" / "assets" / current_key()
    assert sorted(p.name for p in directory.iterdir()) == sorted([*pins.BINARIES, "versions.json"])
    assert pins.KUBERNETES_VERSION in current_key()
    builds = fake_go.read_text().splitlines()
    assert [Path(b).name for b in builds] == ["etcd", "kubernetes", "kwok"]
    go_mod = (Path(builds[1]) / "go.mod").read_text()
    assert f"require k8s.io/kubernetes {pins.KUBERNETES_VERSION}" in go_mod
    assert f"k8s.io/client-go => k8s.io/client-go {pins.KUBERNETES_STAGING_VERSION}" in go_mod

    assert ensure_assets(log=False) == directory
    assert len(fake_go.read_text().splitlines()) == 3, "a warm cache must not rebuild"


def test_concurrent_callers_build_once(
    tmp_path: Path, fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GO_SLEEP", "0.3")
    results: list[Path] = []
    callers = [
        threading.Thread(target=lambda: results.append(ensure_assets(log=False))) for _ in range(3)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert len(set(results)) == 1 and len(results) == 3
    assert len(fake_go.read_text().splitlines()) == 3


def test_a_failed_build_names_the_binary_shows_the_log_and_leaves_no_partial_cache(
    tmp_path: Path, fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GO_FAIL", "go: go.etcd.io/etcd/server/v3@v9: invalid version")
    with pytest.raises(AssetsError) as failure:
        ensure_assets(log=False)
    message = str(failure.value)
    assert "building etcd" in message
    assert "invalid version" in message
    assets_root = tmp_path / "cache" / "assets"
    assert [p.name for p in assets_root.iterdir() if not p.name.endswith(".lock")] == []
