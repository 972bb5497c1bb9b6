"""A tiny OpenAI-compatible backend for the proxy tests, run as its own process.

`python -m tests.proxy.fake_backend --name alpha` listens on a free loopback port
and prints `PORT <n>` once it accepts connections. Request bodies may carry test
knobs: `tag` (recorded in arrival order, see GET /control/arrivals), `status`
(answer with that HTTP status), `delay` (seconds before answering), `stream`
(answer with server-sent events) and `hold` (after the first event, wait until
POST /control/release {"tag": …}). Answers echo the backend's name, the path, the
model and the request's Authorization header, and carry `X-Backend: <name>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
        app = web.Application()
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
            "query": request.query_string,
            "model": body.get("model"),
            "tag": tag,
            "authorization": request.headers.get("Authorization"),
        }
        if body.get("stream"):
            return await self._stream(request, echo, hold=bool(body.get("hold")))
        return web.json_response(
            echo, status=int(body.get("status", 200)), headers={"X-Backend": self.name}
        )

    async def _stream(
        self, request: web.Request, echo: dict[str, Any], *, hold: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Backend": self.name}
        )
        await response.prepare(request)
        for index in range(STREAM_CHUNKS):
            await response.write(f"data: {json.dumps({**echo, 'index': index})}\n\n".encode())
            if index == 0 and hold:
                await self.releases[echo["tag"]].wait()
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def handle_arrivals(self, request: web.Request) -> web.Response:
        return web.json_response({"arrivals": self.arrivals})

    async def handle_release(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.releases[str(body["tag"])].set()
        return web.json_response({"released": body["tag"]})


async def main(name: str) -> None:
    runner = web.AppRunner(Backend(name).application())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    print(f"PORT {port}", flush=True)
    # Run until the test suite closes our stdin (or kills us).
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    asyncio.run(main(parser.parse_args().name))
