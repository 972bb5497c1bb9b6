"""Reading a client's request body within the proxy's bounds, and finding its model.

- `--max-body-bytes`: a body that says (Content-Length) or turns out to be larger is
  refused with 413 before or while it is read, never buffered whole.
- `--max-buffered-bytes` (`BodyBudget`): the bytes of every body held at once
  (being read, queued, being sent) stay under the budget; a body that would push
  it over is refused at once (503 + Retry-After) instead of growing the heap. A
  body with a Content-Length reserves it all up front; a chunked one as it comes.
- `--client-body-timeout`: the whole body must arrive within it (408).

The `model` is found as the body arrives (`model_field`); `on_model(name)` is called
as soon as it is known, before the rest is read, so the caller can refuse an
unknown model early by raising. This module knows nothing of routing or queues.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import attrs

from flexinfer_proxy.http_server import Request
from flexinfer_proxy.model_field import (
    SMALL_BODY_BYTES,
    ModelField,
    ModelFieldScanner,
    parse_small_body,
    with_model,
)


class BodyTooLarge(Exception):
    pass


class BodyBudgetExceeded(Exception):
    pass


class BodyTimeout(Exception):
    pass


class BodyBudget:
    """Bytes of request bodies held in memory at once, across every request."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def try_reserve(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size


@attrs.define
class RequestBody:
    """A request's body as received, its model, and its share of the budget."""

    data: bytes | bytearray
    model: str
    payload: dict[str, Any] | None  # decoded, for a small body
    field: ModelField | None  # where the model sits, for a scanned body
    budget: BodyBudget
    reserved: int

    def with_model(self, name: str) -> bytes:
        """The body with `model` set to `name` (the rest untouched when it was scanned)."""
        if self.field is not None:
            return with_model(self.data, self.field, name)
        assert self.payload is not None
        return _encode({**self.payload, "model": name})

    def release(self) -> None:
        self.budget.release(self.reserved)
        self.reserved = 0


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def small_body_at_hand(
    request: Request,
    *,
    max_bytes: int,
    budget: BodyBudget,
    on_model: Callable[[str], None],
) -> RequestBody | None:
    """The body when it is small and has all arrived with its head (the usual case),
    read without waiting, timer or scanner; None otherwise (`read_request_body` then).
    Raises as `read_request_body` does."""
    length = request.content_length
    if length is None or length > SMALL_BODY_BYTES or length > max_bytes:
        return None
    if not request.body.complete:
        return None
    if not budget.try_reserve(length):
        raise BodyBudgetExceeded()
    try:
        return _small(request.body.take(), budget, length, on_model)
    except BaseException:
        budget.release(length)
        raise


async def read_request_body(
    request: Request,
    *,
    max_bytes: int,
    budget: BodyBudget,
    timeout: float,
    on_model: Callable[[str], None],
) -> RequestBody:
    """Read and check the body; raises BodyTooLarge, BodyBudgetExceeded, BodyTimeout or
    `model_field.BadRequest` (and whatever `on_model` raises)."""
    length = request.content_length
    if length is not None and length > max_bytes:
        raise BodyTooLarge()
    reserved = 0
    if length is not None:
        if not budget.try_reserve(length):
            raise BodyBudgetExceeded()
        reserved = length
    try:
        async with asyncio.timeout(timeout):
            if length is not None and length <= SMALL_BODY_BYTES:
                return _small(await request.body.read(), budget, reserved, on_model)
            return await _scanned(request, length, max_bytes, budget, reserved, on_model)
    except TimeoutError as error:
        budget.release(reserved)
        raise BodyTimeout() from error
    except BaseException:
        budget.release(reserved)
        raise


def _small(
    data: bytes, budget: BodyBudget, reserved: int, on_model: Callable[[str], None]
) -> RequestBody:
    model, payload = parse_small_body(data)
    on_model(model)
    return RequestBody(data, model, payload, None, budget, reserved)


async def _scanned(
    request: Request,
    length: int | None,
    max_bytes: int,
    budget: BodyBudget,
    reserved: int,
    on_model: Callable[[str], None],
) -> RequestBody:
    # A known length is reserved already and allocated once (lazily mapped pages);
    # an unknown one grows, reserving as it goes.
    buffer = bytearray(length) if length is not None else bytearray()
    received = 0
    scanner = ModelFieldScanner()
    announced = False
    try:
        while chunk := await request.body.readany():
            size = len(chunk)
            if received + size > max_bytes:
                raise BodyTooLarge()
            if length is None:
                if not budget.try_reserve(size):
                    raise BodyBudgetExceeded()
                reserved += size
                buffer += chunk
            else:
                buffer[received : received + size] = chunk
            received += size
            scanner.feed(buffer, received)
            if not announced and scanner.field is not None:
                announced = True
                on_model(scanner.field.name)
            # The chunk may have been buffered already (no wait in readany): let
            # other clients run between chunks of a large body.
            await asyncio.sleep(0)
    except BaseException:
        budget.release(reserved)
        raise
    if length is not None:
        del buffer[received:]  # a client that sent less than it announced
    if received <= SMALL_BODY_BYTES:
        body = _small(bytes(buffer), budget, reserved, lambda _: None)
        if not announced:
            on_model(body.model)
        return body
    field = scanner.finish(buffer, received)
    if not announced:
        on_model(field.name)
    return RequestBody(buffer, field.name, None, field, budget, reserved)
