"""Error responses in the shape OpenAI clients parse: `{"error": {...}}`.

Every answer the proxy makes up itself (as opposed to relaying a backend's) goes
through here, so clients always get JSON with `message`, `type`, `param` and
`code`. This module builds responses; it does not decide when to send them.
"""

from __future__ import annotations

from aiohttp import web


def error_response(
    status: int,
    message: str,
    *,
    error_type: str,
    code: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def bad_request(message: str, *, param: str | None) -> web.Response:
    return error_response(
        400, message, error_type="invalid_request_error", code="invalid_request", param=param
    )


def unsupported_route(method: str, path: str) -> web.Response:
    return error_response(
        404,
        f"{method} {path} is not served by this proxy; it serves POST /v1/chat/completions, "
        "/v1/completions, /v1/embeddings and GET /v1/models.",
        error_type="invalid_request_error",
        code="unsupported_route",
    )


def model_not_found(model: str) -> web.Response:
    return error_response(
        404,
        f"The model '{model}' does not exist or is not served by this proxy.",
        error_type="invalid_request_error",
        code="model_not_found",
        param="model",
    )


def backend_unavailable(model: str, detail: str) -> web.Response:
    return error_response(
        502,
        f"The backend of model '{model}' could not be reached: {detail}",
        error_type="server_error",
        code="backend_unavailable",
    )


def _retry_later(message: str, *, code: str, retry_after: int) -> web.Response:
    """503 with `Retry-After`: the request may well succeed if sent again later."""
    return error_response(
        503,
        f"{message}; retry after {retry_after}s.",
        error_type="server_error",
        code=code,
        headers={"Retry-After": str(retry_after)},
    )


def model_not_ready(model: str, *, waited_seconds: float, retry_after: int) -> web.Response:
    return _retry_later(
        f"The model '{model}' did not become ready within {waited_seconds:.3g}s; "
        "it is still starting",
        code="model_not_ready",
        retry_after=retry_after,
    )


def proxy_closing(model: str, *, retry_after: int) -> web.Response:
    return _retry_later(
        f"The proxy is restarting; the request for '{model}' was not sent",
        code="proxy_restarting",
        retry_after=retry_after,
    )


def directory_syncing(model: str, *, retry_after: int) -> web.Response:
    return _retry_later(
        f"The proxy is still loading the list of models and does not know '{model}' yet",
        code="proxy_starting",
        retry_after=retry_after,
    )
