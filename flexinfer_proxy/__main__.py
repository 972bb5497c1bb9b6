"""`python -m flexinfer_proxy`: parse flags, connect to the cluster, serve until signalled.

Thin on purpose: it builds the kubernetes-backed directory and demand sink, hands
them to `Proxy`, and runs the aiohttp server. Without `--kubeconfig` it uses the
in-cluster ServiceAccount; without `--namespace` it watches every namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta

from flexinfer_core.durations import parse_duration
from flexinfer_core.errors import FlexinferError
from flexinfer_kube.kubeapi import KubeApi, new_api_client
from flexinfer_proxy.app import Proxy, ProxyConfig, serve
from flexinfer_proxy.kube_demand import KubeDemandSink
from flexinfer_proxy.kube_directory import KubeDirectory

log = logging.getLogger("flexinfer.proxy")


def _endpoint_override(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected NAME=http://host:port/v1, got {text!r}")
    return name, url


def _duration_seconds(text: str) -> float:
    try:
        return parse_duration(text, field="--min-queue-wait").total_seconds()
    except FlexinferError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flexinfer_proxy",
        description="OpenAI-compatible proxy: routes to the active model, queues, signals demand.",
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="namespace to route models from (repeatable; default: all namespaces)",
    )
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: the in-cluster config, else ~/.kube/config)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    parser.add_argument(
        "--endpoint",
        action="append",
        default=[],
        type=_endpoint_override,
        metavar="NAME=URL",
        help="send model NAME to URL (ending in /v1) instead of its Service (repeatable)",
    )
    parser.add_argument(
        "--min-queue-wait",
        type=_duration_seconds,
        default=60.0,
        metavar="DURATION",
        help="shortest queue wait (default 60s; a longer coldStartTimeout extends it)",
    )
    parser.add_argument("--retry-after", type=int, default=10, help="Retry-After seconds on 503")
    parser.add_argument(
        "--max-per-backend",
        type=int,
        default=0,
        help="concurrent requests per backend; more wait in order (default 0: no cap)",
    )
    return parser


async def run(args: argparse.Namespace) -> None:
    client = new_api_client(args.kubeconfig, user_agent="flexinfer-proxy")
    api = KubeApi(client)
    directory = KubeDirectory(
        api, namespaces=args.namespace, endpoint_overrides=dict(args.endpoint)
    )
    config = ProxyConfig(
        min_queue_wait=timedelta(seconds=args.min_queue_wait),
        retry_after_seconds=args.retry_after,
        max_per_backend=args.max_per_backend,
    )
    proxy = Proxy(directory, KubeDemandSink(api), config=config)
    runner, port = await serve(proxy, host=args.host, port=args.port)
    log.info("flexinfer proxy listening on %s:%d", args.host, port)
    print(f"listening on {args.host}:{port}", flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stopped.set)
    try:
        await stopped.wait()
    finally:
        log.info("flexinfer proxy stopping")
        await runner.cleanup()
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
