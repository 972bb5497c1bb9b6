"""A tiny OpenAI-compatible backend for the proxy tests, run as its own process.

`python -m tests.proxy.fake_backend --name alpha [--host 127.0.0.2]` listens on a
free port and prints `PORT <n>` once it accepts connections. Request bodies may
carry test knobs: `tag` (recorded in arrival order, see GET /control/arrivals),
`status` (answer with that HTTP status, as JSON even when `stream` asks for
events), `delay` (seconds before answering),
`stream` (answer with server-sent events), `hold` (after the first event, wait
until POST /control/release {"tag": …}) and `pause` (after the first event, wait
that many seconds). Answers echo the backend's name, the path, the raw query, the
model (also as `received_model`, which the proxy never rewrites), the request's
headers, and carry `X-Backend: <name>`. SIGTERM stops it gracefully: it stops
accepting and lets answers in progress finish, as a serving pod's server does.
They are also OpenAI-shaped for `flexinfer bench`: `max_tokens` tokens (default 3)
in `choices` with `usage`, one streamed chunk per token, and a final usage chunk
when `stream_options.include_usage` asks for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections import defaultdict
from typing import Any

from aiohttp import web

STREAM_CHUNKS = 3


class Backend:
    def __init__(self, name: str) -> None:
        self.name = name
        self.arrivals: list[str] = []
        self.releases: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    def application(self) -> web.Application:
        # Large enough for the proxy's memory test (50 MB bodies).
        app = web.Application(client_max_size=128 * 1024 * 1024)
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            app.router.add_post(path, self.handle_openai)
        app.router.add_get("/control/arrivals", self.handle_arrivals)
        app.router.add_post("/control/release", self.handle_release)
        return app

    async def handle_openai(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        tag = str(body.get("tag", ""))
        self.arrivals.append(tag)
        if body.get("delay"):
            await asyncio.sleep(float(body["delay"]))
        echo = {
            "object": "test.echo",
            "backend": self.name,
            "path": request.path,
            "query": request.raw_path.partition("?")[2],
            "model": body.get("model"),
            "received_model": body.get("model"),
            "tag": tag,
            "authorization": request.headers.get("Authorization"),
            "headers": dict(request.headers),
        }
        tokens = int(body.get("max_tokens") or STREAM_CHUNKS)
        if body.get("stream") and not body.get("status"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(
                request,
                echo,
                hold=bool(body.get("hold")),
                pause=float(body.get("pause", 0)),
                tokens=tokens,
                usage=usage,
            )
        answer = {
            **echo,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "tok " * tokens},
                    "finish_reason": "length",
                }
            ],
            "usage": _usage(tokens),
        }
        return web.json_response(
            answer, status=int(body.get("status", 200)), headers={"X-Backend": self.name}
        )

    async def _stream(
        self,
        request: web.Request,
        echo: dict[str, Any],
        *,
        hold: bool,
        pause: float = 0.0,
        tokens: int = STREAM_CHUNKS,
        usage: bool = False,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Backend": self.name}
        )
        await response.prepare(request)
        for index in range(tokens):
            delta = {"index": 0, "delta": {"content": "tok "}}
            chunk = {**echo, "index": index, "choices": [delta]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if index == 0 and hold:
                await self.releases[echo["tag"]].wait()
            if index == 0 and pause:
                await asyncio.sleep(pause)
        if usage:
            final = {**echo, "choices": [], "usage": _usage(tokens)}
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def handle_arrivals(self, request: web.Request) -> web.Response:
        return web.json_response({"arrivals": self.arrivals})

    async def handle_release(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.releases[str(body["tag"])].set()
        return web.json_response({"released": body["tag"]})


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}


async def main(name: str, host: str) -> None:
    runner = web.AppRunner(Backend(name).application(), shutdown_timeout=30)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    print(f"PORT {port}", flush=True)
    # Run until the test suite closes our stdin, or SIGTERM.
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopped.set)
    loop.add_reader(sys.stdin.fileno(), stopped.set)
    await stopped.wait()
    loop.remove_reader(sys.stdin.fileno())
    await runner.cleanup()  # waits for answers in progress (up to shutdown_timeout)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.name, arguments.host))
