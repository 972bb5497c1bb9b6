"""`flexinfer bench` against the fake OpenAI backend (streaming and not), and through the
proxy, where a model that was not ready makes the first run wait for its swap.

No timing is asserted: what is checked is what each run counted and what the
summary says about it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from flexinfer_cli.__main__ import main
from tests.proxy.harness import BackendProcess, async_test, entry, running_proxy


@pytest.fixture(scope="module")
def backend() -> Iterator[BackendProcess]:
    process = BackendProcess("bench")
    try:
        yield process
    finally:
        process.stop()


def bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["bench", *args, "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_tokens_per_second_from_usage(
    backend: BackendProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = bench(
        capsys, "--url", backend.base, "--model", "m", "--runs", "3", "--max-tokens", "40"
    )
    assert code == 0
    assert data["url"] == f"{backend.base}/v1/chat/completions"
    assert [r["run"] for r in data["runs"]] == [1, 2, 3]
    assert all(r["status"] == 200 and r["completionTokens"] == 40 for r in data["runs"])
    assert all(
        r["tokensPerSecond"] > 0 and r["timeToFirstTokenSeconds"] is None for r in data["runs"]
    )
    assert data["summary"]["ok"] == 3 and data["summary"]["medianTokensPerSecond"] > 0
    # A plain backend is not the flexinfer proxy: nothing is said about a swap.
    assert data["coldBeforeFirstRun"] is None and data["summary"]["swapWaitSeconds"] is None


def test_streaming_times_the_first_token_and_counts_the_chunks(
    backend: BackendProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = bench(
        capsys,
        "--url",
        backend.endpoint,
        "--model",
        "m",
        "--runs",
        "2",
        "--max-tokens",
        "25",
        "--stream",
    )
    assert code == 0
    for run in data["runs"]:
        assert run["completionTokens"] == 25  # from the final usage chunk
        assert 0 < run["timeToFirstTokenSeconds"] <= run["seconds"]
        assert run["tokensPerSecond"] > 0
    assert data["summary"]["medianTimeToFirstTokenSeconds"] is not None


def test_the_table_and_a_failed_run(
    backend: BackendProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--url", backend.base, "--model", "m", "--runs", "2", "--stream"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["RUN", "STATUS", "SECONDS", "TTFT", "TOKENS", "TOKENS/S"]
    assert "m: 2/2 ok; median" in out
    code = main(
        ["bench", "--url", "http://127.0.0.1:9/", "--model", "m", "--runs", "1", "--timeout", "2"]
    )
    assert code == 1
    assert "run 1 failed (no answer)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runs", "0"], "--runs"),
        (["--max-tokens", "0"], "--max-tokens"),
    ],
)
def test_bad_usage(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", *args]) == 2
    assert message in capsys.readouterr().err
    assert main(["bench", "--url", "localhost:9", "--model", "m"]) == 2


@async_test
async def test_through_the_proxy_a_cold_model_waits_for_its_swap(
    backend: BackendProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_proxy([entry("cold", backend.endpoint, ready=False)]) as proxy:
        args = ["bench", "--url", proxy.url, "--model", "cold", "--runs", "3", "-o", "json"]
        running = asyncio.get_running_loop().run_in_executor(None, main, args)
        # The first request is held in the proxy's queue until the model is Ready.
        await proxy.queued("cold", 1)
        proxy.directory.set_ready("cold")
        assert await running == 0
    data = json.loads(capsys.readouterr().out)
    assert data["coldBeforeFirstRun"] is True
    assert [r["status"] for r in data["runs"]] == [200, 200, 200]
    assert data["summary"]["swapWaitSeconds"] is not None
