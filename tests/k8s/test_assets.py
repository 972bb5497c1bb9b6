"""Where the binaries come from: overrides, the cache, one build at a time, and failures
that name the binary. A fake `go` stands in for the Go toolchain and a fake `cmake` (with
a stand-in sdist) for the llama-server build; another fake `go` for ollama's."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexinfer_devcluster import asset_versions as pins
from flexinfer_devcluster.assets import (
    ENV_ASSETS,
    ENV_CACHE,
    ENV_KUBEBUILDER_ASSETS,
    ENV_LLAMA_SERVER,
    ENV_OLLAMA,
    KUBERNETES_STEP,
    AssetsError,
    current_key,
    ensure_all,
    ensure_assets,
    ensure_llama_server,
    ensure_ollama,
    llama_server_key,
    ollama_key,
    sdist_path,
)
from flexinfer_devcluster.assets import main as assets_main

FAKE_GO = """#!/bin/sh
if [ "$1" = version ]; then echo "go version fake"; exit 0; fi
echo "$PWD" >> "$FAKE_GO_CALLS"
if [ -n "$FAKE_GO_FAIL" ]; then echo "$FAKE_GO_FAIL" >&2; exit 1; fi
sleep "${FAKE_GO_SLEEP:-0}"
if [ -n "$FAKE_GO_WAIT_FOR" ]; then  # a build that needs another to be running
  i=0
  while [ ! -e "$FAKE_GO_WAIT_FOR" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
  test -e "$FAKE_GO_WAIT_FOR" || { echo "nothing made $FAKE_GO_WAIT_FOR" >&2; exit 1; }
fi
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


def _fake_sdist(monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    """The llama-cpp-python sdist at its cached path holding `files` (under its root
    directory), with its pinned digest made to match."""
    root = f"llama_cpp_python-{pins.LLAMA_CPP_PYTHON_VERSION}"
    sdist = sdist_path()
    sdist.parent.mkdir(parents=True)
    with tarfile.open(sdist, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    monkeypatch.setattr(pins, "LLAMA_CPP_PYTHON_SHA256", digest)


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


# -- llama-server: built with cmake from the pinned sdist (a fake cmake stands in) ------

FAKE_CMAKE = """#!/bin/sh
if [ "$1" = --version ]; then echo "cmake version fake"; exit 0; fi
echo "$*" >> "$FAKE_CMAKE_CALLS"
if [ "$1" = -S ]; then
  test -f "$2/CMakeLists.txt" || { echo "no CMakeLists.txt in $2" >&2; exit 1; }
  mkdir -p "$4"; exit 0
fi
if [ -n "$FAKE_CMAKE_MARK" ]; then touch "$FAKE_CMAKE_MARK"; fi
if [ -n "$FAKE_CMAKE_FAIL" ]; then echo "$FAKE_CMAKE_FAIL" >&2; exit 2; fi
mkdir -p "$2/bin"
printf '#!/bin/sh\\necho "version: fake"\\n' > "$2/bin/llama-server"
chmod +x "$2/bin/llama-server"
"""


@pytest.fixture
def fake_cmake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache holding a stand-in sdist (pinned by its hash) and a fake `cmake`."""
    tools = tmp_path / "cmake-tools"
    tools.mkdir()
    _executable(tools / "cmake", FAKE_CMAKE)
    calls = tmp_path / "cmake-calls"
    calls.touch()
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CMAKE_CALLS", str(calls))
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_LLAMA_SERVER, raising=False)
    _fake_sdist(monkeypatch, {
        "vendor/llama.cpp/CMakeLists.txt": "project(llama.cpp)\n",
        "llama_cpp/__init__.py": "# the bindings, not unpacked\n",
    })
    return calls


def test_llama_server_is_built_once_from_the_vendored_sources_then_reused(
    tmp_path: Path, fake_cmake: Path
) -> None:
    binary = ensure_llama_server(log=False)
    assert binary == tmp_path / "cache" / "assets" / llama_server_key() / "llama-server"
    assert pins.LLAMA_CPP_PYTHON_VERSION in llama_server_key()
    configure, compile_ = fake_cmake.read_text().splitlines()
    assert configure.split()[1].endswith("vendor/llama.cpp")
    assert "-DGGML_NATIVE=OFF" in configure and "-DLLAMA_USE_PREBUILT_UI=OFF" in configure
    assert "--target llama-server" in compile_
    record = json.loads((binary.parent / "versions.json").read_text())
    assert record["llama_cpp_python"] == pins.LLAMA_CPP_PYTHON_VERSION
    assert record["llama_server_version"] == ["version: fake"]
    build = tmp_path / "cache" / "build" / llama_server_key()
    assert sorted(p.name for p in build.iterdir()) == ["build.log"], "sources are removed"

    assert ensure_llama_server(log=False) == binary
    assert len(fake_cmake.read_text().splitlines()) == 2, "a warm cache must not rebuild"


def test_a_failed_llama_server_build_names_the_step_and_leaves_no_cache(
    tmp_path: Path, fake_cmake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CMAKE_FAIL", "ggml.c:1: error: no such intrinsic")
    with pytest.raises(AssetsError) as failure:
        ensure_llama_server(log=False)
    assert "failed at cmake compile" in str(failure.value)
    assert "no such intrinsic" in str(failure.value)
    assets_root = tmp_path / "cache" / "assets"
    assert [p.name for p in assets_root.iterdir() if not p.name.endswith(".lock")] == []


def test_without_a_build_a_missing_llama_server_names_the_command(fake_cmake: Path) -> None:
    with pytest.raises(AssetsError, match=r"python -m flexinfer_devcluster\.assets"):
        ensure_llama_server(build=False)
    assert fake_cmake.read_text() == ""


def test_flexinfer_llama_server_overrides_the_cache_and_must_be_executable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "llama-server"
    _executable(mine)
    monkeypatch.setenv(ENV_LLAMA_SERVER, str(mine))
    assert ensure_llama_server(build=False) == mine
    mine.chmod(0o644)
    with pytest.raises(AssetsError, match=r"FLEXINFER_LLAMA_SERVER=.* is not an executable"):
        ensure_llama_server(build=False)


def test_the_assets_step_builds_both_and_prints_one_path(
    tmp_path: Path, fake_go: Path, fake_cmake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert assets_main([]) == 0
    # One line on stdout: README's `$(python -m flexinfer_devcluster.assets)/kubectl`.
    assert capsys.readouterr().out == f"{tmp_path / 'cache' / 'assets' / current_key()}\n"
    assert len(fake_cmake.read_text().splitlines()) == 2
    assert assets_main(["--llama-server"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{llama_server_key()}/llama-server")
    assert assets_main(["--bogus"]) == 2


def test_the_assets_step_builds_the_control_plane_and_llama_server_at_the_same_time(
    tmp_path: Path, fake_go: Path, fake_cmake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake go waits until cmake's compile has started: one after the other, it
    # would wait in vain and fail.
    mark = tmp_path / "cmake-compiling"
    monkeypatch.setenv("FAKE_CMAKE_MARK", str(mark))
    monkeypatch.setenv("FAKE_GO_WAIT_FOR", str(mark))
    directory, llama_server = ensure_all(log=False)
    assert directory == tmp_path / "cache" / "assets" / current_key()
    assert llama_server.parent.name == llama_server_key()
    assert len(fake_go.read_text().splitlines()) == len(pins.BINARIES) - 3  # three steps


def test_a_failed_llama_server_build_beside_the_control_plane_is_raised(
    tmp_path: Path, fake_go: Path, fake_cmake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CMAKE_FAIL", "ggml.c:1: error: no such intrinsic")
    with pytest.raises(AssetsError, match="no such intrinsic"):
        ensure_all(log=False)
    # The control plane was built all the same (and is kept).
    assert ensure_assets(build=False) == tmp_path / "cache" / "assets" / current_key()


def test_each_step_says_its_time_and_what_is_left(
    tmp_path: Path, fake_go: Path, fake_cmake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ensure_assets()  # alone: llama-server is still to build after every step
    lines = [line for line in capsys.readouterr().err.splitlines() if " built " in line]
    assert [line.split(" in ")[0] for line in lines] == [
        "flexinfer assets: built etcd",
        f"flexinfer assets: built {KUBERNETES_STEP}",
        "flexinfer assets: built kwok",
        "flexinfer assets: built " + ", ".join(pins.BINARIES),
    ]
    etcd, kubernetes, kwok = lines[:3]
    assert f"left: {KUBERNETES_STEP} (~8 min), kwok (~2 min), llama-server (~5 min);" in etcd
    assert "left: kwok (~2 min), llama-server (~5 min); about 6 min" in kubernetes
    assert "left: llama-server (~5 min)" in kwok
    ensure_llama_server()
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("flexinfer assets: built llama-server in ")
    assert last.endswith("nothing left to build")


def test_llama_server_done_first_says_the_control_plane_is_still_building(
    tmp_path: Path, fake_cmake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ensure_llama_server()
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith("left: the control plane, building beside it")


# -- ollama: built from its Go module with the sdist's vendor headers (a fake go) -------

FAKE_OLLAMA_GO = """#!/bin/sh
if [ "$1" = version ]; then echo "go version fake"; exit 0; fi
echo "$* CGO_ENABLED=$CGO_ENABLED CGO_CFLAGS=$CGO_CFLAGS CGO_CXXFLAGS=$CGO_CXXFLAGS" \\
  >> "$FAKE_GO_CALLS"
if [ "$1" = mod ]; then
  printf '{"Path": "github.com/ollama/ollama", "Dir": "%s"}\\n' "$FAKE_OLLAMA_MODULE"; exit 0
fi
test -f llama/llama.cpp/vendor/nlohmann/json.hpp \\
  || { echo "nlohmann/json.hpp: no such file" >&2; exit 1; }
while [ $# -gt 0 ]; do
  if [ "$1" = -o ]; then out="$2"; break; fi
  shift
done
printf '#!/bin/sh\\necho "Warning: client version is %s"\\n' "$FAKE_OLLAMA_VERSION" > "$out"
chmod +x "$out"
"""


@pytest.fixture
def fake_ollama_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache, a read-only stand-in module without `vendor/` (as module zips
    are), a stand-in sdist holding the vendor headers, and a fake `go`."""
    tools = tmp_path / "ollama-tools"
    tools.mkdir()
    _executable(tools / "go", FAKE_OLLAMA_GO)
    calls = tmp_path / "go-calls"
    calls.touch()
    module = tmp_path / "gomodcache" / "ollama"
    (module / "llama" / "llama.cpp" / "src").mkdir(parents=True)
    (module / "go.mod").write_text("module github.com/ollama/ollama\n")
    for directory in (module / "llama" / "llama.cpp", module / "llama", module):
        directory.chmod(0o555)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GO_CALLS", str(calls))
    monkeypatch.setenv("FAKE_OLLAMA_MODULE", str(module))
    monkeypatch.setenv("FAKE_OLLAMA_VERSION", pins.OLLAMA_VERSION.lstrip("v"))
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_OLLAMA, raising=False)
    _fake_sdist(monkeypatch, {
        "vendor/llama.cpp/vendor/nlohmann/json.hpp": "// the sdist's\n",
        "vendor/llama.cpp/CMakeLists.txt": "project(llama.cpp)\n",
    })
    yield calls
    for directory in (module, module / "llama", module / "llama" / "llama.cpp"):
        directory.chmod(0o755)  # so pytest can remove it


def test_ollama_is_built_once_from_its_module_with_the_sdists_headers_then_reused(
    tmp_path: Path, fake_ollama_go: Path
) -> None:
    binary = ensure_ollama(log=False)
    assert binary == tmp_path / "cache" / "assets" / ollama_key() / "ollama"
    assert pins.OLLAMA_VERSION in ollama_key()
    download, build = fake_ollama_go.read_text().splitlines()
    assert download.startswith(f"mod download -json github.com/ollama/ollama@{pins.OLLAMA_VERSION}")
    assert build.startswith("build -trimpath")
    assert f"version.Version={pins.OLLAMA_VERSION.lstrip('v')}" in build
    # cgo on, without debug info and with the lighter optimisation.
    assert "CGO_ENABLED=1 CGO_CFLAGS=-O1 -g0 CGO_CXXFLAGS=-O1 -g0" in build
    record = json.loads((binary.parent / "versions.json").read_text())
    assert record["ollama"] == pins.OLLAMA_VERSION
    assert record["cgo_flags"] == ["-O1", "-g0"]
    build_dir = tmp_path / "cache" / "build" / ollama_key()
    assert sorted(p.name for p in build_dir.iterdir()) == ["build.log"], "sources are removed"
    assert ensure_ollama(log=False) == binary
    assert len(fake_ollama_go.read_text().splitlines()) == 2, "a warm cache must not rebuild"


def test_a_failed_ollama_build_shows_the_log_and_leaves_no_cache(
    tmp_path: Path, fake_ollama_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Headers looked for where the sdist has none: refused naming the sdist.
    monkeypatch.setattr(pins, "OLLAMA_VENDOR_PREFIX", "vendor/llama.cpp/no-such/")
    with pytest.raises(AssetsError, match=r"holds no .*/no-such/: not the sdist"):
        ensure_ollama(log=False)
    monkeypatch.setattr(pins, "OLLAMA_VENDOR_PREFIX", "vendor/llama.cpp/")
    with pytest.raises(AssetsError, match=r"building ollama failed[\s\S]*json\.hpp"):
        ensure_ollama(log=False)  # the headers land one level too high
    assets_root = tmp_path / "cache" / "assets"
    assert [p.name for p in assets_root.iterdir() if not p.name.endswith(".lock")] == []


def test_without_a_build_a_missing_ollama_names_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_OLLAMA, raising=False)
    with pytest.raises(AssetsError, match=r"assets --ollama"):
        ensure_ollama(build=False)
    mine = tmp_path / "ollama"
    _executable(mine)
    monkeypatch.setenv(ENV_OLLAMA, str(mine))
    assert ensure_ollama(build=False) == mine


def test_the_assets_step_builds_only_ollama_when_asked(
    tmp_path: Path, fake_ollama_go: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert assets_main(["--ollama"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{ollama_key()}/ollama")
    assert assets_main(["--ollama", "--llama-server"]) == 2
