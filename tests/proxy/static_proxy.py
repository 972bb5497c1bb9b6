"""The real proxy process over a static model list, for hostile tests and benchmarks.

    python -m tests.proxy.static_proxy --models '[{"name": "m", "endpoint": "..."}]' \\
        [any flag of python -m flexinfer_proxy]

Everything but the directory and the demand sink is the production path: the same
flag parser and `ProxyConfig`, `serve`, the event loop `--event-loop` picks. It
prints `PORT <proxy> CONTROL <control>` once both listen. The control server (its
own port, never the proxy's) answers:

- `GET /control/tasks`: `{"tasks": n}`, the asyncio tasks alive in the process;
- `POST /control/put`: an entry (the `--models` format) replaces the one of its name;
- `GET /control/depth?model=NAME`: how many requests wait for it.

It runs until stdin closes or SIGTERM, then shuts down like the proxy does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from aiohttp import web

from flexinfer_proxy.__main__ import (
    build_parser,
    config_from,
    freeze_startup_objects,
    run_on_loop,
)
from flexinfer_proxy.app import Proxy, serve
from flexinfer_proxy.demand import WRITTEN, MarkOutcome, QueueReport
from flexinfer_proxy.directory import InMemoryDirectory, ModelEntry, ModelKind
from flexinfer_proxy.resolve_file import HostsFileResolver


class NullSink:
    async def mark_active(self, entry: ModelEntry, *, now: datetime) -> MarkOutcome:
        return MarkOutcome(WRITTEN)

    async def report_queue(
        self, entry: ModelEntry, report: QueueReport | None, *, now: datetime
    ) -> None:
        return None

    async def withdraw(
        self, entry: ModelEntry, *, written: datetime, restore: datetime | None
    ) -> str:
        return WRITTEN


def entry_from(spec: dict[str, Any]) -> ModelEntry:
    return ModelEntry(
        name=spec["name"],
        namespace=spec.get("namespace", "test"),
        kind=ModelKind.MODEL,
        ready=spec.get("ready", True),
        endpoint=spec["endpoint"],
        phase="Ready" if spec.get("ready", True) else "Idle",
        served_name=spec.get("served_name"),
    )


async def run(models: list[dict[str, Any]], argv: Sequence[str]) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    directory = InMemoryDirectory([entry_from(spec) for spec in models])
    resolver = HostsFileResolver(args.resolve_file) if args.resolve_file else None
    proxy = Proxy(directory, NullSink(), config=config_from(args), resolver=resolver)
    runner, port = await serve(proxy, host=args.host, port=args.port)

    async def tasks(request: web.Request) -> web.Response:
        return web.json_response({"tasks": len(asyncio.all_tasks())})

    async def put(request: web.Request) -> web.Response:
        directory.put(entry_from(await request.json()))
        return web.json_response({"ok": True})

    async def depth(request: web.Request) -> web.Response:
        return web.json_response({"depth": proxy.queues.depth(f"test/{request.query['model']}")})

    control = web.Application()
    control.router.add_get("/control/tasks", tasks)
    control.router.add_post("/control/put", put)
    control.router.add_get("/control/depth", depth)
    control_runner = web.AppRunner(control, access_log=None)
    await control_runner.setup()
    site = web.TCPSite(control_runner, "127.0.0.1", 0)
    await site.start()
    freeze_startup_objects()
    print(f"PORT {port} CONTROL {site.port}", flush=True)

    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopped.set)

    def stdin_readable() -> None:
        if not os.read(sys.stdin.fileno(), 4096):
            stopped.set()

    loop.add_reader(sys.stdin.fileno(), stdin_readable)
    await stopped.wait()
    loop.remove_reader(sys.stdin.fileno())
    await runner.cleanup()
    await control_runner.cleanup()


def main() -> None:
    argv = sys.argv[1:]
    index = argv.index("--models")
    models = json.loads(argv[index + 1])
    rest = argv[:index] + argv[index + 2 :]
    run_on_loop(run(models, rest), event_loop=build_parser().parse_args(rest).event_loop)


if __name__ == "__main__":
    main()
