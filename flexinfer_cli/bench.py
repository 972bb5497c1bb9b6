"""`flexinfer bench --url URL --model NAME`: tokens per second, as the docs measure them.

Each run is one chat completion (`POST …/v1/chat/completions`) with `max_tokens`.
Without `--stream`, tokens/s is `usage.completion_tokens` over the whole request.
With `--stream`, the time to first token is when the first chunk carrying content
arrives, and tokens/s is the tokens generated after it over the time after it
(`usage` of the final chunk when the server sends it, `stream_options.include_usage`
is asked for, else one token per content chunk). Through the flexinfer proxy,
`GET /v1/models` says whether the model was ready before the first run; if it was
not, the first run waited in the proxy's queue while the model was swapped in, and
that wait (its time to first byte beyond the warm runs' median) is reported as the
swap wait. Runs are sequential; the clock is the process's monotonic one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.error
import urllib.request
from typing import Any

import attrs

from flexinfer_cli.output import FAILED, FORMATS, OK, UsageError, emit, render_table

DEFAULT_PROMPT = "Write a short story about a GPU that is shared by several language models."


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "bench",
        help="tokens/s (and time to first token) of a model behind an OpenAI-compatible URL",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("--url", required=True, help="base URL (http://host:port, …/v1 accepted)")
    parser.add_argument("--model", required=True, help="the model name to ask for")
    parser.add_argument("--runs", type=int, default=5, help="requests, one after another (5)")
    parser.add_argument("--max-tokens", type=int, default=200, help="max_tokens per request (200)")
    parser.add_argument("--stream", action="store_true", help="stream, and time the first token")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds per request (a cold model's first request waits for its swap)",
    )
    parser.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    parser.add_argument("-o", "--output", choices=FORMATS, default="table")
    parser.set_defaults(run=run)


@attrs.frozen
class Run:
    number: int
    status: int
    seconds: float
    first_byte: float
    completion_tokens: int | None
    tokens_per_second: float | None
    first_token: float | None = None
    error: str = ""


def chat_url(base: str) -> str:
    base = base.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if base.endswith("/v1"):
        return f"{base}/chat/completions"
    return f"{base}/v1/chat/completions"


def models_url(base: str) -> str:
    return chat_url(base).removesuffix("/chat/completions") + "/models"


def run(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise UsageError("--runs: must be at least 1")
    if args.max_tokens < 1:
        raise UsageError("--max-tokens: must be at least 1")
    if not args.url.startswith(("http://", "https://")):
        raise UsageError(f"--url: {args.url!r} is not an http(s) URL")
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    cold = was_cold(args.url, args.model, headers=headers, timeout=args.timeout)
    runs = [one_run(number, args=args, headers=headers) for number in range(1, args.runs + 1)]
    data = summary(runs, args=args, cold=cold)
    emit(data, fmt=args.output, table=bench_text(data))
    return OK if all(r.status == 200 for r in runs) else FAILED


def was_cold(base: str, model: str, *, headers: dict[str, str], timeout: float) -> bool | None:
    """Through the flexinfer proxy: was `model` not ready before the first run (None:
    not a flexinfer proxy, or it does not know)."""
    request = urllib.request.Request(models_url(base), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=min(timeout, 30.0)) as response:
            body = json.load(response)
    except (OSError, ValueError):
        return None
    for card in body.get("data") or [] if isinstance(body, dict) else []:
        extra = card.get("flexinfer") if isinstance(card, dict) else None
        if isinstance(extra, dict) and model in (card.get("id"), extra.get("name")):
            return not bool(extra.get("ready"))
    return None


def one_run(number: int, *, args: argparse.Namespace, headers: dict[str, str]) -> Run:
    payload: dict[str, Any] = {
        "model": args.model,
        "messages": [{"role": "user", "content": args.prompt}],
        "max_tokens": args.max_tokens,
        "stream": bool(args.stream),
    }
    if args.stream:
        payload["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(
        chat_url(args.url), data=json.dumps(payload).encode(), headers=headers, method="POST"
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            first_byte = time.perf_counter() - started
            if args.stream:
                return _streamed(number, response, started=started, first_byte=first_byte)
            body = json.load(response)
    except urllib.error.HTTPError as error:
        elapsed = time.perf_counter() - started
        detail = error.read().decode(errors="replace")[:300]
        return Run(number, error.code, elapsed, elapsed, None, None, error=detail)
    except (OSError, ValueError) as error:
        elapsed = time.perf_counter() - started
        return Run(number, 0, elapsed, elapsed, None, None, error=str(error))
    elapsed = time.perf_counter() - started
    tokens = _completion_tokens(body)
    rate = tokens / elapsed if tokens is not None and elapsed > 0 else None
    return Run(number, 200, elapsed, first_byte, tokens, rate)


def _streamed(number: int, response: Any, *, started: float, first_byte: float) -> Run:
    first_token: float | None = None
    chunks = 0
    usage_tokens: int | None = None
    for raw in response:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if _has_content(chunk):
            chunks += 1
            if first_token is None:
                first_token = time.perf_counter() - started
        tokens = _completion_tokens(chunk)
        if tokens is not None:
            usage_tokens = tokens
    elapsed = time.perf_counter() - started
    tokens = usage_tokens if usage_tokens is not None else chunks
    rate = None
    if first_token is not None and tokens > 1 and elapsed > first_token:
        # The first token's latency is the time to first token; the rate is the rest.
        rate = (tokens - 1) / (elapsed - first_token)
    return Run(number, 200, elapsed, first_byte, tokens, rate, first_token=first_token)


def _has_content(chunk: Any) -> bool:
    for choice in (chunk.get("choices") or []) if isinstance(chunk, dict) else []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and delta.get("content"):
            return True
    return False


def _completion_tokens(body: Any) -> int | None:
    usage = body.get("usage") if isinstance(body, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def summary(runs: list[Run], *, args: argparse.Namespace, cold: bool | None) -> dict[str, Any]:
    good = [r for r in runs if r.status == 200]
    rates = [r.tokens_per_second for r in good if r.tokens_per_second is not None]
    firsts = [r.first_token for r in good if r.first_token is not None]
    swap_wait = None
    if cold and len(good) >= 2 and good[0].number == 1:
        warm = statistics.median(r.first_byte for r in good[1:])
        swap_wait = max(0.0, good[0].first_byte - warm)
    return {
        "url": chat_url(args.url),
        "model": args.model,
        "stream": bool(args.stream),
        "maxTokens": args.max_tokens,
        "coldBeforeFirstRun": cold,
        "runs": [
            {
                "run": r.number,
                "status": r.status,
                "seconds": round(r.seconds, 4),
                "firstByteSeconds": round(r.first_byte, 4),
                "timeToFirstTokenSeconds": None
                if r.first_token is None
                else round(r.first_token, 4),
                "completionTokens": r.completion_tokens,
                "tokensPerSecond": None
                if r.tokens_per_second is None
                else round(r.tokens_per_second, 2),
                "error": r.error or None,
            }
            for r in runs
        ],
        "summary": {
            "ok": len(good),
            "failed": len(runs) - len(good),
            "medianTokensPerSecond": round(statistics.median(rates), 2) if rates else None,
            "medianTimeToFirstTokenSeconds": round(statistics.median(firsts), 4)
            if firsts
            else None,
            "swapWaitSeconds": None if swap_wait is None else round(swap_wait, 3),
        },
    }


def bench_text(data: dict[str, Any]) -> str:
    headers = ["run", "status", "seconds", "tokens", "tokens/s"]
    if data["stream"]:
        headers.insert(3, "ttft")
    rows = []
    for r in data["runs"]:
        row: list[Any] = [
            r["run"],
            r["status"],
            f"{r['seconds']:.3f}",
            r["completionTokens"],
            "-" if r["tokensPerSecond"] is None else f"{r['tokensPerSecond']:.1f}",
        ]
        if data["stream"]:
            ttft = r["timeToFirstTokenSeconds"]
            row.insert(3, "-" if ttft is None else f"{ttft:.3f}")
        rows.append(row)
    s = data["summary"]
    lines = [render_table(headers, rows), ""]
    median = s["medianTokensPerSecond"]
    lines.append(
        f"{data['model']}: {s['ok']}/{s['ok'] + s['failed']} ok; median "
        f"{'-' if median is None else f'{median:.1f}'} tokens/s"
        + (
            f"; median time to first token {s['medianTimeToFirstTokenSeconds']:.3f} s"
            if s["medianTimeToFirstTokenSeconds"] is not None
            else ""
        )
    )
    if data["coldBeforeFirstRun"]:
        wait = s["swapWaitSeconds"]
        lines.append(
            "the model was not ready before run 1: it waited in the proxy's queue while it "
            "was swapped in"
            + ("" if wait is None else f" (swap wait ≈ {wait:.2f} s beyond a warm request)")
        )
    failures = [r for r in data["runs"] if r["status"] != 200]
    for r in failures:
        lines.append(f"run {r['run']} failed ({r['status'] or 'no answer'}): {r['error']}")
    return "\n".join(lines)
