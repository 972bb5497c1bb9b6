"""Error responses in the shape OpenAI clients parse: `{"error": {...}}`.

Every answer the proxy makes up itself (as opposed to relaying a backend's) goes
through here, so clients always get JSON with `message`, `type`, `param` and
`code`. This module builds responses; it does not decide when to send them.
"""

from __future__ import annotations

import json

from flexinfer_proxy.http_server import Answer


def error_body(
    message: str, *, error_type: str, code: str, param: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    error_type: str,
    code: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    body = error_body(message, error_type=error_type, code=code, param=param)
    return Answer(status, json.dumps(body).encode(), headers=headers)


def raw_response(status: int, reason: str, message: str, *, code: str) -> bytes:
    """A whole HTTP/1.1 error answer as bytes, for a connection refused before parsing."""
    body = json.dumps(error_body(message, error_type="server_error", code=code)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def stream_error_event(message: str, *, code: str) -> bytes:
    """A server-sent event OpenAI clients raise as an error (`data: {"error": ...}`)."""
    body = error_body(message, error_type="server_error", code=code)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def bad_request(message: str, *, param: str | None) -> Answer:
    return error_response(
        400, message, error_type="invalid_request_error", code="invalid_request", param=param
    )


def unsupported_route(method: str, path: str) -> Answer:
    return error_response(
        404,
        f"{method} {path} is not served by this proxy; it serves POST /v1/chat/completions, "
        "/v1/completions, /v1/embeddings and GET /v1/models.",
        error_type="invalid_request_error",
        code="unsupported_route",
    )


def ambiguous_model(
    model: str, namespaces: tuple[str, ...], *, labelled_in: tuple[str, ...] = ()
) -> Answer:
    """409: `model` means something in several namespaces (a model's name or a service
    label in each); naming each lets nobody's requests go to another tenant silently."""
    meanings = ", ".join(
        f"a service label in {namespace}" if namespace in labelled_in else f"a model in {namespace}"
        for namespace in namespaces
    )
    choices = ", ".join(f"'{namespace}/{model}'" for namespace in namespaces)
    return error_response(
        409,
        f"The model '{model}' is ambiguous: it names {meanings}; name one: {choices}.",
        error_type="invalid_request_error",
        code="ambiguous_model",
        param="model",
    )


def body_too_large(limit: int) -> Answer:
    return error_response(
        413,
        f"The request body is larger than this proxy accepts ({limit} bytes, --max-body-bytes).",
        error_type="invalid_request_error",
        code="request_too_large",
    )


def body_timeout(seconds: float) -> Answer:
    return error_response(
        408,
        f"The request body did not arrive within {seconds:g}s (--client-body-timeout).",
        error_type="invalid_request_error",
        code="request_timeout",
    )


def unauthorized() -> Answer:
    return error_response(
        401,
        "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
        error_type="invalid_request_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def internal_error() -> Answer:
    return error_response(
        500,
        "The proxy failed to handle the request; the error is in its log.",
        error_type="server_error",
        code="internal_error",
    )


def model_not_found(model: str) -> Answer:
    return error_response(
        404,
        f"The model '{model}' does not exist or is not served by this proxy.",
        error_type="invalid_request_error",
        code="model_not_found",
        param="model",
    )


def backend_unavailable(model: str) -> Answer:
    # The cause (host, port, error) goes to the proxy's log, not to the client.
    return error_response(
        502,
        f"The backend of model '{model}' could not be reached or gave no valid answer.",
        error_type="server_error",
        code="backend_unavailable",
    )


def backend_timeout(model: str, seconds: float) -> Answer:
    return error_response(
        504,
        f"The backend of model '{model}' did not answer within {seconds:g}s.",
        error_type="server_error",
        code="backend_timeout",
    )


def _retry_later(message: str, *, code: str, retry_after: int) -> Answer:
    """503 with `Retry-After`: the request may well succeed if sent again later."""
    return error_response(
        503,
        f"{message}; retry after {retry_after}s.",
        error_type="server_error",
        code=code,
        headers={"Retry-After": str(retry_after)},
    )


def queue_full(model: str, *, limit: int, scope: str, retry_after: int) -> Answer:
    return _retry_later(
        f"Too many requests are waiting for '{model}' ({limit} {scope}, --max-queue)",
        code="queue_full",
        retry_after=retry_after,
    )


def _slow_down(message: str, *, code: str, retry_after: int) -> Answer:
    """429 with `Retry-After`: this client asks for more than its share."""
    return error_response(
        429,
        f"{message}; retry after {retry_after}s.",
        error_type="rate_limit_error",
        code=code,
        headers={"Retry-After": str(retry_after)},
    )


def client_concurrency_limit(limit: int, *, retry_after: int) -> Answer:
    return _slow_down(
        f"This client (its API key, or its address without keys) has {limit} requests in "
        "progress, as many as it may (--max-concurrent-per-client)",
        code="client_concurrency_limit",
        retry_after=retry_after,
    )


def client_queue_limit(model: str, *, limit: int, retry_after: int) -> Answer:
    return _slow_down(
        f"This client (its API key, or its address without keys) has {limit} requests "
        f"waiting for models to start, as many as it may (--max-queued-per-client); "
        f"'{model}' is not ready",
        code="client_queue_limit",
        retry_after=retry_after,
    )


def proxy_busy(*, retry_after: int) -> Answer:
    return _retry_later(
        "The proxy holds as many request bodies as it may (--max-buffered-bytes)",
        code="proxy_busy",
        retry_after=retry_after,
    )


def model_not_ready(model: str, *, waited_seconds: float, retry_after: int) -> Answer:
    return _retry_later(
        f"The model '{model}' did not become ready within {waited_seconds:.3g}s; "
        "it is still starting",
        code="model_not_ready",
        retry_after=retry_after,
    )


def proxy_closing(model: str, *, retry_after: int) -> Answer:
    return _retry_later(
        f"The proxy is restarting; the request for '{model}' was not sent",
        code="proxy_restarting",
        retry_after=retry_after,
    )


def keys_loading(*, retry_after: int) -> Answer:
    return _retry_later(
        "The proxy has not read its API keys yet",
        code="proxy_starting",
        retry_after=retry_after,
    )


def directory_syncing(model: str, *, retry_after: int) -> Answer:
    return _retry_later(
        f"The proxy is still loading the list of models and does not know '{model}' yet",
        code="proxy_starting",
        retry_after=retry_after,
    )
