"""Find or build the binaries the local cluster runs: the control plane and `llama-server`.

Control plane (etcd, kube-*, kubectl, kwok): `$FLEXINFER_ASSETS` (must hold all six),
then `$KUBEBUILDER_ASSETS` when it holds all six (envtest's usual three are passed
over), then the cache `~/.cache/flexinfer/assets/<key>/` keyed by the pins in
`asset_versions`. A missing cache entry is compiled once from the Go modules with the
machine's Go toolchain into a temporary directory and renamed into place, under a file
lock so concurrent callers build it once. Nothing is downloaded except through the Go
module proxy.

`llama-server`: `$FLEXINFER_LLAMA_SERVER` (an executable), else the cache entry
`~/.cache/flexinfer/assets/llama-server-<version>-<flags>-<platform>/`, built the same
way (once, locked, renamed into place) with cmake from the llama.cpp sources vendored in
the pinned `llama-cpp-python` sdist. The sdist is the only download (`pip download`,
hash-checked, kept under `~/.cache/flexinfer/downloads/`); the build itself is offline.

`ollama` (`ensure_ollama`, only for the tests that serve through it: `make test` builds
it, `make demo` does not): `$FLEXINFER_OLLAMA`, else the cache entry
`~/.cache/flexinfer/assets/ollama-<version>-<flags>-<platform>/`, built the same way
from the `github.com/ollama/ollama` Go module (cgo, CPU only) with the third-party
headers its module zip lacks taken from that same sdist.

This module never starts the binaries; `localcluster` and `processnode` do.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from flexinfer_devcluster import asset_versions as pins

ENV_ASSETS = "FLEXINFER_ASSETS"
ENV_KUBEBUILDER_ASSETS = "KUBEBUILDER_ASSETS"
ENV_CACHE = "FLEXINFER_CACHE_DIR"
ENV_LLAMA_SERVER = "FLEXINFER_LLAMA_SERVER"
ENV_OLLAMA = "FLEXINFER_OLLAMA"
MANIFEST = "versions.json"
LOG_TAIL_LINES = 40


class AssetsError(RuntimeError):
    """The binaries could not be found or built; the message says which and why."""


def cache_root() -> Path:
    """`$FLEXINFER_CACHE_DIR`, else `$XDG_CACHE_HOME/flexinfer`, else `~/.cache/flexinfer`."""
    explicit = os.environ.get(ENV_CACHE)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "flexinfer"


def _go_platform() -> tuple[str, str]:
    machine = platform.machine().lower()
    goarch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        machine, machine
    )
    return sys.platform if sys.platform != "linux2" else "linux", goarch


def current_key() -> str:
    goos, goarch = _go_platform()
    return pins.assets_key(goos=goos, goarch=goarch)


def missing_binaries(directory: Path) -> list[str]:
    """The pinned binaries that are not executable files in `directory`."""
    return [
        name
        for name in pins.BINARIES
        if not (directory / name).is_file() or not os.access(directory / name, os.X_OK)
    ]


def ensure_assets(*, build: bool = True, log: bool = True) -> Path:
    """Return a directory holding every binary in `asset_versions.BINARIES`.

    With `build=False` a missing cache entry raises instead of compiling.
    """
    explicit = os.environ.get(ENV_ASSETS)
    if explicit:
        directory = Path(explicit).expanduser()
        missing = missing_binaries(directory)
        if missing:
            raise AssetsError(
                f"${ENV_ASSETS}={directory} lacks {', '.join(missing)}; point it at a "
                f"directory with all of {', '.join(pins.BINARIES)} or unset it to "
                f"build them into {cache_root() / 'assets'}"
            )
        return directory
    ecosystem = os.environ.get(ENV_KUBEBUILDER_ASSETS)
    if ecosystem:
        directory = Path(ecosystem).expanduser()
        missing = missing_binaries(directory)
        if not missing:
            return directory
        # envtest's directories hold only etcd, kube-apiserver and kubectl; such a
        # directory is meant for another tool, so it is passed over, not an error.
        if log:
            _say(
                f"${ENV_KUBEBUILDER_ASSETS}={directory} lacks {', '.join(missing)}; using the cache"
            )

    final = cache_root() / "assets" / current_key()
    if _is_complete(final):
        return final
    if not build:
        raise AssetsError(
            f"no control-plane binaries at {final}; run `python -m flexinfer_devcluster.assets`"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(final.parent / f"{final.name}.lock", log=log):
        if _is_complete(final):  # another process finished while we waited
            return final
        _build_into(final, log=log)
    return final


def _is_complete(directory: Path) -> bool:
    return (directory / MANIFEST).is_file() and not missing_binaries(directory)


@contextmanager
def exclusive_lock(path: Path, *, log: bool) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created if missing), saying so when we wait."""
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log:
                print(
                    f"flexinfer: waiting for another process building into {path.with_suffix('')}",
                    file=sys.stderr,
                    flush=True,
                )
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _say(message: str) -> None:
    print(f"flexinfer assets: {message}", file=sys.stderr, flush=True)


KUBERNETES_STEP = "kube-apiserver, kube-controller-manager, kube-scheduler, kubectl"

# Roughly how long each step of a cold build takes on an idle two-core machine: half
# its compilers' CPU seconds as `benchmarks/bench_cold_build.py` measured them, plus
# its serial parts (docs/local-cluster.md). Printed as what is left while one runs.
TYPICAL_SECONDS: Mapping[str, float] = {
    "etcd": 70,
    KUBERNETES_STEP: 480,
    "kwok": 90,
    "llama-server": 300,
    "ollama": 420,
}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _left_after(done: str) -> str:
    """What a cold `make assets` still builds once `done` is built, with typical times:
    the control plane's later steps, llama-server while its cache entry is missing, and
    (once llama-server is done) the control plane while it is still building beside it.
    """
    names = [", ".join(step.binaries) for step in _steps()]
    left: list[tuple[str, float | None]] = []
    if done in names:
        left += [(name, TYPICAL_SECONDS.get(name)) for name in names[names.index(done) + 1 :]]
    elif not os.environ.get(ENV_ASSETS) and not _is_complete(
        cache_root() / "assets" / current_key()
    ):
        left.append(("the control plane, building beside it", None))
    if done != "llama-server" and not _llama_server_cached():
        left.append(("llama-server", TYPICAL_SECONDS["llama-server"]))
    if not left:
        return "nothing left to build"
    each = ", ".join(name if typical is None else f"{name} (~{_minutes(typical)})"
                     for name, typical in left)  # fmt: skip
    total = sum(typical or 0 for _, typical in left)
    if not total:
        return f"left: {each}"
    return f"left: {each}; about {_minutes(total)} on two idle cores, less when they overlap"


def _llama_server_cached() -> bool:
    if os.environ.get(ENV_LLAMA_SERVER):
        return True
    final = cache_root() / "assets" / llama_server_key()
    return (final / MANIFEST).is_file() and _is_executable(final / pins.LLAMA_SERVER_BINARY)


def find_go() -> Path:
    found = shutil.which("go")
    candidates = [Path(found)] if found else []
    candidates.append(Path("/usr/local/go/bin/go"))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise AssetsError(
        "the Go toolchain is needed to build the control-plane binaries but `go` is not "
        f"on PATH nor at /usr/local/go/bin/go; install Go or set ${ENV_ASSETS}"
    )


def _kubernetes_go_mod() -> str:
    replaces = "\n".join(
        f"\tk8s.io/{module} => k8s.io/{module} {pins.KUBERNETES_STAGING_VERSION}"
        for module in pins.KUBERNETES_STAGING_MODULES
    )
    return (
        "module flexinfer.local/build/kubernetes\n\ngo 1.26.0\n\n"
        f"require k8s.io/kubernetes {pins.KUBERNETES_VERSION}\n\n"
        f"replace (\n{replaces}\n)\n"
    )


def _kubernetes_ldflags() -> str:
    major, minor = pins.KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    # Without these the binaries report v0.0.0 and kubectl warns about version skew.
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={pins.KUBERNETES_VERSION}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(flags)


class _Step:
    """One `go build` in its own throwaway module."""

    def __init__(
        self,
        *,
        module_dir: str,
        go_mod: str,
        binaries: Sequence[str],
        packages: Sequence[str],
        ldflags: str,
    ) -> None:
        self.module_dir = module_dir
        self.go_mod = go_mod
        self.binaries = tuple(binaries)
        self.packages = tuple(packages)
        self.ldflags = ldflags


def _steps() -> list[_Step]:
    return [
        _Step(
            module_dir="etcd",
            go_mod=(
                "module flexinfer.local/build/etcd\n\ngo 1.26.0\n\n"
                f"require go.etcd.io/etcd/server/v3 {pins.ETCD_VERSION}\n"
            ),
            binaries=["etcd"],
            packages=["go.etcd.io/etcd/server/v3"],
            ldflags="-s -w",
        ),
        _Step(
            module_dir="kubernetes",
            go_mod=_kubernetes_go_mod(),
            binaries=["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"],
            packages=[
                f"k8s.io/kubernetes/cmd/{name}"
                for name in (
                    "kube-apiserver",
                    "kube-controller-manager",
                    "kube-scheduler",
                    "kubectl",
                )
            ],
            ldflags=_kubernetes_ldflags(),
        ),
        _Step(
            module_dir="kwok",
            go_mod=(
                "module flexinfer.local/build/kwok\n\ngo 1.26.0\n\n"
                f"require sigs.k8s.io/kwok {pins.KWOK_VERSION}\n"
            ),
            binaries=["kwok"],
            packages=["sigs.k8s.io/kwok/cmd/kwok"],
            ldflags=f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={pins.KWOK_VERSION}",
        ),
    ]


def build_log_path(key: str | None = None) -> Path:
    return cache_root() / "build" / (key or current_key()) / "build.log"


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _build_into(final: Path, *, log: bool) -> None:
    go = find_go()
    key = final.name
    work = cache_root() / "build" / key
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "build.log"
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=final.parent))
    env = dict(os.environ)
    env.update(
        {
            "GOFLAGS": "-mod=mod -buildvcs=false",
            "GOTOOLCHAIN": "local",
            "GOWORK": "off",
            "CGO_ENABLED": "0",
        }
    )
    env["PATH"] = f"{go.parent}{os.pathsep}{env.get('PATH', '')}"
    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        with log_path.open("w") as log_file:
            for step in _steps():
                module = work / step.module_dir
                module.mkdir(exist_ok=True)
                (module / "go.mod").write_text(step.go_mod)
                names = ", ".join(step.binaries)
                if log:
                    typical = _minutes(TYPICAL_SECONDS.get(names, 0))
                    _say(f"building {names} (log: {log_path}); typically ~{typical}, once")
                log_file.write(f"== building {names} at {time.strftime('%H:%M:%S')}\n")
                log_file.flush()
                step_started = time.monotonic()
                output = staging / step.binaries[0] if len(step.binaries) == 1 else staging
                command = [
                    str(go),
                    "build",
                    "-trimpath",
                    "-ldflags",
                    step.ldflags,
                    "-o",
                    f"{output}{'/' if output == staging else ''}",
                    *step.packages,
                ]
                result = subprocess.run(
                    command,
                    cwd=module,
                    env=env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
                log_file.flush()
                if result.returncode != 0:
                    raise AssetsError(
                        f"building {names} from Go modules failed (go build exit "
                        f"{result.returncode}); last lines of {log_path}:\n{_tail(log_path)}"
                    )
                timings[names] = round(time.monotonic() - step_started, 1)
                log_file.write(f"== built {names} in {timings[names]}s\n")
                if log:
                    _say(f"built {names} in {timings[names]:.0f}s; {_left_after(names)}")
        missing = missing_binaries(staging)
        if missing:
            raise AssetsError(
                f"build finished without {', '.join(missing)}; see {log_path}:\n{_tail(log_path)}"
            )
        manifest = {
            "kubernetes": pins.KUBERNETES_VERSION,
            "kubernetes_staging": pins.KUBERNETES_STAGING_VERSION,
            "etcd": pins.ETCD_VERSION,
            "kwok": pins.KWOK_VERSION,
            "go": subprocess.run(
                [str(go), "version"], capture_output=True, text=True, check=False
            ).stdout.strip(),
            "build_seconds": round(time.monotonic() - started, 1),
            "step_seconds": timings,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        staging.chmod(0o755)
        if final.exists():  # an incomplete leftover; the lock says nobody else uses it
            shutil.rmtree(final)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if log:
        _say(f"built {', '.join(pins.BINARIES)} in {manifest['build_seconds']}s into {final}")


def manifest(directory: Path) -> dict[str, object]:
    """The build record next to cached binaries ({} for a user-supplied directory)."""
    try:
        loaded = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def llama_server_key() -> str:
    goos, goarch = _go_platform()
    return pins.llama_server_key(goos=goos, goarch=goarch)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def ensure_llama_server(*, build: bool = True, log: bool = True) -> Path:
    """Return the path of a `llama-server` executable (see the module docstring).

    With `build=False` a missing cache entry raises instead of building (minutes).
    """
    return _ensure_server(
        env=ENV_LLAMA_SERVER,
        what="a llama-server",
        final=cache_root() / "assets" / llama_server_key(),
        binary_name=pins.LLAMA_SERVER_BINARY,
        command="python -m flexinfer_devcluster.assets",
        build_into=_build_llama_server_into if build else None,
        log=log,
    )


def _ensure_server(
    *,
    env: str,
    what: str,
    final: Path,
    binary_name: str,
    command: str,
    build_into: Callable[..., None] | None,
    log: bool,
) -> Path:
    """The executable `$env` names, else the cached `final/binary_name`, built under the
    cache's lock by `build_into(final, log=...)` when missing (None: raise instead)."""
    explicit = os.environ.get(env)
    if explicit:
        binary = Path(explicit).expanduser()
        if not _is_executable(binary):
            raise AssetsError(
                f"${env}={binary} is not an executable file; point it at {what} "
                f"binary or unset it to build one into {cache_root() / 'assets'}"
            )
        return binary
    binary = final / binary_name

    def complete() -> bool:
        return (final / MANIFEST).is_file() and _is_executable(binary)

    if complete():
        return binary
    if build_into is None:
        raise AssetsError(f"no {what.split(' ', 1)[1]} at {binary}; run `{command}`")
    final.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(final.parent / f"{final.name}.lock", log=log):
        if complete():
            return binary
        build_into(final, log=log)
    return binary


def sdist_path() -> Path:
    """Where the pinned llama-cpp-python sdist is kept once downloaded."""
    version = pins.LLAMA_CPP_PYTHON_VERSION
    return cache_root() / "downloads" / f"llama_cpp_python-{version}.tar.gz"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch_sdist(*, log_file: IO[str], log: bool) -> Path:
    """The pinned sdist, downloaded with pip (hash-checked) unless already kept."""
    target = sdist_path()
    if target.is_file() and _sha256(target) == pins.LLAMA_CPP_PYTHON_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    version = pins.LLAMA_CPP_PYTHON_VERSION
    if log:
        _say(f"downloading the llama-cpp-python {version} sdist with pip")
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(
            f"llama-cpp-python=={version} --hash=sha256:{pins.LLAMA_CPP_PYTHON_SHA256}\n"
        )
        downloads = Path(scratch) / "out"
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--require-hashes", "--disable-pip-version-check", "-r", str(requirements),
            "-d", str(downloads),
        ]  # fmt: skip
        log_file.write(f"== {' '.join(command)}\n")
        log_file.flush()
        result = subprocess.run(
            command, stdout=log_file, stderr=subprocess.STDOUT, check=False, cwd=scratch
        )
        log_file.flush()
        found = sorted(downloads.glob("llama_cpp_python-*.tar.gz"))
        if result.returncode != 0 or not found:
            raise AssetsError(
                f"pip could not download the llama-cpp-python {version} sdist (exit "
                f"{result.returncode}); last lines of {log_file.name}:\n"
                f"{_tail(Path(log_file.name))}"
            )
        if _sha256(found[0]) != pins.LLAMA_CPP_PYTHON_SHA256:
            raise AssetsError(f"{found[0].name} does not match the pinned SHA-256")
        found[0].replace(target)
    return target


def _extract_llama_cpp(sdist: Path, destination: Path) -> Path:
    """Unpack only the vendored llama.cpp tree of the sdist; return its root."""
    prefix = f"llama_cpp_python-{pins.LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise AssetsError(f"{sdist} holds no {prefix}: not the sdist that was pinned")
        archive.extractall(destination, members=members, filter="data")
    return destination / prefix.rstrip("/")


def find_cmake() -> Path:
    """cmake from PATH, else the one the `dev` extra installs beside this interpreter
    (the `cmake` package on PyPI), so a machine with only Python and gcc can build."""
    found = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))
    if not found:
        raise AssetsError(
            "cmake is needed to build llama-server but is not on PATH; install it "
            f"(pip install cmake, apt-get install cmake) or set ${ENV_LLAMA_SERVER} to a "
            "llama-server binary"
        )
    return Path(found)


def ensure_cxx_compiler() -> None:
    """llama.cpp is C++: a machine with gcc alone gets g++ from its package manager when
    this runs as root (as CI does), else the error says what to install."""
    if shutil.which("c++") or shutil.which("g++"):
        return
    apt = shutil.which("apt-get")
    if apt and os.geteuid() == 0:
        print("flexinfer assets: installing g++ (apt-get) to build llama-server", file=sys.stderr)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run([apt, "update", "-qq"], check=False, env=env, timeout=600)
        subprocess.run([apt, "install", "-y", "-qq", "g++"], check=False, env=env, timeout=1200)
    if not (shutil.which("c++") or shutil.which("g++")):
        raise AssetsError(
            "a C++ compiler is needed to build llama-server (apt-get install g++), or set "
            f"${ENV_LLAMA_SERVER} to a llama-server binary"
        )


def _build_llama_server_into(final: Path, *, log: bool) -> None:
    cmake = find_cmake()
    ensure_cxx_compiler()
    work = cache_root() / "build" / final.name
    if work.exists():
        shutil.rmtree(work)  # the sources and objects of an interrupted build
    work.mkdir(parents=True)
    log_path = work / "build.log"
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        with log_path.open("w") as log_file:
            step_started = time.monotonic()
            sdist = _fetch_sdist(log_file=log_file, log=log)
            source = _extract_llama_cpp(sdist, work / "src")
            timings["fetch and unpack"] = round(time.monotonic() - step_started, 1)
            jobs = str(os.cpu_count() or 2)
            if log:
                _say(
                    f"building llama-server from llama-cpp-python "
                    f"{pins.LLAMA_CPP_PYTHON_VERSION} with {jobs} jobs (log: {log_path}); "
                    f"typically ~{_minutes(TYPICAL_SECONDS['llama-server'])}, once"
                )
            build_dir = work / "build"
            for step, command in (
                (
                    "configure",
                    [str(cmake), "-S", str(source), "-B", str(build_dir),
                     *pins.LLAMA_SERVER_CMAKE_FLAGS],
                ),
                (
                    "compile",
                    [str(cmake), "--build", str(build_dir), "--target",
                     pins.LLAMA_SERVER_BINARY, "--parallel", jobs],
                ),
            ):  # fmt: skip
                step_started = time.monotonic()
                log_file.write(f"== {step}: {' '.join(command)}\n")
                log_file.flush()
                result = subprocess.run(
                    command, stdout=log_file, stderr=subprocess.STDOUT, check=False, cwd=work
                )
                log_file.flush()
                if result.returncode != 0:
                    raise AssetsError(
                        f"building llama-server failed at cmake {step} (exit "
                        f"{result.returncode}); last lines of {log_path}:\n{_tail(log_path)}"
                    )
                timings[step] = round(time.monotonic() - step_started, 1)
            built = build_dir / "bin" / pins.LLAMA_SERVER_BINARY
            if not _is_executable(built):
                raise AssetsError(f"cmake finished without {built}; see {log_path}")
            shutil.copy2(built, staging / pins.LLAMA_SERVER_BINARY)
            version = subprocess.run(
                [str(staging / pins.LLAMA_SERVER_BINARY), "--version"],
                capture_output=True, text=True, check=False, timeout=60,
            )  # fmt: skip
            if version.returncode != 0:
                raise AssetsError(
                    f"the built llama-server does not run (--version exit "
                    f"{version.returncode}):\n{version.stderr[-2000:]}"
                )
        record = {
            "llama_cpp_python": pins.LLAMA_CPP_PYTHON_VERSION,
            "sdist_sha256": pins.LLAMA_CPP_PYTHON_SHA256,
            "cmake_flags": list(pins.LLAMA_SERVER_CMAKE_FLAGS),
            "llama_server_version": (version.stdout + version.stderr).strip().splitlines(),
            "cmake": subprocess.run(
                [str(cmake), "--version"], capture_output=True, text=True, check=False
            ).stdout.splitlines()[:1],
        }
        installed = _install(staging, final, record, started=started, timings=timings)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # The sources and objects are hundreds of megabytes; the log stays for the record.
    shutil.rmtree(work / "src", ignore_errors=True)
    shutil.rmtree(work / "build", ignore_errors=True)
    if log:
        seconds = float(str(installed["build_seconds"]))
        _say(f"built llama-server in {seconds:.0f}s into {final}; {_left_after('llama-server')}")


def _install(
    staging: Path,
    final: Path,
    record: Mapping[str, object],
    *,
    started: float,
    timings: Mapping[str, float],
) -> dict[str, object]:
    """Move a finished build from `staging` to `final` with its manifest (what makes it
    complete: `record` and the build's times, returned), under the cache's lock."""
    record = {
        **record,
        "build_seconds": round(time.monotonic() - started, 1),
        "step_seconds": dict(timings),
    }
    (staging / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
    staging.chmod(0o755)
    if final.exists():  # an incomplete leftover; the lock says nobody else uses it
        shutil.rmtree(final)
    staging.rename(final)
    return record


def ollama_key() -> str:
    goos, goarch = _go_platform()
    return pins.ollama_key(goos=goos, goarch=goarch)


def ensure_ollama(*, build: bool = True, log: bool = True) -> Path:
    """Return the path of an `ollama` executable (see the module docstring).

    With `build=False` a missing cache entry raises instead of building (minutes).
    """
    return _ensure_server(
        env=ENV_OLLAMA,
        what="an ollama",
        final=cache_root() / "assets" / ollama_key(),
        binary_name=pins.OLLAMA_BINARY,
        command="python -m flexinfer_devcluster.assets --ollama",
        build_into=_build_ollama_into if build else None,
        log=log,
    )


def _ollama_module_dir(go: Path, env: Mapping[str, str], work: Path, log_file: IO[str]) -> Path:
    """The `github.com/ollama/ollama` module's sources, downloaded through the Go module
    proxy into the module cache (read-only there)."""
    module = work / "download"
    module.mkdir(exist_ok=True)
    (module / "go.mod").write_text("module flexinfer.local/build/ollama-download\n\ngo 1.26.0\n")
    command = [
        str(go), "mod", "download", "-json", f"github.com/ollama/ollama@{pins.OLLAMA_VERSION}"
    ]  # fmt: skip
    log_file.write(f"== {' '.join(command)}\n")
    log_file.flush()
    result = subprocess.run(
        command, cwd=module, env=dict(env), capture_output=True, text=True, check=False
    )
    log_file.write(result.stdout + result.stderr)
    log_file.flush()
    try:
        directory = Path(json.loads(result.stdout)["Dir"])
    except (ValueError, KeyError, TypeError):
        directory = Path()
    if result.returncode != 0 or not (directory / "go.mod").is_file():
        raise AssetsError(
            f"go mod download of github.com/ollama/ollama@{pins.OLLAMA_VERSION} failed (exit "
            f"{result.returncode}); last lines of {log_file.name}:\n{_tail(Path(log_file.name))}"
        )
    return directory


def _extract_ollama_vendor(sdist: Path, destination: Path) -> None:
    """The sdist's llama.cpp third-party headers into `destination` (the module's
    `llama/llama.cpp/vendor`)."""
    prefix = f"llama_cpp_python-{pins.LLAMA_CPP_PYTHON_VERSION}/{pins.OLLAMA_VENDOR_PREFIX}"
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            if member.name.startswith(prefix) and member.name != prefix.rstrip("/"):
                member.name = member.name[len(prefix) :]
                members.append(member)
        if not members:
            raise AssetsError(f"{sdist} holds no {prefix}: not the sdist that was pinned")
        archive.extractall(destination, members=members, filter="data")


def _build_ollama_into(final: Path, *, log: bool) -> None:
    go = find_go()
    ensure_cxx_compiler()
    work = cache_root() / "build" / final.name
    if work.exists():
        shutil.rmtree(work)  # the sources of an interrupted build
    work.mkdir(parents=True)
    log_path = work / "build.log"
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    flags = " ".join(pins.OLLAMA_CGO_FLAGS)
    env = dict(os.environ)
    env.update(
        {
            "GOFLAGS": "-mod=mod -buildvcs=false",
            "GOTOOLCHAIN": "local",
            "GOWORK": "off",
            "CGO_ENABLED": "1",
            "CGO_CFLAGS": flags,
            "CGO_CXXFLAGS": flags,
        }
    )
    env["PATH"] = f"{go.parent}{os.pathsep}{env.get('PATH', '')}"
    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        with log_path.open("w") as log_file:
            step_started = time.monotonic()
            module = _ollama_module_dir(go, env, work, log_file)
            source = work / "src"
            shutil.copytree(module, source)
            for directory, _dirs, _files in os.walk(source):
                os.chmod(directory, 0o755)  # the module cache's copies are read-only
            sdist = _fetch_sdist(log_file=log_file, log=log)
            _extract_ollama_vendor(sdist, source / "llama" / "llama.cpp" / "vendor")
            timings["fetch and unpack"] = round(time.monotonic() - step_started, 1)
            if log:
                _say(
                    f"building ollama {pins.OLLAMA_VERSION} (cgo, CPU only, {flags}; log: "
                    f"{log_path}); this takes minutes once"
                )
            step_started = time.monotonic()
            version = pins.OLLAMA_VERSION.lstrip("v")
            command = [
                str(go), "build", "-trimpath",
                "-ldflags", f"-s -w -X github.com/ollama/ollama/version.Version={version}",
                "-o", str(staging / pins.OLLAMA_BINARY), ".",
            ]  # fmt: skip
            log_file.write(f"== {' '.join(command)} (CGO_CFLAGS={flags})\n")
            log_file.flush()
            result = subprocess.run(
                command, cwd=source, env=env, stdout=log_file, stderr=subprocess.STDOUT, check=False
            )
            log_file.flush()
            if result.returncode != 0:
                raise AssetsError(
                    f"building ollama failed (go build exit {result.returncode}); last lines "
                    f"of {log_path}:\n{_tail(log_path)}"
                )
            timings["go build"] = round(time.monotonic() - step_started, 1)
            answer = subprocess.run(
                [str(staging / pins.OLLAMA_BINARY), "--version"],
                capture_output=True, text=True, check=False, timeout=60,
                env={**os.environ, "OLLAMA_HOST": "127.0.0.1:1"},
            )  # fmt: skip
            if answer.returncode != 0 or version not in answer.stdout + answer.stderr:
                raise AssetsError(
                    f"the built ollama does not run (--version exit {answer.returncode}):\n"
                    f"{(answer.stdout + answer.stderr)[-2000:]}"
                )
        record = {
            "ollama": pins.OLLAMA_VERSION,
            "vendor_from": f"llama-cpp-python {pins.LLAMA_CPP_PYTHON_VERSION}",
            "sdist_sha256": pins.LLAMA_CPP_PYTHON_SHA256,
            "cgo_flags": list(pins.OLLAMA_CGO_FLAGS),
            "go": subprocess.run(
                [str(go), "version"], capture_output=True, text=True, check=False
            ).stdout.strip(),
        }
        installed = _install(staging, final, record, started=started, timings=timings)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(work / "src", ignore_errors=True)
    shutil.rmtree(work / "download", ignore_errors=True)
    if log:
        _say(f"built ollama in {installed['build_seconds']}s into {final}")


def ensure_all(*, log: bool = True) -> tuple[Path, Path]:
    """`ensure_assets()` and `ensure_llama_server()`, the two builds run at the same time
    when both are missing: each alone leaves a core idle for much of its time (Go links
    one binary at a time and waits on its largest packages; cmake on its last objects
    and its link), and together they take about their CPU time over two cores (docs/
    local-cluster.md). Each still builds under its own lock; an error of either is
    raised once both have stopped."""
    outcome: dict[str, Path | BaseException] = {}

    def build_llama_server() -> None:
        try:
            outcome["llama-server"] = ensure_llama_server(log=log)
        except BaseException as error:  # raised on the caller's thread below
            outcome["error"] = error

    beside = None
    if not _llama_server_cached():
        beside = threading.Thread(target=build_llama_server, name="llama-server build")
        beside.start()
    try:
        directory = ensure_assets(log=log)
    finally:
        if beside is not None:
            beside.join()
    error = outcome.get("error")
    if isinstance(error, BaseException):
        raise error
    built = outcome.get("llama-server")
    return directory, built if isinstance(built, Path) else ensure_llama_server(log=log)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(
            "usage: python -m flexinfer_devcluster.assets [--llama-server | --ollama]\n\n"
            f"Build (once) {', '.join(pins.BINARIES)} and llama-server, then print the "
            "directory holding the first six (with --llama-server: the path of "
            "llama-server). --ollama builds only ollama (for the tests that serve through "
            "it) and prints its path."
        )
        return 0
    unknown = [arg for arg in args if arg not in ("--llama-server", "--ollama")]
    if unknown or len(args) > 1:
        what = unknown[0] if unknown else " ".join(args)
        print(f"flexinfer assets: unknown argument {what!r} (see --help)", file=sys.stderr)
        return 2
    try:
        if "--ollama" in args:
            print(ensure_ollama())
            return 0
        directory, llama_server = ensure_all()
    except AssetsError as error:
        print(f"flexinfer assets: {error}", file=sys.stderr)
        return 1
    # One line on stdout, so `$(python -m flexinfer_devcluster.assets)/kubectl` works.
    print(llama_server if "--llama-server" in args else directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
