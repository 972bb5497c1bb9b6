"""The HTTP face of the proxy: OpenAI routes, health, readiness and metrics.

A request names its model in the JSON body; the directory says where that model
lives and whether it is Ready. Ready (and nobody ahead in line) → relayed at once;
otherwise the request queues until the model is Ready or the wait limit
(max(minimum wait, the model's coldStartTimeout)) passes, which answers 503 with
`Retry-After`. Every answer the proxy makes up is OpenAI-shaped JSON.

This module wires the pieces (directory, queues, demand, relay, metrics) to
routes; it holds no cluster code and no decisions beyond "serve, wait or refuse".
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from typing import Any

import aiohttp
import attrs
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from flexinfer_kube.clock import Clock, SystemClock
from flexinfer_proxy import openai_errors
from flexinfer_proxy.backend_slots import BackendSlots
from flexinfer_proxy.demand import REFRESH_INTERVAL, DemandSignaller, DemandSink
from flexinfer_proxy.directory import ModelDirectory, ModelEntry
from flexinfer_proxy.forward import BackendUnavailable, StreamCut, new_upstream_session, relay
from flexinfer_proxy.metrics import (
    OUTCOME_BACKEND_UNAVAILABLE,
    OUTCOME_BAD_REQUEST,
    OUTCOME_CLIENT_DISCONNECTED,
    OUTCOME_PROXY_CLOSING,
    OUTCOME_QUEUE_TIMEOUT,
    OUTCOME_SERVED,
    OUTCOME_UNKNOWN_MODEL,
    ProxyMetrics,
)
from flexinfer_proxy.queues import DISPATCH_GRACE_SECONDS, RequestQueues, Ticket, WaitResult

log = logging.getLogger("flexinfer.proxy")

OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
API_PREFIX = "/v1"


@attrs.frozen
class ProxyConfig:
    """Tunables; the defaults are spec/election.md's."""

    min_queue_wait: timedelta = timedelta(seconds=60)
    retry_after_seconds: int = 10
    refresh_interval: timedelta = REFRESH_INTERVAL
    dispatch_grace_seconds: float = DISPATCH_GRACE_SECONDS

    # Requests carry whole conversations (and embedding batches): aiohttp's 1 MiB is too small.
    max_body_bytes: int = 64 * 1024 * 1024
    # Concurrent requests per backend; 0 = no cap. Extra requests wait in order.
    max_per_backend: int = 0

    def wait_limit(self, entry: ModelEntry) -> float:
        return max(self.min_queue_wait, entry.cold_start_timeout).total_seconds()


class BadRequest(Exception):
    def __init__(self, message: str, *, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def requested_model(body: bytes) -> str:
    """The `model` field of an OpenAI request body; BadRequest names what is wrong."""
    try:
        payload = json.loads(body)
    except ValueError as error:
        raise BadRequest(f"The request body is not valid JSON: {error}", param=None) from error
    if not isinstance(payload, dict):
        raise BadRequest("The request body must be a JSON object.", param=None)
    model = payload.get("model")
    if model is None:
        raise BadRequest("Missing required field 'model'.", param="model")
    if not isinstance(model, str) or not model:
        raise BadRequest("The field 'model' must be a non-empty string.", param="model")
    return model


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
    ) -> None:
        self.directory = directory
        self.config = config or ProxyConfig()
        self.clock = clock or SystemClock()
        self.metrics = ProxyMetrics(registry if registry is not None else CollectorRegistry())
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
        self._session: aiohttp.ClientSession | None = None

    @property
    def _retry_after(self) -> int:
        return max(1, self.config.retry_after_seconds)

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        for path in OPENAI_ROUTES:
            app.router.add_post(path, self.handle_openai)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/readyz", self.handle_readyz)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_route("*", "/v1/{tail:.*}", self.handle_unsupported)
        app.on_startup.append(self._startup)
        app.on_shutdown.append(self._shutdown)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app: web.Application) -> None:
        self._session = new_upstream_session()
        await self.directory.start()

    async def _shutdown(self, app: web.Application) -> None:
        # Before in-flight requests are waited for: queued ones get a 503 now.
        await self.queues.close()

    async def _cleanup(self, app: web.Application) -> None:
        # After in-flight requests finished (or timed out): the session can go.
        await self.signaller.close()
        await self.directory.stop()
        if self._session is not None:
            await self._session.close()

    async def handle_openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            name = requested_model(body)
        except BadRequest as error:
            self.metrics.request_done("", OUTCOME_BAD_REQUEST)
            return openai_errors.bad_request(str(error), param=error.param)
        entry = self.directory.lookup(name)
        if entry is None:
            self.metrics.request_done("", OUTCOME_UNKNOWN_MODEL)
            if not self.directory.synced:
                # Right after start the model may exist but not be listed yet.
                return openai_errors.directory_syncing(name, retry_after=self._retry_after)
            return openai_errors.model_not_found(name)
        ticket: Ticket | None = None
        if not entry.ready or self.queues.depth(name):
            ticket, refusal = await self._wait_in_queue(entry)
            if refusal is not None:
                return refusal
            entry = self.directory.lookup(name) or entry
        try:
            return await self._forward(request, entry, body=body, ticket=ticket)
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
            log.info("client left while %s was queued", entry.name)
            raise
        if result is WaitResult.ADMITTED:
            self.metrics.queue_wait.labels(model=entry.name).observe(self.queues.waited(ticket))
            return ticket, None
        retry_after = self._retry_after
        if result is WaitResult.CLOSING:
            self._queue_done(entry.name, ticket, outcome=OUTCOME_PROXY_CLOSING)
            return ticket, openai_errors.proxy_closing(entry.name, retry_after=retry_after)
        self._queue_done(entry.name, ticket, outcome=OUTCOME_QUEUE_TIMEOUT)
        log.warning("%s was not Ready within %.3gs; answered 503", entry.name, limit)
        return ticket, openai_errors.model_not_ready(
            entry.name, waited_seconds=limit, retry_after=retry_after
        )

    def _queue_done(self, model: str, ticket: Ticket, *, outcome: str) -> None:
        self.metrics.queue_wait.labels(model=model).observe(self.queues.waited(ticket))
        self.metrics.request_done(model, outcome)

    async def _forward(
        self, request: web.Request, entry: ModelEntry, *, body: bytes, ticket: Ticket | None
    ) -> web.StreamResponse:
        assert self._session is not None, "the proxy was not started"
        self.signaller.served(entry)
        url = backend_url(entry, request)
        on_dispatched = ticket.dispatched if ticket is not None else _nothing
        try:
            response = await relay(
                self._session,
                request,
                url=url,
                body=body,
                slots=self.slots,
                on_dispatched=on_dispatched,
            )
        except BackendUnavailable as error:
            log.warning("backend of %s unreachable at %s: %s", entry.name, url, error)
            self.metrics.request_done(entry.name, OUTCOME_BACKEND_UNAVAILABLE)
            return openai_errors.backend_unavailable(entry.name, str(error))
        except StreamCut as error:
            log.warning("backend of %s failed mid-answer: %s", entry.name, error)
            self.metrics.request_done(entry.name, OUTCOME_BACKEND_UNAVAILABLE)
            raise
        except asyncio.CancelledError:
            self.metrics.request_done(entry.name, OUTCOME_CLIENT_DISCONNECTED)
            raise
        self.metrics.request_done(entry.name, OUTCOME_SERVED)
        return response

    async def handle_unsupported(self, request: web.Request) -> web.Response:
        return openai_errors.unsupported_route(request.method, request.path)

    async def handle_models(self, request: web.Request) -> web.Response:
        data = [model_card(entry) for entry in self.directory.entries()]
        return web.json_response({"object": "list", "data": data})

    async def handle_healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def handle_readyz(self, request: web.Request) -> web.Response:
        if self.directory.synced:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "syncing"}, status=503)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _nothing() -> None:
    return None


def backend_url(entry: ModelEntry, request: web.Request) -> str:
    """`<endpoint>/<path after /v1>[?query]`; the endpoint already ends in /v1."""
    suffix = request.path[len(API_PREFIX) :]
    url = entry.endpoint.rstrip("/") + suffix
    if request.query_string:
        url += "?" + request.query_string
    return url


def model_card(entry: ModelEntry) -> dict[str, Any]:
    """An OpenAI model object, plus what flexinfer knows about the model's state."""
    return {
        "id": entry.name,
        "object": "model",
        "created": entry.created,
        "owned_by": entry.namespace,
        "flexinfer": {
            "kind": entry.kind.value,
            "namespace": entry.namespace,
            "phase": entry.phase,
            "ready": entry.ready,
            "gpuGroup": entry.gpu_group,
        },
    }


async def serve(proxy: Proxy, *, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start `proxy` on host:port (0 = any free port); return the runner and the port."""
    runner = web.AppRunner(proxy.application(), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = _bound_port(runner)
    return runner, bound


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError(f"the proxy is not listening on a TCP port: {runner.addresses!r}")
