"""The HTTP face of the proxy: OpenAI routes, health, readiness and metrics.

A request names its model in the JSON body; the directory resolves the name and
says whether that model is Ready. Ready (and nobody ahead in line) → relayed at
once; otherwise the request queues until the model is Ready or the wait limit
(max(minimum wait, the model's coldStartTimeout)) passes, which answers 503 with
`Retry-After`. Every answer the proxy makes up is OpenAI-shaped JSON, and every
request ends as one outcome of `flexinfer_proxy_requests_total`.

Bounds (all `ProxyConfig` fields, all flags): body size and the bytes of bodies
held at once, the time a body may take, queue lengths per model and overall,
connections and their header and idle timeouts (`connections`), and the backend's
connect, headers and read timeouts (`forward`).

This module wires the pieces (directory, body reader, queues, demand, relay,
metrics) to routes; it holds no cluster code and no decisions beyond "serve, wait
or refuse".
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import aiohttp
import attrs
from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractResolver
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from yarl import URL

from flexinfer_kube.clock import Clock, SystemClock
from flexinfer_proxy import openai_errors
from flexinfer_proxy.api_keys import ApiKeys
from flexinfer_proxy.backend_slots import BackendSlots
from flexinfer_proxy.connections import ConnectionGuard
from flexinfer_proxy.demand import REFRESH_INTERVAL, DemandSignaller, DemandSink
from flexinfer_proxy.directory import ModelDirectory, ModelEntry, Resolution
from flexinfer_proxy.forward import (
    BackendTimeout,
    BackendUnavailable,
    ModelRewrite,
    StreamCut,
    UpstreamTimeouts,
    new_upstream_session,
    relay,
    upstream_headers,
)
from flexinfer_proxy.metrics import (
    OUTCOME_AMBIGUOUS_MODEL,
    OUTCOME_BACKEND_TIMEOUT,
    OUTCOME_BACKEND_UNAVAILABLE,
    OUTCOME_BAD_REQUEST,
    OUTCOME_BODY_TIMEOUT,
    OUTCOME_BODY_TOO_LARGE,
    OUTCOME_CLIENT_DISCONNECTED,
    OUTCOME_INTERNAL_ERROR,
    OUTCOME_PROXY_BUSY,
    OUTCOME_PROXY_CLOSING,
    OUTCOME_QUEUE_FULL,
    OUTCOME_QUEUE_TIMEOUT,
    OUTCOME_SERVED,
    OUTCOME_STREAM_CUT,
    OUTCOME_UNAUTHORIZED,
    OUTCOME_UNKNOWN_MODEL,
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
)

log = logging.getLogger("flexinfer.proxy")
access_log = logging.getLogger("flexinfer.proxy.access")

OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
API_PREFIX = "/v1"
MiB = 1024 * 1024

# A queued request whose backend refuses connections (Ready, not yet listening)
# tries again after these pauses, doubling, within its remaining wait.
RETRY_FIRST_PAUSE = 0.1
RETRY_LONGEST_PAUSE = 2.0
# Backend URLs are parsed once per (endpoint, path and query) and kept, up to this many.
URL_CACHE_SIZE = 1024


@attrs.frozen
class ProxyConfig:
    """Tunables; each is a flag of `python -m flexinfer_proxy` (docs/proxy.md)."""

    min_queue_wait: timedelta = timedelta(seconds=60)
    retry_after_seconds: int = 10
    refresh_interval: timedelta = REFRESH_INTERVAL
    dispatch_grace_seconds: float = DISPATCH_GRACE_SECONDS

    # Requests carry whole conversations and embedding batches, but every byte of a
    # body is held in memory until it is sent: well under the pod's 1 GiB.
    max_body_bytes: int = 16 * MiB
    max_buffered_bytes: int = 256 * MiB
    # Concurrent requests per backend; 0 = no cap. Extra requests wait in order.
    max_per_backend: int = 0
    max_queue: int = 1000  # waiting requests per model
    max_queue_total: int = 10000  # waiting requests overall

    max_connections: int = 4096
    client_header_timeout: float = 10.0
    client_body_timeout: float = 60.0
    client_idle_timeout: float = 75.0

    backend_connect_timeout: float = 10.0
    backend_headers_timeout: float = 600.0
    backend_read_timeout: float = 300.0

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

    def __init__(self, response: web.Response, *, model: str, outcome: str) -> None:
        super().__init__(outcome)
        self.response = response
        self.model = model
        self.outcome = outcome


class Proxy:
    """One proxy: its directory, demand sink, queues, metrics and upstream session."""

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
        self.metrics = ProxyMetrics(registry if registry is not None else CollectorRegistry())
        self.api_keys = api_keys
        self.signaller = DemandSignaller(
            sink,
            clock=self.clock,
            metrics=self.metrics,
            refresh_interval=self.config.refresh_interval,
        )
        self.queues = RequestQueues(
            directory,
            self.signaller,
            clock=self.clock,
            metrics=self.metrics,
            dispatch_grace=self.config.dispatch_grace_seconds,
        )
        self.slots = BackendSlots(self.config.max_per_backend)
        self.budget = BodyBudget(self.config.max_buffered_bytes)
        self.metrics.buffered_bytes.set_function(lambda: self.budget.used)
        self.guard: ConnectionGuard | None = None
        self.metrics_port: int | None = None
        self._timeouts = self.config.upstream_timeouts
        self._resolver = resolver
        self._rng = rng or random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._traced_session: aiohttp.ClientSession | None = None
        self._urls: dict[tuple[str, str], URL] = {}

    def retry_after(self, expected: float = 0.0) -> int:
        """Seconds for `Retry-After`: the expected wait (at least --retry-after) plus up
        to as much again at random, so clients refused together come back spread out."""
        base = max(1.0, float(self.config.retry_after_seconds), expected)
        return math.ceil(base + self._rng.uniform(0.0, base))

    def application(self, *, with_metrics: bool = True) -> web.Application:
        # Every path has a route (the last one catches the rest), so the router never
        # raises its own plain-text 404/405; no middleware: one wrapper per handler.
        app = web.Application(client_max_size=self.config.max_body_bytes)
        for path in OPENAI_ROUTES:
            app.router.add_post(
                path, self._framed(self.handle_openai), expect_handler=self._expect_continue
            )
        app.router.add_get("/v1/models", self._framed(self.handle_models))
        app.router.add_get("/healthz", self._framed(self.handle_healthz))
        app.router.add_get("/readyz", self._framed(self.handle_readyz))
        if with_metrics:
            app.router.add_get("/metrics", self._framed(self.handle_metrics))
        app.router.add_route("*", "/{tail:.*}", self._framed(self.handle_unsupported))
        app.on_startup.append(self._startup)
        app.on_shutdown.append(self._shutdown)
        app.on_cleanup.append(self._cleanup)
        return app

    def metrics_application(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.handle_metrics)
        return app

    async def _startup(self, app: web.Application) -> None:
        self._session = new_upstream_session(timeouts=self._timeouts, resolver=self._resolver)
        self._traced_session = new_upstream_session(
            timeouts=self._timeouts, resolver=self._resolver, traced=True
        )
        await self.directory.start()

    async def _shutdown(self, app: web.Application) -> None:
        # Before in-flight requests are waited for: queued ones get a 503 now.
        await self.queues.close()

    async def _cleanup(self, app: web.Application) -> None:
        # After in-flight requests finished (or timed out): the session can go.
        await self.signaller.close()
        await self.directory.stop()
        for session in (self._session, self._traced_session):
            if session is not None:
                await session.close()

    def _framed(
        self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """`handler`, telling the connection guard a request is in progress, and with
        every error it raises answered in OpenAI's shape."""

        async def framed(request: web.Request) -> web.StreamResponse:
            connection = self.guard.of(request) if self.guard is not None else None
            if connection is None:
                return await self._answer(request, handler)
            connection.started()
            try:
                response = await self._answer(request, handler)
                if not response.prepared:
                    # Written here, not after we return, so the connection is not
                    # counted idle (and evictable) while its answer is on its way.
                    await response.prepare(request)
                    await response.write_eof()
                return response
            finally:
                connection.finished()

        return framed

    async def _answer(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            return openai_errors.error_response(
                error.status,
                error.reason,
                error_type="invalid_request_error",
                code=f"http_{error.status}",
            )
        except Exception:
            log.exception("failed to handle %s %s", request.method, request.path)
            self.metrics.request_done("", OUTCOME_INTERNAL_ERROR)
            return openai_errors.internal_error()

    async def _expect_continue(self, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue` (curl sends it for bodies over 1 MiB): refuse a body
        that is too large before the client sends it, else invite it."""
        expect = request.headers.get("Expect", "")
        if request.version != HttpVersion11 or expect.lower() != "100-continue":
            return None
        if (request.content_length or 0) > self.config.max_body_bytes:
            self.metrics.request_done("", OUTCOME_BODY_TOO_LARGE)
            return self._closing(openai_errors.body_too_large(self.config.max_body_bytes))
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # as aiohttp's own: the answer has not begun
        return None

    # -- the OpenAI routes ---------------------------------------------------------

    async def handle_openai(self, request: web.Request) -> web.StreamResponse:
        if self.api_keys is not None:
            refusal = self._check_key(request)
            if refusal is not None:
                return refusal
        resolved: list[Resolution] = []
        try:
            body = await read_request_body(
                request,
                max_bytes=self.config.max_body_bytes,
                budget=self.budget,
                timeout=self.config.client_body_timeout,
                on_model=lambda name: resolved.append(self._resolve_or_refuse(name)),
            )
        except _Refusal as refusal:
            self.metrics.request_done(refusal.model, refusal.outcome)
            return self._closing(refusal.response)
        except BadRequest as error:
            self.metrics.request_done("", OUTCOME_BAD_REQUEST)
            return self._closing(openai_errors.bad_request(str(error), param=error.param))
        except BodyTooLarge:
            self.metrics.request_done("", OUTCOME_BODY_TOO_LARGE)
            return self._closing(openai_errors.body_too_large(self.config.max_body_bytes))
        except BodyBudgetExceeded:
            self.metrics.request_done("", OUTCOME_PROXY_BUSY)
            log.warning("request body refused: %d bytes of bodies held", self.budget.used)
            return self._closing(openai_errors.proxy_busy(retry_after=self.retry_after()))
        except BodyTimeout:
            self.metrics.request_done("", OUTCOME_BODY_TIMEOUT)
            timeout = self.config.client_body_timeout
            return self._closing(openai_errors.body_timeout(timeout))
        except (web.RequestPayloadError, ConnectionError) as error:
            # The client went away (or broke its own framing) in the middle of its body.
            self.metrics.request_done("", OUTCOME_CLIENT_DISCONNECTED)
            log.info("request body cut off by the client: %s", error)
            message = "The request body was cut off before its end."
            return self._closing(openai_errors.bad_request(message, param=None))
        except asyncio.CancelledError:
            self.metrics.request_done("", OUTCOME_CLIENT_DISCONNECTED)
            raise
        try:
            entry = resolved[-1].entry
            assert entry is not None
            return await self._route(request, entry, body)
        finally:
            body.release()

    def _check_key(self, request: web.Request) -> web.Response | None:
        assert self.api_keys is not None
        if not self.api_keys.loaded:
            self.metrics.request_done("", OUTCOME_UNAUTHORIZED)
            return openai_errors.directory_syncing("any model", retry_after=self.retry_after())
        if not self.api_keys.accepts(request.headers.get("Authorization")):
            self.metrics.request_done("", OUTCOME_UNAUTHORIZED)
            return openai_errors.unauthorized()
        return None

    def _resolve_or_refuse(self, name: str) -> Resolution:
        """Called as soon as the body's `model` is read: refuse what cannot be served."""
        resolution = self.directory.resolve(name)
        if resolution.ambiguous:
            raise _Refusal(
                openai_errors.ambiguous_model(name, resolution.ambiguous),
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
        return resolution

    def _queue_full(self, entry: ModelEntry, limit: int, scope: str) -> _Refusal:
        expected = self.config.wait_limit(entry) - self.queues.oldest_wait(entry.key)
        response = openai_errors.queue_full(
            entry.name, limit=limit, scope=scope, retry_after=self.retry_after(expected)
        )
        return _Refusal(response, model=entry.name, outcome=OUTCOME_QUEUE_FULL)

    @staticmethod
    def _closing(response: web.Response) -> web.Response:
        # The body may be unread: do not try to find the next request after it.
        response.force_close()
        return response

    async def _route(
        self, request: web.Request, entry: ModelEntry, body: RequestBody
    ) -> web.StreamResponse:
        ticket: Ticket | None = None
        deadline = 0.0
        if not entry.ready or self.queues.depth(entry.key):
            ticket, refusal = await self._wait_in_queue(entry)
            if refusal is not None:
                return refusal
            deadline = ticket.enqueued_at + self.config.wait_limit(entry)
            entry = self.directory.lookup(entry.key) or entry
        try:
            return await self._forward(request, entry, body=body, ticket=ticket, deadline=deadline)
        finally:
            if ticket is not None:
                ticket.dispatched()

    async def _wait_in_queue(self, entry: ModelEntry) -> tuple[Ticket, web.StreamResponse | None]:
        ticket = self.queues.enqueue(entry)
        limit = self.config.wait_limit(entry)
        try:
            result = await self.queues.wait(ticket, limit=limit)
        except asyncio.CancelledError:
            self._queue_done(entry.name, ticket, outcome=OUTCOME_CLIENT_DISCONNECTED)
            log.info("client left while %s was queued", entry.key)
            raise
        if result is WaitResult.ADMITTED:
            self.metrics.queue_wait.labels(model=entry.name).observe(self.queues.waited(ticket))
            return ticket, None
        retry_after = self.retry_after()
        if result is WaitResult.CLOSING:
            self._queue_done(entry.name, ticket, outcome=OUTCOME_PROXY_CLOSING)
            return ticket, openai_errors.proxy_closing(entry.name, retry_after=retry_after)
        self._queue_done(entry.name, ticket, outcome=OUTCOME_QUEUE_TIMEOUT)
        log.warning("%s was not Ready within %.3gs; answered 503", entry.key, limit)
        return ticket, openai_errors.model_not_ready(
            entry.name, waited_seconds=limit, retry_after=retry_after
        )

    def _queue_done(self, model: str, ticket: Ticket, *, outcome: str) -> None:
        self.metrics.queue_wait.labels(model=model).observe(self.queues.waited(ticket))
        self.metrics.request_done(model, outcome)

    async def _forward(
        self,
        request: web.Request,
        entry: ModelEntry,
        *,
        body: RequestBody,
        ticket: Ticket | None,
        deadline: float,
    ) -> web.StreamResponse:
        assert self._session is not None and self._traced_session is not None, "not started"
        # A request that left a queue must say when it reached its backend (the drain
        # waits for that before it admits the next); tracing costs, so only those pay.
        session = self._session if ticket is None else self._traced_session
        self.signaller.served(entry)
        data: bytes | bytearray = body.data
        rewrite = None
        if entry.backend_model != body.model:
            data = body.with_model(entry.backend_model)
            rewrite = ModelRewrite(requested=body.model, backend=entry.backend_model)
        headers = upstream_headers(
            request.headers,
            client=request.remote,
            drop=("authorization",) if self.api_keys is not None else (),
        )
        loop = asyncio.get_running_loop()
        pause = RETRY_FIRST_PAUSE
        while True:
            try:
                response = await relay(
                    session,
                    request,
                    url=self._backend_url(entry, request),
                    body=data,
                    headers=headers,
                    slots=self.slots,
                    timeouts=self._timeouts,
                    rewrite=rewrite,
                    on_dispatched=ticket.dispatched if ticket is not None else None,
                )
            except BackendUnavailable as error:
                if error.retryable and loop.time() + pause < deadline:
                    log.info("backend of %s not answering yet (%s); retrying", entry.key, error)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_LONGEST_PAUSE)
                    entry = self.directory.lookup(entry.key) or entry
                    continue
                log.warning("backend of %s at %s: %s", entry.key, entry.endpoint, error)
                self.metrics.request_done(entry.name, OUTCOME_BACKEND_UNAVAILABLE)
                return openai_errors.backend_unavailable(entry.name)
            except BackendTimeout as error:
                log.warning("backend of %s at %s: %s", entry.key, entry.endpoint, error)
                self.metrics.request_done(entry.name, OUTCOME_BACKEND_TIMEOUT)
                timeout = self._timeouts.headers
                return openai_errors.backend_timeout(entry.name, timeout)
            except StreamCut as error:
                log.warning("backend of %s: %s", entry.key, error)
                self.metrics.request_done(entry.name, OUTCOME_STREAM_CUT)
                if request.transport is not None:
                    # No clean end: the client must see a cut (aiohttp's final write
                    # then fails quietly, as for a client that went away).
                    request.transport.close()
                return error.response
            except asyncio.CancelledError:
                self.metrics.request_done(entry.name, OUTCOME_CLIENT_DISCONNECTED)
                raise
            self.metrics.request_done(entry.name, OUTCOME_SERVED)
            return response

    def _backend_url(self, entry: ModelEntry, request: web.Request) -> URL:
        key = (entry.endpoint, request.raw_path)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) >= URL_CACHE_SIZE:
                self._urls.clear()  # many distinct query strings: start over
            url = self._urls[key] = backend_url(entry, request)
        return url

    # -- other routes --------------------------------------------------------------

    async def handle_unsupported(self, request: web.Request) -> web.Response:
        if request.path.startswith(API_PREFIX + "/"):
            return openai_errors.unsupported_route(request.method, request.path)
        return openai_errors.error_response(
            404,
            f"{request.method} {request.path} is not a route of this proxy.",
            error_type="invalid_request_error",
            code="not_found",
        )

    async def handle_models(self, request: web.Request) -> web.Response:
        if self.api_keys is not None:
            refusal = self._check_key(request)
            if refusal is not None:
                return refusal
        entries = self.directory.entries()
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
        return web.json_response({"object": "list", "data": data})

    def _state(self, entry: ModelEntry) -> str:
        if entry.ready:
            return "ready"
        return "queued" if self.queues.depth(entry.key) else "parked"

    async def handle_healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def handle_readyz(self, request: web.Request) -> web.Response:
        keys_loaded = self.api_keys is None or self.api_keys.loaded
        if self.directory.synced and keys_loaded:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "syncing"}, status=503)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def backend_url(entry: ModelEntry, request: web.Request) -> URL:
    """`<endpoint>/<path after /v1>[?query]`; the query exactly as the client sent it."""
    suffix = request.raw_path[len(API_PREFIX) :]
    return URL(entry.endpoint.rstrip("/") + suffix, encoded=True)


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


class _QuietParseErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (the client's fault: garbage, TLS to a
    plain port, a bad header) as an ERROR with a traceback; it is one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = f"{record.getMessage()}: {error.message or error!r}"
            record.args = ()
            record.exc_info = record.exc_text = None
        return True


_QUIET_PARSE_ERRORS = _QuietParseErrors()


class _GuardedSite(web.TCPSite):
    """A TCP site whose connections go through the proxy's `ConnectionGuard`."""

    __slots__ = ("_guard_of",)

    def __init__(
        self, runner: web.AppRunner, host: str, port: int, *, guard_of: Callable[..., Any]
    ) -> None:
        super().__init__(runner, host, port, backlog=1024)
        self._guard_of = guard_of

    async def start(self) -> None:
        self._runner._reg_site(self)
        loop = asyncio.get_running_loop()
        assert self._runner.server is not None
        guard = self._guard_of(self._runner.server, loop)
        self._server = await loop.create_server(
            guard, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
        self._bound_port = int(self._server.sockets[0].getsockname()[1])


async def serve(
    proxy: Proxy, *, host: str, port: int, metrics_port: int | None = None
) -> tuple[web.AppRunner, int]:
    """Start `proxy` on host:port (0 = any free port); return the runner and the port.

    With `metrics_port`, /metrics is served there (on its own runner, cleaned up
    with the main one) instead of on the main port.
    """
    config = proxy.config
    server_log = logging.getLogger("aiohttp.server")
    if _QUIET_PARSE_ERRORS not in server_log.filters:
        server_log.addFilter(_QUIET_PARSE_ERRORS)
    app = proxy.application(with_metrics=metrics_port is None)
    metrics_runner: web.AppRunner | None = None
    if metrics_port is not None:
        metrics_runner = web.AppRunner(proxy.metrics_application(), access_log=None)

        async def stop_metrics(app: web.Application) -> None:
            assert metrics_runner is not None
            await metrics_runner.cleanup()

        app.on_cleanup.append(stop_metrics)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=access_log if config.access_log else None,
        keepalive_timeout=config.client_idle_timeout,
    )
    await runner.setup()

    def guard_of(inner: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> ConnectionGuard:
        closed = proxy.metrics.connections_closed
        guard = ConnectionGuard(
            inner,
            max_connections=config.max_connections,
            header_timeout=config.client_header_timeout,
            loop=loop,
            on_closed=lambda reason: closed.labels(reason=reason).inc(),
        )
        proxy.guard = guard
        proxy.metrics.connections.set_function(lambda: guard.open_connections)
        return guard

    site = _GuardedSite(runner, host, port, guard_of=guard_of)
    await site.start()
    if metrics_runner is not None:
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, host, metrics_port).start()
        proxy.metrics_port = _bound_port(metrics_runner)
    return runner, site.port


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError(f"not listening on a TCP port: {runner.addresses!r}")
