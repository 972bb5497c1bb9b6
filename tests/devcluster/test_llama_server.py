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


@pytest.fixture
def address() -> Iterator[AddressReservation]:
    reservation = reserve_address(PORT)
    yield reservation
    reservation.release()


def test_llama_server_loads_the_tiny_model_then_answers(
    llama_server: Path, tiny_model: Path, address: AddressReservation, tmp_path: Path
) -> None:
    base = f"http://{address.address}:{PORT}"
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [
            str(llama_server), "-m", str(tiny_model), "--host", address.address,
            "--port", str(PORT), "--alias", "tiny", "--n-gpu-layers", "999", "--ctx-size", "256",
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        seen: list[tuple[int, str]] = []
        deadline = time.monotonic() + 60
        while not seen or seen[-1][0] != 200:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, f"no 200 from /health; saw {seen[-3:]}"
            status, body = health(base)
            if status and (not seen or seen[-1][0] != status):
                seen.append((status, body))
            time.sleep(0.002)
        # The HTTP server listens before the model is loaded: loading first, then ok.
        assert [status for status, _ in seen] == [503, 200], seen
        assert "Loading model" in seen[0][1]

        plain = chat(base, "tiny", stream=False, max_tokens=12)
        assert plain["finish_reason"] == "length" and plain["model"] == "tiny"
        assert plain["content"].strip(), plain
        streamed = chat(base, "tiny", stream=True, max_tokens=12)
        assert streamed["finish_reason"] == "length"
        assert streamed["chunks"] >= 12 and streamed["content"].strip(), streamed
        # Random weights, but only letters and spaces: nonsense words, never raw bytes.
        assert set(plain["content"] + streamed["content"]) <= set("abcdefghijklmnopqrstuvwxyz ")
    finally:
        terminate_group(server, grace=10)
        log.close()
