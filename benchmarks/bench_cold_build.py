"""Benchmark: where a cold build of the local cluster's binaries spends its CPU.

Builds what `make demo` builds on a fresh machine (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kubectl, kwok, and llama-server), each as
`flexinfer_devcluster.assets` does (same go.mod files, flags and cmake options), but
into a throwaway directory, with an empty Go build cache, and with every compiler run
measured: `go build -toolexec` and cmake's compiler launcher run each compile through
this file, which records the child's user + system CPU seconds (a child's CPU time does
not depend on what else the machine runs, so the shares hold on a loaded machine; the
wall times printed beside them do not).

Go module downloads are not measured here (the machine's module cache is used as it
is); `--download` times `go mod download` of each step into an empty module cache.

Prints one JSON object: per step the total CPU, the wall time, and the most expensive
packages (Go: by import path; llama.cpp: by source file); with `--all`, every one.

    .venv/bin/python benchmarks/bench_cold_build.py [--go-only | --llama-only] [--top 25]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flexinfer_devcluster import asset_versions as pins  # noqa: E402
from flexinfer_devcluster import assets  # noqa: E402

METER_LOG = "FLEXINFER_BUILD_METER_LOG"


def meter(argv: list[str]) -> int:
    """Run `argv` (a compiler or Go tool) and append its CPU seconds to the meter log."""
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = subprocess.call(argv)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    record = {
        "tool": Path(argv[0]).name,
        "what": _subject(argv),
        "cpu": round(cpu, 3),
        "wall": round(time.monotonic() - started, 3),
    }
    with open(os.environ[METER_LOG], "a") as log:
        log.write(json.dumps(record) + "\n")
    return code


def _subject(argv: list[str]) -> str:
    """What one tool run builds: a Go package (`-p path`) or a C/C++ source file."""
    if "-p" in argv:
        return argv[argv.index("-p") + 1]
    if "-c" in argv:
        for arg in argv[argv.index("-c") + 1 :]:
            if arg.endswith((".c", ".cpp", ".cc")):
                return arg
        for arg in argv:
            if arg.endswith((".c", ".cpp", ".cc")):
                return arg
    if "-o" in argv:
        return "link " + Path(argv[argv.index("-o") + 1]).name
    return " ".join(Path(a).name for a in argv[:2])


def _wrapper(directory: Path) -> Path:
    script = directory / "meter"
    script.write_text(
        f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} --meter \"$@\"\n"
    )
    script.chmod(0o755)
    return script


def _summary(log: Path, *, top: int, wall: float, short: str = "") -> dict[str, Any]:
    by_subject: dict[str, float] = defaultdict(float)
    by_tool: dict[str, float] = defaultdict(float)
    runs = 0
    if log.exists():
        for line in log.read_text().splitlines():
            record = json.loads(line)
            runs += 1
            subject = str(record["what"]).removeprefix(short)
            by_subject[subject] += record["cpu"]
            by_tool[record["tool"]] += record["cpu"]
    total = sum(by_subject.values())
    ranked = sorted(by_subject.items(), key=lambda item: -item[1])
    return {
        "cpu_seconds": round(total, 1),
        "wall_seconds": round(wall, 1),
        "tool_runs": runs,
        "cpu_by_tool": {tool: round(cpu, 1) for tool, cpu in sorted(by_tool.items())},
        "top": [
            {"what": what, "cpu": round(cpu, 1), "share": round(cpu / total, 4) if total else 0}
            for what, cpu in ranked[:top]
        ],
    }


def build_go(work: Path, *, top: int, download: bool) -> dict[str, Any]:
    go = assets.find_go()
    meter_script = _wrapper(work)
    env = dict(os.environ)
    env.update(
        {
            "GOFLAGS": "-mod=mod -buildvcs=false",
            "GOTOOLCHAIN": "local",
            "GOWORK": "off",
            "CGO_ENABLED": "0",
            "GOCACHE": str(work / "gocache"),  # cold: nothing compiled yet
        }
    )
    results: dict[str, Any] = {}
    for step in assets._steps():
        module = work / step.module_dir
        module.mkdir()
        (module / "go.mod").write_text(step.go_mod)
        name = ", ".join(step.binaries)
        if download:
            fresh = dict(env, GOMODCACHE=str(work / f"modcache-{step.module_dir}"))
            started = time.monotonic()
            # `go mod download` of the build list needs the go.sum `go build` makes;
            # `go list -deps` resolves and downloads exactly what the build reads.
            subprocess.run(
                [str(go), "list", "-deps", *step.packages],
                cwd=module,
                env=fresh,
                stdout=subprocess.DEVNULL,
                check=True,
            )
            download_seconds = round(time.monotonic() - started, 1)
        log = work / f"meter-{step.module_dir}.jsonl"
        env[METER_LOG] = str(log)
        started = time.monotonic()
        subprocess.run(
            [
                str(go), "build", "-trimpath", "-toolexec", str(meter_script),
                "-ldflags", step.ldflags, "-o", str(work / "bin") + "/", *step.packages,
            ],
            cwd=module,
            env=env,
            check=True,
        )  # fmt: skip
        results[name] = _summary(log, top=top, wall=time.monotonic() - started)
        if download:
            results[name]["download_seconds"] = download_seconds
    return results


def build_llama(work: Path, *, top: int) -> dict[str, Any]:
    cmake = assets.find_cmake()
    meter_script = _wrapper(work)
    sdist = assets.sdist_path()
    if not sdist.exists():
        raise SystemExit(f"{sdist} is missing: run `make assets` once first")
    source = assets._extract_llama_cpp(sdist, work / "src")
    build = work / "build"
    log = work / "meter-llama.jsonl"
    env = dict(os.environ, **{METER_LOG: str(log)})
    jobs = str(os.cpu_count() or 2)
    started = time.monotonic()
    subprocess.run(
        [
            str(cmake), "-S", str(source), "-B", str(build), *pins.LLAMA_SERVER_CMAKE_FLAGS,
            f"-DCMAKE_C_COMPILER_LAUNCHER={meter_script}",
            f"-DCMAKE_CXX_COMPILER_LAUNCHER={meter_script}",
        ],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    subprocess.run(
        [str(cmake), "--build", str(build), "--target", pins.LLAMA_SERVER_BINARY,
         "--parallel", jobs],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return {
        "llama-server": _summary(
            log, top=top, wall=time.monotonic() - started, short=str(source) + "/"
        )
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--meter":
        raise SystemExit(meter(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--go-only", action="store_true")
    parser.add_argument("--llama-only", action="store_true")
    parser.add_argument("--download", action="store_true", help="also time module downloads")
    parser.add_argument("--top", type=int, default=25, help="packages/files listed per step")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flexinfer-cold-build-"))
    result: dict[str, Any] = {"cpus": os.cpu_count(), "work": str(work)}
    try:
        if not args.llama_only:
            result["go"] = build_go(work, top=args.top, download=args.download)
        if not args.go_only:
            result["llama"] = build_llama(work, top=args.top)
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
