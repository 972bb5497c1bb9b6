"""The Hugging Face download script, run for real against a fake Hub and a fake CDN on
loopback: what it fetches, what it verifies, where the token goes. No package is
installed: the script is run with this interpreter's standard library only (`-I -S`)."""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flexinfer_k8s.render.cache import CacheImages, cache_from_k8s, download_job
from flexinfer_k8s.render.hf_download import HF_DOWNLOAD

FILES = {
    "config.json": b'{"model_type": "qwen3"}',
    "model-q4.gguf": b"GGUF" + bytes(range(256)) * 64,
    "mlc/params_shard_0.bin": b"weights",
    "mlc/sub/lib.so": b"lib",
}
LARGE = {"model-q4.gguf", "mlc/params_shard_0.bin"}
COMMIT = "c0ffee"


class Fake:
    """The Hub (model info, resolve → redirect) and the CDN it redirects large files to."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []  # (server, path, Authorization)
        self.lie_about: str | None = None
        self.hub = self._serve("hub")
        self.cdn = self._serve("cdn")

    def _serve(self, role: str) -> http.server.ThreadingHTTPServer:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.seen.append((role, self.path, self.headers.get("Authorization")))
                fake.answer(role, self)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def url(self, server: http.server.ThreadingHTTPServer) -> str:
        return f"http://127.0.0.1:{server.server_address[1]}"

    def answer(self, role: str, handler: http.server.BaseHTTPRequestHandler) -> None:
        path = handler.path
        if role == "hub" and path == "/api/models/org/repo/revision/main?blobs=true":
            siblings = []
            for name, data in FILES.items():
                entry: dict[str, Any] = {"rfilename": name, "size": len(data)}
                if name in LARGE:
                    digest = hashlib.sha256(data).hexdigest()
                    entry["lfs"] = {"sha256": "0" * 64 if name == self.lie_about else digest}
                siblings.append(entry)
            return self._send(handler, 200, json.dumps({"sha": COMMIT, "siblings": siblings})
                              .encode())
        prefix = f"/org/repo/resolve/{COMMIT}/"
        if role == "hub" and path.startswith(prefix):
            name = path.removeprefix(prefix)
            if name in LARGE:  # large files come from the CDN, as on the Hub
                handler.send_response(302)
                handler.send_header("Location", f"{self.url(self.cdn)}/blob/{name}")
                handler.end_headers()
                return None
            return self._send(handler, 200, FILES[name])
        if role == "cdn" and path.startswith("/blob/"):
            return self._send(handler, 200, FILES[path.removeprefix("/blob/")])
        return self._send(handler, 404, b"not found")

    @staticmethod
    def _send(handler: http.server.BaseHTTPRequestHandler, code: int, body: bytes) -> None:
        handler.send_response(code)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def close(self) -> None:
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()


@pytest.fixture
def fake() -> Iterator[Fake]:
    hub = Fake()
    yield hub
    hub.close()


def download(fake: Fake, target: Path, *, pattern: str = "", token: str = "",
             repo: str = "org/repo", max_kib: int = 0) -> subprocess.CompletedProcess[str]:
    env = {"HF_ENDPOINT": fake.url(fake.hub), "FLEXINFER_REPO": repo,
           "FLEXINFER_PATTERN": pattern, "FLEXINFER_TARGET": str(target), "HF_TOKEN": token,
           "FLEXINFER_MAX_KIB": str(max_kib or "")}
    # -I -S: no site-packages, so no huggingface_hub or anything else could help.
    return subprocess.run([sys.executable, "-I", "-S", "-c", HF_DOWNLOAD], env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_job_installs_nothing_at_run_time() -> None:
    obj = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
           "metadata": {"name": "c", "namespace": "n", "uid": "u"},
           "spec": {"source": "HF://org/repo", "storageStrategy": "SharedPVC"}}
    container = download_job(cache_from_k8s(obj), CacheImages())["spec"]["template"]["spec"][
        "containers"][0]
    script = container["command"][2]
    assert "pip" not in script
    assert "huggingface_hub" not in script


def test_the_whole_repository_is_fetched_and_verified(fake: Fake, tmp_path: Path) -> None:
    result = download(fake, tmp_path / "copy")
    assert result.returncode == 0, result.stderr
    for name, data in FILES.items():
        assert (tmp_path / "copy" / name).read_bytes() == data
    assert not list((tmp_path / "copy").rglob("*.partial"))


def test_a_pattern_fetches_that_file_or_that_directory_only(fake: Fake, tmp_path: Path) -> None:
    assert download(fake, tmp_path / "one", pattern="model-q4.gguf").returncode == 0
    assert sorted(p.name for p in (tmp_path / "one").rglob("*") if p.is_file()) == [
        "model-q4.gguf"]
    assert download(fake, tmp_path / "dir", pattern="mlc").returncode == 0
    assert sorted(str(p.relative_to(tmp_path / "dir")) for p in (tmp_path / "dir").rglob("*")
                  if p.is_file()) == ["mlc/params_shard_0.bin", "mlc/sub/lib.so"]
    nothing = download(fake, tmp_path / "none", pattern="missing.gguf")
    assert nothing.returncode != 0 and "nothing matches missing.gguf" in nothing.stderr


def test_the_token_goes_to_the_hub_only_never_to_the_cdn(fake: Fake, tmp_path: Path) -> None:
    result = download(fake, tmp_path / "copy", token="hf_secret")
    assert result.returncode == 0, result.stderr
    hub = [auth for role, _, auth in fake.seen if role == "hub"]
    cdn = [auth for role, _, auth in fake.seen if role == "cdn"]
    assert hub and all(auth == "Bearer hf_secret" for auth in hub)
    assert cdn and all(auth is None for auth in cdn)
    assert "hf_secret" not in result.stdout + result.stderr


def test_a_large_file_that_is_not_what_the_hub_says_fails_the_download(
    fake: Fake, tmp_path: Path
) -> None:
    fake.lie_about = "model-q4.gguf"
    result = download(fake, tmp_path / "copy")
    assert result.returncode != 0
    assert "model-q4.gguf has sha256" in result.stderr
    assert not (tmp_path / "copy" / "model-q4.gguf").exists()
    assert not (tmp_path / "copy" / "model-q4.gguf.partial").exists()


def test_a_refused_repository_says_its_status(fake: Fake, tmp_path: Path) -> None:
    result = download(fake, tmp_path / "copy", repo="org/gated")
    assert result.returncode != 0 and "org/gated: 404" in result.stderr


def test_a_repository_larger_than_a_node_caches_bound_is_refused_before_any_file(
    fake: Fake, tmp_path: Path
) -> None:
    total = sum(len(data) for data in FILES.values())  # about 16 KiB
    result = download(fake, tmp_path / "copy", max_kib=8)
    assert result.returncode != 0
    assert f"{total} bytes, more than the cache's 8192" in result.stderr
    assert not [p for p in (tmp_path / "copy").rglob("*") if p.is_file()]
    assert not [role for role, path, _ in fake.seen if "/resolve/" in path]
    assert download(fake, tmp_path / "fits", max_kib=64).returncode == 0
