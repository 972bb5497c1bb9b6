"""The cached llama-server serves the generated tiny model: /health says 503 while it
loads and 200 after, and chat completions come back, streamed and not."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexinfer_devcluster.processes import terminate_group
from flexinfer_devcluster.processnode import AddressReservation, reserve_address
from tests.devcluster.chat import chat, health

PORT = 8000
STARTS = 3
"""The tiny model can load in ~15 ms, so one start may show no 503 to a poller that was
not scheduled in time; it gets this many starts to see one."""


@pytest.fixture
def address() -> Iterator[AddressReservation]:
    reservation = reserve_address(PORT)
    yield reservation
    reservation.release()


def _start(binary: Path, model: Path, address: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(
            [
                str(binary), "-m", str(model), "--host", address, "--port", str(PORT),
                "--alias", "tiny", "--n-gpu-layers", "999", "--ctx-size", "256",
            ],
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _health_until_ok(
    server: subprocess.Popen[bytes], base: str, log: Path
) -> list[tuple[int, str]]:
    """The /health answers from start to the first 200, repeats and refusals left out."""
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + 60
    while not seen or seen[-1][0] != 200:
        assert server.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, f"no 200 from /health; saw {seen[-3:]}"
        status, body = health(base)
        if status and (not seen or seen[-1][0] != status):
            seen.append((status, body))
    return seen


def test_llama_server_loads_the_tiny_model_then_answers(
    llama_server: Path, tiny_model: Path, address: AddressReservation, tmp_path: Path
) -> None:
    base, log = f"http://{address.address}:{PORT}", tmp_path / "server.log"
    sequences = []
    server = None
    try:
        for _ in range(STARTS):
            if server is not None:
                terminate_group(server, grace=10)
            server = _start(llama_server, tiny_model, address.address, log)
            sequences.append(_health_until_ok(server, base, log))
            if len(sequences[-1]) > 1:
                break
        # The HTTP server listens before the model is loaded: loading first, then ok,
        # and never loading again once ok.
        assert all([s for s, _ in seq] in ([503, 200], [200]) for seq in sequences), sequences
        assert [s for s, _ in sequences[-1]] == [503, 200], sequences
        assert "Loading model" in sequences[-1][0][1]

        plain = chat(base, "tiny", stream=False, max_tokens=12)
        assert plain["finish_reason"] == "length" and plain["model"] == "tiny"
        assert plain["content"].strip(), plain
        streamed = chat(base, "tiny", stream=True, max_tokens=12)
        assert streamed["finish_reason"] == "length"
        assert streamed["chunks"] >= 12 and streamed["content"].strip(), streamed
        # Random weights, but only letters and spaces: nonsense words, never raw bytes.
        assert set(plain["content"] + streamed["content"]) <= set("abcdefghijklmnopqrstuvwxyz ")
    finally:
        if server is not None:
            terminate_group(server, grace=10)
