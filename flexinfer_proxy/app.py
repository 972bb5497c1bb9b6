"""The HTTP face of the proxy: OpenAI routes, health, readiness, metrics and the live page.

A request names its model in the JSON body; the directory resolves the name and
says whether that model is Ready. Ready (and nobody ahead in line) → relayed at
once; otherwise the request queues until the model is Ready or the wait limit
(max(minimum wait, the model's coldStartTimeout)) passes, which answers 503 with
`Retry-After` from the wait still expected. A request that waited carries its
queue position and wait estimate as headers on its answer; a streamed one that
waits longer than `--wait-comment-interval` gets its 200 and event-stream head then,
an SSE comment every interval while it waits, and the backend's events (or an error
event, never a silent close) after them. Every answer the proxy makes up is
OpenAI-shaped JSON, and every request ends as one outcome of
`flexinfer_proxy_requests_total`.

Bounds (all `ProxyConfig` fields, all flags): body size and the bytes of bodies
held at once, the time a body may take, queue lengths per model and overall, the
size of a request's head, connections and their header and idle timeouts
(`connections`, `http_server`), and the backend's connect, headers and read timeouts
(`upstream`).

This module wires the pieces (server, directory, body reader, queues, demand, relay,
metrics) to routes; it holds no cluster code and no decisions beyond "serve, wait
or refuse".
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from datetime import timedelta
from typing import Any

import attrs
from aiohttp.abc import AbstractResolver

from flexinfer_core import DeploymentPhase, Phase
from flexinfer_kube.clock import Clock, SystemClock
from flexinfer_proxy import openai_errors
from flexinfer_proxy.api_keys import ApiKey, ApiKeys
from flexinfer_proxy.backend_slots import BackendSlots
from flexinfer_proxy.client_limits import ClientLimits
from flexinfer_proxy.connections import ConnectionGuard
from flexinfer_proxy.demand import REFRESH_INTERVAL, DemandSignaller, DemandSink
from flexinfer_proxy.directory import ModelDirectory, ModelEntry, Resolution
from flexinfer_proxy.forward import (
    BackendTimeout,
    BackendUnavailable,
    ClientGone,
    ModelRewrite,
    StreamCut,
    relay,
    relay_in_slot,
    request_head,
    upstream_header_lines,
)
from flexinfer_proxy.http_server import (
    DEFAULT_LINGER_BYTES,
    DEFAULT_LINGER_SECONDS,
    DEFAULT_MAX_HEAD_BYTES,
    Answer,
    BodyCutOff,
    HttpServer,
    Request,
    json_answer,
)
from flexinfer_proxy.in_flight import MIN_INTERVAL, InFlightReporter, InFlightSink, SplitSink
from flexinfer_proxy.live_page import PAGE_PATH, STATUS_PATH, LivePage, page_html
from flexinfer_proxy.metrics import (
    OUTCOME_AMBIGUOUS_MODEL,
    OUTCOME_BACKEND_TIMEOUT,
    OUTCOME_BACKEND_UNAVAILABLE,
    OUTCOME_BAD_REQUEST,
    OUTCOME_BODY_TIMEOUT,
    OUTCOME_BODY_TOO_LARGE,
    OUTCOME_CLIENT_CONCURRENCY_LIMIT,
    OUTCOME_CLIENT_DISCONNECTED,
    OUTCOME_CLIENT_QUEUE_LIMIT,
    OUTCOME_INTERNAL_ERROR,
    OUTCOME_PROXY_BUSY,
    OUTCOME_PROXY_CLOSING,
    OUTCOME_QUEUE_FULL,
    OUTCOME_QUEUE_TIMEOUT,
    OUTCOME_SERVED,
    OUTCOME_STREAM_CUT,
    OUTCOME_UNAUTHORIZED,
    OUTCOME_UNKNOWN_MODEL,
    CollectorRegistry,
    ProxyMetrics,
)
from flexinfer_proxy.model_field import BadRequest
from flexinfer_proxy.queues import DISPATCH_GRACE_SECONDS, RequestQueues, Ticket, WaitResult
from flexinfer_proxy.request_body import (
    BodyBudget,
    BodyBudgetExceeded,
    BodyTimeout,
    BodyTooLarge,
    RequestBody,
    read_request_body,
    small_body_at_hand,
)
from flexinfer_proxy.swap_times import (
    CAUTIOUS,
    DEFAULT_PRIOR_SECONDS,
    DEFAULT_SAMPLES,
    SwapTimes,
)
from flexinfer_proxy.upstream import (
    DEFAULT_IDLE_SECONDS,
    Origin,
    UpstreamPool,
    UpstreamTimeouts,
    origin_of,
)

log = logging.getLogger("flexinfer.proxy")
access_log = logging.getLogger("flexinfer.proxy.access")

OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
API_PREFIX = "/v1"
MiB = 1024 * 1024
# How long a shutdown waits for answers in progress (aiohttp's default, kept).
SHUTDOWN_TIMEOUT_SECONDS = 60.0

REFUSED_CONNECTION = openai_errors.raw_response(
    503,
    "Service Unavailable",
    "The proxy serves as many connections as it may (--max-connections); retry later.",
    code="too_many_connections",
)

# A queued request whose backend refuses connections (Ready, not yet listening)
# tries again after these pauses, doubling, within its remaining wait.
RETRY_FIRST_PAUSE = 0.1
RETRY_LONGEST_PAUSE = 2.0
# The live page's data changes every second: no cache may keep it.
NO_STORE = {"Cache-Control": "no-store"}
# The page is one file and talks to this proxy only: nothing else may load or frame it.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}
# Backend endpoints are parsed once and kept, up to this many.
ORIGIN_CACHE_SIZE = 1024
# `--wait-comment-interval` at most: a comment at least every minute keeps proxies
# with the common 60 s idle timeout from cutting a waiting stream.
MAX_WAIT_COMMENT_INTERVAL = 60.0
QUEUE_POSITION_HEADER = "x-flexinfer-queue-position"
WAIT_SECONDS_HEADER = "x-flexinfer-wait-seconds"
# The head a waiting streamed request gets before its comments.
WAITING_STREAM_HEAD = b"Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n"


@attrs.frozen
class ProxyConfig:
    """Tunables; each is a flag of `python -m flexinfer_proxy` (docs/proxy.md)."""

    min_queue_wait: timedelta = timedelta(seconds=60)
    retry_after_seconds: int = 10
    # The expected wait counted in `Retry-After` at most (before its jitter).
    max_retry_after_seconds: int = 300
    swap_time_prior: float = DEFAULT_PRIOR_SECONDS
    swap_time_samples: int = DEFAULT_SAMPLES
    # A waiting streamed request's 200 goes out after this, then a comment this often.
    wait_comment_interval: float = 5.0
    refresh_interval: timedelta = REFRESH_INTERVAL
    dispatch_grace_seconds: float = DISPATCH_GRACE_SECONDS
    # Least time between two in-flight reports of one Model (docs/election.md 1.6).
    in_flight_interval: timedelta = MIN_INTERVAL

    # Requests carry whole conversations and embedding batches, but every byte of a
    # body is held in memory until it is sent: well under the pod's 1 GiB.
    max_body_bytes: int = 16 * MiB
    max_buffered_bytes: int = 256 * MiB
    # Concurrent requests per backend; 0 = no cap. Extra requests wait in order.
    max_per_backend: int = 0
    max_queue: int = 1000  # waiting requests per model
    max_queue_total: int = 10000  # waiting requests overall
    # Per client (API key, else address); 0 = no cap. A sixteenth of the connection
    # cap, and an eighth of a model's queue: one client cannot take either alone.
    max_concurrent_per_client: int = 256
    max_queued_per_client: int = 128

    max_connections: int = 4096
    max_header_bytes: int = DEFAULT_MAX_HEAD_BYTES
    client_header_timeout: float = 10.0
    client_body_timeout: float = 60.0
    client_idle_timeout: float = 75.0
    lingering_time: float = DEFAULT_LINGER_SECONDS
    lingering_bytes: int = DEFAULT_LINGER_BYTES

    backend_connect_timeout: float = 10.0
    backend_headers_timeout: float = 600.0
    backend_read_timeout: float = 300.0
    backend_idle_timeout: float = DEFAULT_IDLE_SECONDS

    access_log: bool = False

    def wait_limit(self, entry: ModelEntry) -> float:
        return max(self.min_queue_wait, entry.cold_start_timeout).total_seconds()

    @property
    def upstream_timeouts(self) -> UpstreamTimeouts:
        return UpstreamTimeouts(
            connect=self.backend_connect_timeout,
            headers=self.backend_headers_timeout,
            read=self.backend_read_timeout,
        )


class _Refusal(Exception):
    """An answer decided while the body was still arriving (e.g. an unknown model)."""

    def __init__(self, response: Answer, *, model: str, outcome: str) -> None:
        super().__init__(outcome)
        self.response = response
        self.model = model
        self.outcome = outcome


# The phases of a model scaled to zero (Model, ModelDeployment): its pods are going.
SCALED_TO_ZERO = frozenset({Phase.PREEMPTED, Phase.IDLE, DeploymentPhase.IDLE})


class Proxy:
    """One proxy: its directory, demand sink, queues, metrics and upstream pool."""

    def __init__(
        self,
        directory: ModelDirectory,
        sink: DemandSink,
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        config: ProxyConfig | None = None,
        api_keys: ApiKeys | None = None,
        resolver: AbstractResolver | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.directory = directory
        self.config = config or ProxyConfig()
        self.clock = clock or SystemClock()
        self.metrics = ProxyMetrics(registry)
        self.api_keys = api_keys
        self.signaller = DemandSignaller(
            sink,
            clock=self.clock,
            metrics=self.metrics,
            refresh_interval=self.config.refresh_interval,
        )
        self.swap_times = SwapTimes(
            prior=self.config.swap_time_prior, samples=self.config.swap_time_samples
        )
        # Requests in flight (docs/election.md 1.6): a Model's through the demand sink
        # when it can write them, a GPUGroup member's with its queue report.
        self.in_flight = InFlightReporter(
            SplitSink(sink if isinstance(sink, InFlightSink) else None, self.signaller),
            clock=self.clock,
            min_interval=self.config.in_flight_interval,
        )
        self.queues = RequestQueues(
            directory,
            self.signaller,
            clock=self.clock,
            metrics=self.metrics,
            swap_times=self.swap_times,
            dispatch_grace=self.config.dispatch_grace_seconds,
        )
        self.live = LivePage(directory, self.queues, clock=self.clock)
        self.slots = BackendSlots(self.config.max_per_backend)
        self.limits = ClientLimits(
            max_concurrent=self.config.max_concurrent_per_client,
            max_queued=self.config.max_queued_per_client,
        )
        self.budget = BodyBudget(self.config.max_buffered_bytes)
        self.metrics.buffered_bytes.set_function(lambda: self.budget.used)
        self.guard: ConnectionGuard | None = None
        self.metrics_port: int | None = None
        self._timeouts = self.config.upstream_timeouts
        self._resolver = resolver
        self._rng = rng or random.Random()
        self.pool: UpstreamPool | None = None
        self._origins: dict[str, tuple[Origin, bytes]] = {}
        self._serve_metrics = True

    def retry_after(self, expected: float = 0.0) -> int:
        """Seconds for `Retry-After`: the expected wait (at least --retry-after, at most
        --max-retry-after) plus up to as much again at random, so clients refused
        together come back spread out."""
        config = self.config
        expected = min(expected, float(config.max_retry_after_seconds))
        base = max(1.0, float(config.retry_after_seconds), expected)
        return math.ceil(base + self._rng.uniform(0.0, base))

    async def start(self) -> None:
        self.pool = UpstreamPool(
            timeouts=self._timeouts,
            resolver=self._resolver,
            idle_timeout=self.config.backend_idle_timeout,
        )
        self.directory.subscribe(self._model_changed)
        await self.directory.start()

    def _model_changed(self, key: str) -> None:
        """A model the controller scaled to zero has its answers in progress ended at
        once (docs/proxy.md, "Preemption"): its server was told to stop, and llama.cpp's
        holds an unfinished answer's connection open until the client closes it, which
        kept the pod, and the next model waiting for the card, for its whole grace
        period."""
        entry = self.directory.lookup(key)
        pool = self.pool
        if entry is None or pool is None or entry.phase not in SCALED_TO_ZERO:
            return
        origin, _ = self._origin(entry)
        ended = pool.end_answers(origin, f"{entry.name} was scaled to zero: {entry.phase}")
        if ended:
            log.info("%s is %s: ended %d answer(s) in progress", key, entry.phase, ended)

    async def shutdown(self) -> None:
        # Before in-flight requests are waited for: queued ones get a 503 now.
        await self.queues.close()

    async def cleanup(self) -> None:
        # After in-flight requests finished (or timed out): the pool can go.
        self.live.close()
        # The last in-flight counts (0) first: a GPUGroup member's go through the signaller.
        await self.in_flight.close()
        await self.signaller.close()
        await self.directory.stop()
        if self.pool is not None:
            await self.pool.close()

    async def handle(self, request: Request) -> None:
        """Every request of the main port: routed, answered, every error OpenAI-shaped."""
        started = time.perf_counter() if self.config.access_log else 0.0
        try:
            path, method = request.path, request.method
            if method == "POST" and path in OPENAI_ROUTES:
                answer = await self.handle_openai(request)
            else:
                answer = self._other_route(request)
        except Exception:
            log.exception("failed to handle %s %s", request.method, request.path)
            self.metrics.request_done("", OUTCOME_INTERNAL_ERROR)
            if request.answered:
                request.cut()
                return
            answer = openai_errors.internal_error()
        if answer is not None:
            request.send(answer)
        if self.config.access_log:
            access_log.info(
                '%s "%s %s HTTP/%s" %d %.3fms "%s"',
                request.remote,
                request.method,
                request.raw_path,
                request.version,
                request.status,
                (time.perf_counter() - started) * 1000,
                request.header(b"user-agent") or "-",
            )

    def _other_route(self, request: Request) -> Answer:
        path, method = request.path, request.method
        if method in ("GET", "HEAD"):
            if path == "/v1/models":
                return self.handle_models(request)
            if path == "/healthz":
                return self.handle_healthz(request)
            if path == "/readyz":
                return self.handle_readyz(request)
            if path == "/metrics" and self._serve_metrics:
                return self.handle_metrics(request)
            if path == PAGE_PATH:
                return Answer(
                    200, page_html(), content_type=b"text/html; charset=utf-8", headers=PAGE_HEADERS
                )
            if path == STATUS_PATH:
                return self.handle_status(request)
        return self.handle_unsupported(request)

    async def handle_metrics_port(self, request: Request) -> None:
        """The separate metrics port (`--metrics-port`): /metrics, nothing else."""
        if request.path == "/metrics" and request.method in ("GET", "HEAD"):
            request.send(self.handle_metrics(request))
        else:
            request.send(self.handle_unsupported(request))

    # -- the OpenAI routes ---------------------------------------------------------

    async def handle_openai(self, request: Request) -> Answer | None:
        if request.body.expects_continue and (request.content_length or 0) > (
            self.config.max_body_bytes
        ):
            # Refused before the client sends it (curl sends Expect over 1 MiB).
            self.metrics.request_done("", OUTCOME_BODY_TOO_LARGE)
            return openai_errors.body_too_large(self.config.max_body_bytes).closing()
        key: ApiKey | None = None
        if self.api_keys is not None:
            key = self._key_of(request)
            if key is None:
                return self._key_refusal()
        # A client is its key's entry, else its address (an address has no space).
        client = f"key {key.name}" if key is not None else (request.remote or "")
        if not self.limits.enter(client):
            self.metrics.request_done("", OUTCOME_CLIENT_CONCURRENCY_LIMIT)
            log.info("client %s is at --max-concurrent-per-client", client)
            return openai_errors.client_concurrency_limit(
                self.limits.max_concurrent, retry_after=self.retry_after()
            )
        reachable = key.namespaces if key is not None else None
        # Counted until the answer is done (one coroutine: no extra await per request).
        try:
            resolved: list[Resolution] = []

            def on_model(name: str) -> None:
                resolved.append(self._resolve_or_refuse(name, client=client, reachable=reachable))

            config = self.config
            try:
                body = small_body_at_hand(
                    request, max_bytes=config.max_body_bytes, budget=self.budget, on_model=on_model
                ) or await read_request_body(
                    request,
                    max_bytes=config.max_body_bytes,
                    budget=self.budget,
                    timeout=config.client_body_timeout,
                    on_model=on_model,
                )
            except _Refusal as refusal:
                self.metrics.request_done(refusal.model, refusal.outcome)
                return refusal.response.closing()
            except BadRequest as error:
                self.metrics.request_done("", OUTCOME_BAD_REQUEST)
                return openai_errors.bad_request(str(error), param=error.param).closing()
            except BodyTooLarge:
                self.metrics.request_done("", OUTCOME_BODY_TOO_LARGE)
                return openai_errors.body_too_large(self.config.max_body_bytes).closing()
            except BodyBudgetExceeded:
                self.metrics.request_done("", OUTCOME_PROXY_BUSY)
                log.warning("request body refused: %d bytes of bodies held", self.budget.used)
                return openai_errors.proxy_busy(retry_after=self.retry_after()).closing()
            except BodyTimeout:
                self.metrics.request_done("", OUTCOME_BODY_TIMEOUT)
                timeout = self.config.client_body_timeout
                return openai_errors.body_timeout(timeout).closing()
            except (BodyCutOff, ConnectionError) as error:
                # The client went away (or broke its own framing) in the middle of its body.
                self.metrics.request_done("", OUTCOME_CLIENT_DISCONNECTED)
                log.info("request body cut off by the client: %s", error)
                message = "The request body was cut off before its end."
                return openai_errors.bad_request(message, param=None).closing()
            except asyncio.CancelledError:
                self.metrics.request_done("", OUTCOME_CLIENT_DISCONNECTED)
                raise
            try:
                entry = resolved[-1].entry
                assert entry is not None
                if entry.ready and not self.queues.depth(entry.key):
                    # The usual case, one coroutine less: nobody to wait for. Counted in
                    # flight until its answer has ended (docs/election.md 1.6).
                    with self.in_flight.request(entry):
                        return await self._forward(
                            request, entry, body=body, ticket=None, deadline=0.0
                        )
                return await self._route(request, entry, body, client=client)
            finally:
                body.release()
        finally:
            self.limits.leave(client)

    def _key_of(self, request: Request) -> ApiKey | None:
        """The request's API key, or None (then `_key_refusal` says why)."""
        assert self.api_keys is not None
        if not self.api_keys.loaded:
            return None
        return self.api_keys.key_for(request.header(b"authorization"))

    def _key_refusal(self) -> Answer:
        assert self.api_keys is not None
        self.metrics.request_done("", OUTCOME_UNAUTHORIZED)
        if not self.api_keys.loaded:
            return openai_errors.directory_syncing("any model", retry_after=self.retry_after())
        return openai_errors.unauthorized()

    def _resolve_or_refuse(
        self, name: str, *, client: str, reachable: frozenset[str] | None
    ) -> Resolution:
        """Called as soon as the body's `model` is read: refuse what cannot be served."""
        resolution = self.directory.resolve(name, reachable=reachable)
        if resolution.ambiguous:
            raise _Refusal(
                openai_errors.ambiguous_model(
                    name, resolution.ambiguous, labelled_in=resolution.labelled_in
                ),
                model="",
                outcome=OUTCOME_AMBIGUOUS_MODEL,
            )
        if resolution.entry is None:
            if not self.directory.synced:
                # Right after start the model may exist but not be listed yet.
                response = openai_errors.directory_syncing(name, retry_after=self.retry_after())
            else:
                response = openai_errors.model_not_found(name)
            raise _Refusal(response, model="", outcome=OUTCOME_UNKNOWN_MODEL)
        entry = resolution.entry
        if not entry.ready or self.queues.depth(entry.key):
            if self.queues.depth(entry.key) >= self.config.max_queue:
                raise self._queue_full(entry, self.config.max_queue, "for this model")
            if self.queues.total >= self.config.max_queue_total:
                raise self._queue_full(entry, self.config.max_queue_total, "in all")
            if not self.limits.may_queue(client):
                raise self._client_queue_full(entry, client)
        return resolution

    def _queue_full(self, entry: ModelEntry, limit: int, scope: str) -> _Refusal:
        expected = self.queues.estimate_wait(entry.key, percentile=CAUTIOUS)
        response = openai_errors.queue_full(
            entry.name, limit=limit, scope=scope, retry_after=self.retry_after(expected)
        )
        return _Refusal(response, model=entry.key, outcome=OUTCOME_QUEUE_FULL)

    def _client_queue_full(self, entry: ModelEntry, client: str) -> _Refusal:
        log.info("client %s is at --max-queued-per-client", client)
        response = openai_errors.client_queue_limit(
            entry.name, limit=self.limits.max_queued, retry_after=self.retry_after()
        )
        return _Refusal(response, model=entry.key, outcome=OUTCOME_CLIENT_QUEUE_LIMIT)

    async def _route(
        self, request: Request, entry: ModelEntry, body: RequestBody, *, client: str
    ) -> Answer | None:
        ticket: Ticket | None = None
        deadline = 0.0
        if not entry.ready or self.queues.depth(entry.key):
            # Counted here, strictly (the early check when `model` arrived may have
            # been passed by several of the client's requests at once).
            if not self.limits.queue(client):
                refused = self._client_queue_full(entry, client)
                self.metrics.request_done(refused.model, refused.outcome)
                return refused.response
            # Only a small body's `stream` is known (a scanned one's is not decoded).
            streamed = body.payload is not None and body.payload.get("stream") is True
            try:
                ticket, refusal = await self._wait_in_queue(request, entry, streamed=streamed)
            finally:
                self.limits.unqueue(client)
            if refusal is not None:
                return _in_stream(request, refusal)
            deadline = ticket.enqueued_at + self.config.wait_limit(entry)
            entry = self.directory.lookup(entry.key) or entry
        try:
            with self.in_flight.request(entry):
                answer = await self._forward(
                    request, entry, body=body, ticket=ticket, deadline=deadline
                )
            return _in_stream(request, answer)
        finally:
            if ticket is not None:
                ticket.dispatched()

    async def _wait_in_queue(
        self, request: Request, entry: ModelEntry, *, streamed: bool
    ) -> tuple[Ticket, Answer | None]:
        ticket = self.queues.enqueue(entry)
        # On whatever answer it gets: where it stood and what it was told to expect.
        request.extra_header_lines = b"%s: %d\r\n%s: %.1f\r\n" % (
            QUEUE_POSITION_HEADER.encode(),
            ticket.position,
            WAIT_SECONDS_HEADER.encode(),
            ticket.estimate,
        )
        limit = self.config.wait_limit(entry)

        def comment(waiting: Ticket) -> None:
            self._waiting_comment(request, entry, waiting)

        try:
            result = await self.queues.wait(
                ticket,
                limit=limit,
                every=self.config.wait_comment_interval,
                on_tick=comment if streamed else None,
            )
        except asyncio.CancelledError:
            self._queue_done(entry.key, ticket, outcome=OUTCOME_CLIENT_DISCONNECTED)
            log.info("client left while %s was queued", entry.key)
            raise
        if result is WaitResult.ADMITTED:
            self.metrics.queue_wait.labels(model=entry.key).observe(self.queues.waited(ticket))
            return ticket, None
        if result is WaitResult.CLOSING:
            self._queue_done(entry.key, ticket, outcome=OUTCOME_PROXY_CLOSING)
            return ticket, openai_errors.proxy_closing(entry.name, retry_after=self.retry_after())
        self._queue_done(entry.key, ticket, outcome=OUTCOME_QUEUE_TIMEOUT)
        log.warning("%s was not Ready within %.3gs; answered 503", entry.key, limit)
        return ticket, openai_errors.model_not_ready(
            entry.name, waited_seconds=limit, retry_after=self.retry_after(ticket.expected)
        )

    def _waiting_comment(self, request: Request, entry: ModelEntry, ticket: Ticket) -> None:
        """A streamed request still waits: its 200 (the first time), then a comment
        that OpenAI clients skip and that keeps idle-timeout proxies from cutting it."""
        if not request.answered:
            request.start(200, b"OK", WAITING_STREAM_HEAD, content_length=None)
        position = self.queues.position(ticket)
        about = self.queues.estimate_wait(ticket.key)
        request.write(
            f": waiting for {entry.name}, position {position}, about {about:.0f} s\n\n".encode()
        )

    def _queue_done(self, model: str, ticket: Ticket, *, outcome: str) -> None:
        self.metrics.queue_wait.labels(model=model).observe(self.queues.waited(ticket))
        self.metrics.request_done(model, outcome)

    async def _forward(
        self,
        request: Request,
        entry: ModelEntry,
        *,
        body: RequestBody,
        ticket: Ticket | None,
        deadline: float,
    ) -> Answer | None:
        pool = self.pool
        assert pool is not None, "not started"
        self.signaller.served(entry)
        data: bytes | bytearray = body.data
        rewrite = None
        if entry.backend_model != body.model:
            data = body.with_model(entry.backend_model)
            rewrite = ModelRewrite(requested=body.model, backend=entry.backend_model)
        lines = upstream_header_lines(
            request.headers,
            client=request.remote,
            names_hop_headers=request.names_hop_headers,
        )
        suffix = request.target[len(API_PREFIX) :]
        # A request that left a queue must say when it reached its backend (the
        # drain waits for that before it admits the next).
        on_dispatched = ticket.dispatched if ticket is not None else None
        loop = asyncio.get_running_loop()
        arrived = ticket.enqueued_at if ticket is not None else loop.time()
        first_byte = self.metrics.time_to_first_byte_of(entry.key)

        def on_headers() -> None:
            first_byte.observe(loop.time() - arrived)

        pause = RETRY_FIRST_PAUSE
        while True:
            origin, base = self._origin(entry)
            head = request_head(request.method, base + suffix, origin, lines, len(data))
            try:
                if self.slots.capped:
                    await relay_in_slot(
                        pool,
                        request,
                        slots=self.slots,
                        origin=origin,
                        head=head,
                        body=data,
                        rewrite=rewrite,
                        on_dispatched=on_dispatched,
                        on_headers=on_headers,
                    )
                else:
                    await relay(
                        pool,
                        request,
                        origin=origin,
                        head=head,
                        body=data,
                        rewrite=rewrite,
                        on_dispatched=on_dispatched,
                        on_headers=on_headers,
                    )
            except BackendUnavailable as error:
                if error.retryable and loop.time() + pause < deadline:
                    log.info("backend of %s not answering yet (%s); retrying", entry.key, error)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_LONGEST_PAUSE)
                    entry = self.directory.lookup(entry.key) or entry
                    continue
                log.warning("backend of %s at %s: %s", entry.key, entry.endpoint, error)
                self.metrics.request_done(entry.key, OUTCOME_BACKEND_UNAVAILABLE)
                return openai_errors.backend_unavailable(entry.name)
            except BackendTimeout as error:
                log.warning("backend of %s at %s: %s", entry.key, entry.endpoint, error)
                self.metrics.request_done(entry.key, OUTCOME_BACKEND_TIMEOUT)
                timeout = self._timeouts.headers
                return openai_errors.backend_timeout(entry.name, timeout)
            except StreamCut as error:
                log.warning("backend of %s: %s", entry.key, error)
                self.metrics.request_done(entry.key, OUTCOME_STREAM_CUT)
                # No clean end: the client must see a cut.
                request.cut()
                return None
            except ClientGone:
                self.metrics.request_done(entry.key, OUTCOME_CLIENT_DISCONNECTED)
                request.cut()
                return None
            except asyncio.CancelledError:
                self.metrics.request_done(entry.key, OUTCOME_CLIENT_DISCONNECTED)
                raise
            self.metrics.request_done(entry.key, OUTCOME_SERVED)
            return None

    def _origin(self, entry: ModelEntry) -> tuple[Origin, bytes]:
        """The backend's origin and base path (`<endpoint>` without its trailing slash)."""
        known = self._origins.get(entry.endpoint)
        if known is None:
            if len(self._origins) >= ORIGIN_CACHE_SIZE:
                self._origins.clear()
            origin, base = origin_of(entry.endpoint)
            known = self._origins[entry.endpoint] = (origin, base.encode("latin-1"))
        return known

    # -- other routes --------------------------------------------------------------

    def handle_unsupported(self, request: Request) -> Answer:
        if request.path.startswith(API_PREFIX + "/"):
            return openai_errors.unsupported_route(request.method, request.path)
        return openai_errors.error_response(
            404,
            f"{request.method} {request.path} is not a route of this proxy.",
            error_type="invalid_request_error",
            code="not_found",
        )

    def handle_models(self, request: Request) -> Answer:
        entries = self.directory.entries()
        if self.api_keys is not None:
            key = self._key_of(request)
            if key is None:
                return self._key_refusal()
            if key.namespaces is not None:
                # What the key cannot reach does not exist for it (nor its names).
                entries = [e for e in entries if e.namespace in key.namespaces]
        names: dict[str, int] = {}
        for entry in entries:
            names[entry.name] = names.get(entry.name, 0) + 1
        data = [
            model_card(
                entry,
                model_id=entry.name if names[entry.name] == 1 else entry.key,
                state=self._state(entry),
            )
            for entry in entries
        ]
        return json_answer({"object": "list", "data": data})

    def handle_status(self, request: Request) -> Answer:
        """The live page's data; with API keys, a key's namespaces only (as /v1/models)."""
        reachable = None
        if self.api_keys is not None:
            key = self._key_of(request)
            if key is None:
                return self._key_refusal()
            reachable = key.namespaces
        return json_answer(self.live.status(reachable=reachable), headers=NO_STORE)

    def _state(self, entry: ModelEntry) -> str:
        if entry.ready:
            return "ready"
        return "queued" if self.queues.depth(entry.key) else "parked"

    def handle_healthz(self, request: Request) -> Answer:
        return json_answer({"status": "ok"})

    def handle_readyz(self, request: Request) -> Answer:
        keys_loaded = self.api_keys is None or self.api_keys.loaded
        if self.directory.synced and keys_loaded:
            return json_answer({"status": "ready"})
        return json_answer({"status": "syncing"}, status=503)

    def handle_metrics(self, request: Request) -> Answer:
        content_type, body = self.metrics.exposition()
        return Answer(200, body, content_type=content_type)


def _in_stream(request: Request, answer: Answer | None) -> Answer | None:
    """`answer` as it is, or, once a waiting stream's 200 went out, as its last event
    (the `{"error": ...}` body in `stream_error_event`'s shape) and the stream's end."""
    if answer is None or not request.answered:
        return answer
    request.write(b"data: " + answer.body + b"\n\n")
    request.finish()
    return None


def model_card(entry: ModelEntry, *, model_id: str, state: str) -> dict[str, Any]:
    """An OpenAI model object, plus what flexinfer knows about the model's state."""
    return {
        "id": model_id,
        "object": "model",
        "created": entry.created,
        "owned_by": entry.namespace,
        "flexinfer": {
            "kind": entry.kind.value,
            "namespace": entry.namespace,
            "name": entry.name,
            "state": state,
            "phase": entry.phase,
            "ready": entry.ready,
            "gpuGroup": entry.gpu_group,
            "servedModelName": entry.backend_model,
            "serviceLabels": list(entry.service_labels),
        },
    }


class ProxyServer:
    """A running proxy: `cleanup()` stops it as SIGTERM does (idempotent)."""

    def __init__(self, proxy: Proxy, server: HttpServer, metrics_server: HttpServer | None) -> None:
        self.proxy = proxy
        self.server = server
        self.metrics_server = metrics_server
        self._stopped = False

    @property
    def port(self) -> int:
        return self.server.port

    async def cleanup(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.server.stop_listening()
        await self.proxy.shutdown()
        await self.server.shutdown(SHUTDOWN_TIMEOUT_SECONDS)
        if self.metrics_server is not None:
            await self.metrics_server.shutdown(SHUTDOWN_TIMEOUT_SECONDS)
        await self.proxy.cleanup()


async def serve(
    proxy: Proxy, *, host: str, port: int, metrics_port: int | None = None
) -> tuple[ProxyServer, int]:
    """Start `proxy` on host:port (0 = any free port); return the server and the port.

    With `metrics_port`, /metrics is served there (by its own server, stopped with
    the main one) instead of on the main port.
    """
    config = proxy.config
    await proxy.start()
    closed = proxy.metrics.connections_closed
    guard = ConnectionGuard(
        max_connections=config.max_connections,
        on_closed=lambda reason: closed.labels(reason=reason).inc(),
    )
    proxy.guard = guard
    proxy.metrics.connections.set_function(lambda: guard.open_connections)
    proxy._serve_metrics = metrics_port is None
    timeouts: dict[str, Any] = {
        "header_timeout": config.client_header_timeout,
        "idle_timeout": config.client_idle_timeout,
        "max_head_bytes": config.max_header_bytes,
        "linger_time": config.lingering_time,
        "linger_bytes": config.lingering_bytes,
    }
    server = HttpServer(proxy.handle, guard=guard, refusal=REFUSED_CONNECTION, **timeouts)
    bound = await server.start(host, port)
    metrics_server: HttpServer | None = None
    if metrics_port is not None:
        metrics_server = HttpServer(proxy.handle_metrics_port, **timeouts)
        proxy.metrics_port = await metrics_server.start(host, metrics_port)
    return ProxyServer(proxy, server, metrics_server), bound
