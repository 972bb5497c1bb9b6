"""`python -m flexinfer_proxy`: parse flags, connect to the cluster, serve until signalled.

Thin on purpose: it builds the kubernetes-backed directory and demand sink, hands
them to `Proxy`, and runs its server (`http_server`) on uvloop when it is installed. Without
`--kubeconfig` it uses the in-cluster ServiceAccount; without `--namespace` it
watches every namespace. One process: it is the single writer of the demand it
reports (docs/proxy.md, "Throughput").
"""

from __future__ import annotations

# Before anything of the extra is imported: without it, say what to install.
from flexinfer_kube.extras import require_extra

require_extra("proxy", what="the proxy (python -m flexinfer_proxy)")

import argparse
import asyncio
import contextlib
import gc
import logging
import resource
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from typing import Any, TextIO

from flexinfer_core.durations import parse_duration
from flexinfer_core.errors import FlexinferError
from flexinfer_kube.kubeapi import KubeApi, new_api_client
from flexinfer_proxy.api_keys import SecretKeySource
from flexinfer_proxy.app import MAX_WAIT_COMMENT_INTERVAL, Proxy, ProxyConfig, serve
from flexinfer_proxy.http_server import DEFAULT_MAX_HEAD_BYTES
from flexinfer_proxy.in_flight import MIN_INTERVAL_BOUNDS
from flexinfer_proxy.kube_demand import KubeDemandSink
from flexinfer_proxy.kube_directory import KubeDirectory
from flexinfer_proxy.resolve_file import HostsFileResolver
from flexinfer_proxy.swap_times import MAX_PRIOR_SECONDS, MAX_SAMPLES

log = logging.getLogger("flexinfer.proxy")

DEFAULTS = ProxyConfig()
# Descriptors kept for the API server, upstream pools and logs beyond two per client.
SPARE_DESCRIPTORS = 64


def _endpoint_override(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected NAME=http://host:port/v1, got {text!r}")
    return name, url


def _duration(flag: str) -> Callable[[str], float]:
    def seconds(text: str) -> float:
        try:
            value = parse_duration(text, field=flag).total_seconds()
        except FlexinferError as error:
            raise argparse.ArgumentTypeError(str(error)) from error
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be longer than 0s, got {text!r}")
        return value

    return seconds


def _between(flag: str, low: float, high: float) -> Callable[[str], float]:
    def seconds(text: str) -> float:
        value = _duration(flag)(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{flag} must be between {_seconds_text(low)} and {_seconds_text(high)}, "
                f"got {text!r}"
            )
        return value

    return seconds


def _at_least(flag: str, low: int) -> Callable[[str], int]:
    def number(text: str) -> int:
        try:
            value = int(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{flag}: {text!r} is not a whole number") from error
        if value < low:
            raise argparse.ArgumentTypeError(f"{flag} must be at least {low}, got {value}")
        return value

    return number


def _bounded_duration(flag: str, *, high: float) -> Callable[[str], float]:
    longer_than_zero = _duration(flag)

    def seconds(text: str) -> float:
        value = longer_than_zero(text)
        if value > high:
            raise argparse.ArgumentTypeError(
                f"{flag} must be at most {_seconds_text(high)}, got {text!r}"
            )
        return value

    return seconds


def _within(flag: str, low: int, high: int) -> Callable[[str], int]:
    at_least = _at_least(flag, low)

    def number(text: str) -> int:
        value = at_least(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{flag} must be at most {high}, got {value}")
        return value

    return number


def _secret_ref(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text!r}")
    return namespace, name


def _seconds_text(seconds: float) -> str:
    return f"{seconds:g}s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flexinfer_proxy",
        description="OpenAI-compatible proxy: routes to the active model, queues, signals demand.",
    )
    add = parser.add_argument
    add("--port", type=int, default=8000)
    add("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    add(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics on this port only (default: on --port; 0 picks a free port)",
    )
    add(
        "--namespace",
        action="append",
        default=[],
        help="namespace to route models from (repeatable, first listed wins; "
        "default: all namespaces, where a name in several is refused as ambiguous)",
    )
    add("--kubeconfig", help="kubeconfig file (default: the in-cluster config)")
    add(
        "--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    add("--access-log", action="store_true", help="log every request (default: off)")
    add(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="auto: uvloop when installed (default)",
    )
    add(
        "--endpoint",
        action="append",
        default=[],
        type=_endpoint_override,
        metavar="NAME=URL",
        help="send model NAME (or NAMESPACE/NAME) to URL (ending in /v1) instead of its "
        "Service (repeatable)",
    )
    add(
        "--resolve-file",
        metavar="PATH",
        help="hosts-format file consulted before DNS for backend names (dev cluster only)",
    )
    add(
        "--api-key-secret",
        type=_secret_ref,
        metavar="NAMESPACE/NAME",
        help="accept only bearer tokens listed in this Secret (default: no keys)",
    )
    add(
        "--min-queue-wait",
        type=_duration("--min-queue-wait"),
        default=60.0,
        metavar="DURATION",
        help="shortest queue wait (default 60s; a longer coldStartTimeout extends it)",
    )
    add(
        "--retry-after",
        type=_at_least("--retry-after", 1),
        default=DEFAULTS.retry_after_seconds,
        help="least Retry-After seconds on a 503, before jitter (default %(default)s)",
    )
    low, high = (bound.total_seconds() for bound in MIN_INTERVAL_BOUNDS)
    add(
        "--in-flight-interval",
        type=_between("--in-flight-interval", low, high),
        default=DEFAULTS.in_flight_interval.total_seconds(),
        metavar="DURATION",
        help="least time between two reports of a Model's requests in flight, which the "
        "controller drains before it stops the Model; a change to or from 0 is reported at once "
        f"(default {_seconds_text(DEFAULTS.in_flight_interval.total_seconds())}; "
        f"{_seconds_text(low)} to {_seconds_text(high)})",
    )
    add(
        "--max-retry-after",
        type=_at_least("--max-retry-after", 1),
        default=DEFAULTS.max_retry_after_seconds,
        help="most seconds of expected wait counted in Retry-After, before jitter "
        "(default %(default)s)",
    )
    add(
        "--swap-time-prior",
        type=_bounded_duration("--swap-time-prior", high=MAX_PRIOR_SECONDS),
        default=DEFAULTS.swap_time_prior,
        metavar="DURATION",
        help="expected swap time of a model before the proxy has measured one "
        f"(default {_seconds_text(DEFAULTS.swap_time_prior)}, at most 1h)",
    )
    add(
        "--swap-time-samples",
        type=_within("--swap-time-samples", 1, MAX_SAMPLES),
        default=DEFAULTS.swap_time_samples,
        help="measured swaps per model and node the estimates (their median, and their "
        "p90 for Retry-After) are made from "
        f"(default %(default)s, 1 to {MAX_SAMPLES})",
    )
    add(
        "--wait-comment-interval",
        type=_bounded_duration("--wait-comment-interval", high=MAX_WAIT_COMMENT_INTERVAL),
        default=DEFAULTS.wait_comment_interval,
        metavar="DURATION",
        help="a streamed request still waiting after this gets its 200 and an SSE comment "
        f"this often (default {_seconds_text(DEFAULTS.wait_comment_interval)}, at most 60s)",
    )
    add(
        "--max-per-backend",
        type=_at_least("--max-per-backend", 0),
        default=0,
        help="concurrent requests per backend; more wait in order (default 0: no cap)",
    )
    add(
        "--max-queue",
        type=_at_least("--max-queue", 1),
        default=DEFAULTS.max_queue,
        help="waiting requests per model; more get 503 (default %(default)s)",
    )
    add(
        "--max-queue-total",
        type=_at_least("--max-queue-total", 1),
        default=DEFAULTS.max_queue_total,
        help="waiting requests over all models (default %(default)s)",
    )
    add(
        "--max-concurrent-per-client",
        type=_at_least("--max-concurrent-per-client", 0),
        default=DEFAULTS.max_concurrent_per_client,
        help="requests one client (API key, else address) has in progress; more get 429 "
        "(default %(default)s; 0: no cap)",
    )
    add(
        "--max-queued-per-client",
        type=_at_least("--max-queued-per-client", 0),
        default=DEFAULTS.max_queued_per_client,
        help="requests one client (API key, else address) has waiting for their models; "
        "more get 429 (default %(default)s; 0: no cap)",
    )
    add(
        "--max-body-bytes",
        type=_at_least("--max-body-bytes", 1024),
        default=DEFAULTS.max_body_bytes,
        help="largest request body; larger gets 413 (default %(default)s = 16 MiB)",
    )
    add(
        "--max-buffered-bytes",
        type=_at_least("--max-buffered-bytes", 1024),
        default=DEFAULTS.max_buffered_bytes,
        help="request-body bytes held at once; beyond, 503 (default %(default)s = 256 MiB)",
    )
    add(
        "--max-connections",
        type=_at_least("--max-connections", 1),
        default=DEFAULTS.max_connections,
        help="client connections; at the cap the longest idle one is closed "
        "(default %(default)s, lowered to fit the open-files limit)",
    )
    add(
        "--max-header-bytes",
        type=_at_least("--max-header-bytes", 1024),
        default=DEFAULT_MAX_HEAD_BYTES,
        help="largest request head (request line and headers); larger gets 431 "
        "(default %(default)s = 64 KiB)",
    )
    add(
        "--lingering-bytes",
        type=_at_least("--lingering-bytes", 0),
        default=DEFAULTS.lingering_bytes,
        help="after refusing a request whose body is still arriving, bytes more read and "
        "dropped before the close, so the client reads the answer (default %(default)s "
        "= 128 MiB; 0: close at once)",
    )
    for flag, field, meaning in (
        ("--client-header-timeout", "client_header_timeout", "a request's head must arrive"),
        ("--client-body-timeout", "client_body_timeout", "a request's body must arrive"),
        ("--client-idle-timeout", "client_idle_timeout", "an idle keep-alive connection lives"),
        ("--lingering-time", "lingering_time", "a lingering close reads and drops"),
        ("--backend-connect-timeout", "backend_connect_timeout", "to connect to a backend"),
        ("--backend-headers-timeout", "backend_headers_timeout", "for a backend's headers; 504"),
        ("--backend-read-timeout", "backend_read_timeout", "a backend may be silent mid-answer"),
        (
            "--backend-idle-timeout",
            "backend_idle_timeout",
            "a pooled backend connection may be idle and still reused",
        ),
    ):
        default = float(getattr(DEFAULTS, field))
        add(
            flag,
            dest=field,
            type=_duration(flag),
            default=default,
            metavar="DURATION",
            help=f"time {meaning} (default {_seconds_text(default)})",
        )
    return parser


def config_from(args: argparse.Namespace) -> ProxyConfig:
    return ProxyConfig(
        min_queue_wait=timedelta(seconds=args.min_queue_wait),
        retry_after_seconds=args.retry_after,
        max_retry_after_seconds=args.max_retry_after,
        swap_time_prior=args.swap_time_prior,
        swap_time_samples=args.swap_time_samples,
        wait_comment_interval=args.wait_comment_interval,
        in_flight_interval=timedelta(seconds=args.in_flight_interval),
        max_per_backend=args.max_per_backend,
        max_queue=args.max_queue,
        max_queue_total=args.max_queue_total,
        max_concurrent_per_client=args.max_concurrent_per_client,
        max_queued_per_client=args.max_queued_per_client,
        max_body_bytes=args.max_body_bytes,
        max_buffered_bytes=args.max_buffered_bytes,
        max_connections=fit_connections(args.max_connections),
        max_header_bytes=args.max_header_bytes,
        client_header_timeout=args.client_header_timeout,
        client_body_timeout=args.client_body_timeout,
        client_idle_timeout=args.client_idle_timeout,
        lingering_time=args.lingering_time,
        lingering_bytes=args.lingering_bytes,
        backend_connect_timeout=args.backend_connect_timeout,
        backend_headers_timeout=args.backend_headers_timeout,
        backend_read_timeout=args.backend_read_timeout,
        backend_idle_timeout=args.backend_idle_timeout,
        access_log=args.access_log,
    )


def fit_connections(wanted: int) -> int:
    """`wanted`, lowered so every client can have its backend connection too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * wanted + SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    fitted = max(1, (soft - SPARE_DESCRIPTORS) // 2)
    log.warning(
        "--max-connections %d needs %d open files but the limit is %d; serving %d",
        wanted,
        needed,
        soft,
        fitted,
    )
    return fitted


def announce(line: str, stream: TextIO | None = None) -> None:
    """Write `line` to stdout in one write, newline included, and flush: the port lines
    that wrappers wait for. `print` writes the text and its newline separately, and with
    unbuffered output (the image sets PYTHONUNBUFFERED) a log line on stderr, relayed into
    the same file, can land between them and split the line a wrapper matches."""
    out = sys.stdout if stream is None else stream
    out.write(line + "\n")
    out.flush()


async def run(args: argparse.Namespace) -> None:
    client = new_api_client(args.kubeconfig, user_agent="flexinfer-proxy")
    api = KubeApi(client)
    directory = KubeDirectory(
        api, namespaces=args.namespace, endpoint_overrides=dict(args.endpoint)
    )
    keys = None
    if args.api_key_secret is not None:
        keys = SecretKeySource(api, *args.api_key_secret)
        await keys.start()
    proxy = Proxy(
        directory,
        KubeDemandSink(api),
        config=config_from(args),
        api_keys=keys.keys if keys is not None else None,
        resolver=HostsFileResolver(args.resolve_file) if args.resolve_file else None,
    )
    runner, port = await serve(
        proxy, host=args.host, port=args.port, metrics_port=args.metrics_port
    )
    freeze_startup_objects()
    log.info("flexinfer proxy listening on %s:%d", args.host, port)
    announce(f"listening on {args.host}:{port}")
    if proxy.metrics_port is not None:
        announce(f"metrics on {args.host}:{proxy.metrics_port}")
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stopped.set)
    try:
        await stopped.wait()
    finally:
        log.info("flexinfer proxy stopping")
        if keys is not None:
            await keys.stop()
        await runner.cleanup()
        client.close()


def freeze_startup_objects() -> None:
    """Take what exists once serving starts (modules, the cluster client, the
    directory: it lives as long as the process) out of the garbage collector's walks,
    so a full collection walks only what requests made, not every imported module."""
    gc.collect()
    gc.freeze()


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when chosen or (auto) installed; None: asyncio's own."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("--event-loop uvloop: uvloop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    run_on_loop(run(args), event_loop=args.event_loop)
    return 0


def run_on_loop(main: Coroutine[Any, Any, None], *, event_loop: str) -> None:
    """Run `main` to completion on the loop `--event-loop` chose."""
    factory = event_loop_factory(event_loop)
    log.info("event loop: %s", "uvloop" if factory is not None else "asyncio")
    runner_args: dict[str, Any] = {"loop_factory": factory} if factory is not None else {}
    with asyncio.Runner(**runner_args) as runner:
        runner.run(main)


if __name__ == "__main__":
    sys.exit(main())
