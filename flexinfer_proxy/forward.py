"""Relaying one request to a backend and its answer back to the client.

The request body is sent as the client sent it; the answer is copied chunk by
chunk as it arrives (server-sent events included), with its status and headers,
never buffered whole and never decompressed. Hop-by-hop headers are dropped in
both directions. A backend that cannot be reached before it answered becomes a
`BackendUnavailable`; a failure after the answer started can only cut the stream.

This module knows nothing about models, queues or demand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from flexinfer_proxy.backend_slots import BackendSlots

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

CONNECT_TIMEOUT_SECONDS = 10.0


class BackendUnavailable(Exception):
    """The backend could not be reached, or closed the connection before answering."""


class StreamCut(Exception):
    """The backend failed after its answer had started; the client's stream is cut."""


def upstream_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop ones; repeated headers stay repeated."""
    return [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP]


def _dispatch_tracer() -> aiohttp.TraceConfig:
    """Call the request's `on_dispatched` once its headers are on the wire."""

    async def headers_sent(
        session: aiohttp.ClientSession, context: SimpleNamespace, params: Any
    ) -> None:
        callbacks = getattr(context, "trace_request_ctx", None) or {}
        on_dispatched = callbacks.get("on_dispatched")
        if on_dispatched is not None:
            on_dispatched()

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(headers_sent)
    return trace


def new_upstream_session(
    *, connect_timeout: float = CONNECT_TIMEOUT_SECONDS
) -> aiohttp.ClientSession:
    """One pooled session for all backends; no total timeout (generation can be long)."""
    return aiohttp.ClientSession(
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
        connector=aiohttp.TCPConnector(limit=0),
        trace_configs=[_dispatch_tracer()],
    )


def backend_of(url: str) -> str:
    """The scheme, host and port a URL talks to: what a backend slot is counted by."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


async def relay(
    session: aiohttp.ClientSession,
    request: web.Request,
    *,
    url: str,
    body: bytes,
    slots: BackendSlots,
    on_dispatched: Callable[[], None] = lambda: None,
) -> web.StreamResponse:
    """Send `body` to `url` and stream the backend's answer back to the client.

    `on_dispatched` is called once the request's place is fixed: its headers are
    on the wire, or it waits in line for one of the backend's capped `slots`.
    """
    async with slots.slot(backend_of(url), on_queued=on_dispatched):
        try:
            upstream = await session.request(
                request.method,
                url,
                data=body,
                headers=upstream_headers(request.headers),
                trace_request_ctx={"on_dispatched": on_dispatched},
            )
        except (TimeoutError, aiohttp.ClientConnectionError) as error:
            raise BackendUnavailable(str(error) or type(error).__name__) from error
        async with upstream:
            return await _stream_back(request, upstream)


async def _stream_back(
    request: web.Request, upstream: aiohttp.ClientResponse
) -> web.StreamResponse:
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for key, value in upstream.headers.items():
        if key.lower() not in HOP_BY_HOP:
            response.headers.add(key, value)
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    await response.prepare(request)
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    except aiohttp.ClientError as error:
        # Headers are gone already: the only honest signal left is a cut stream.
        raise StreamCut(str(error) or type(error).__name__) from error
    await response.write_eof()
    return response
