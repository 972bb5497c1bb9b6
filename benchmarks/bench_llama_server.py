"""Figures for the real model server of the local cluster, printed as JSON.

- build: the cold build of `llama-server`, read from the record the assets step wrote
  when it built the cache in use (`versions.json`: total and per step).
- load: over `--starts` runs, seconds from spawning `llama-server` on the tiny model
  (`--n-gpu-layers 999 --ctx-size 256`, as rendered) to its first `/health` answer
  (503 "Loading model") and to its first 200; then the time to the first streamed token
  and to a whole 32-token completion. The tiny model is written fresh (seed 0).

    python benchmarks/bench_llama_server.py [--starts 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from flexinfer_devcluster.assets import ensure_llama_server, manifest
from flexinfer_devcluster.processes import terminate_group
from flexinfer_devcluster.processnode import reserve_address
from flexinfer_devcluster.tinymodel import write_tiny_model

PORT = 8000


def _health(base: str) -> int:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, OSError):
        return 0


def _completion(base: str, *, stream: bool) -> float:
    """Seconds to the first streamed content (stream) or to the whole answer."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 32,
        "stream": stream,
    }
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    began = time.monotonic()
    with urllib.request.urlopen(request, timeout=30) as response:
        if not stream:
            response.read()
            return time.monotonic() - began
        for line in response:
            if b'"content":"' in line:
                return time.monotonic() - began
    raise RuntimeError("the stream carried no content")


def one_start(binary: Path, model: Path) -> dict[str, float]:
    reservation = reserve_address(PORT)
    base = f"http://{reservation.address}:{PORT}"
    argv = [
        str(binary), "-m", str(model), "--host", reservation.address, "--port", str(PORT),
        "--alias", "tiny", "--n-gpu-layers", "999", "--ctx-size", "256",
    ]  # fmt: skip
    began = time.monotonic()
    server = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    first_answer: float | None = None
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"llama-server exited with {server.returncode}")
            status = _health(base)
            now = time.monotonic() - began
            if status and first_answer is None:
                first_answer = now
            if status == 200:
                ready = now
                break
            time.sleep(0.002)
        first_token = _completion(base, stream=True)
        whole = _completion(base, stream=False)
    finally:
        terminate_group(server, grace=10)
        reservation.release()
    return {
        "first_health_answer_s": round(first_answer or ready, 3),
        "healthy_s": round(ready, 3),
        "first_token_s": round(first_token, 4),
        "completion_32_tokens_s": round(whole, 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    binary = ensure_llama_server()
    with tempfile.TemporaryDirectory(prefix="flexinfer-bench-") as scratch:
        model = write_tiny_model(Path(scratch) / "tiny.gguf", seed=0)
        runs = [one_start(binary, model) for _ in range(args.starts)]
        size = model.stat().st_size
    record = manifest(binary.parent)

    def median(key: str) -> float:
        return round(statistics.median(run[key] for run in runs), 4)

    result: dict[str, Any] = {
        "llama_server": str(binary),
        "build": {
            "llama_cpp_python": record.get("llama_cpp_python"),
            "seconds": record.get("build_seconds"),
            "steps": record.get("step_seconds"),
        },
        "tiny_model_bytes": size,
        "runs": runs,
        "median": {key: median(key) for key in runs[0]},
    }
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
