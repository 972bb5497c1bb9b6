"""Finding the `model` of an OpenAI request body, and changing it.

Two readers that agree on every valid JSON object:

- `parse_small_body(body)`: `json.loads` for bodies up to `SMALL_BODY_BYTES`
  (microseconds; exact error messages; too-deep nesting is a `BadRequest`, not a
  `RecursionError`).
- `ModelFieldScanner`: for larger bodies, fed chunk by chunk as they arrive. It
  walks the top-level object only: nested values, strings and numbers are skipped
  with regular expressions (C speed) and never turned into Python objects, so a
  50 MB embeddings body costs a scan, not a parse, and the `model` is known as soon
  as its value has arrived (an unknown model can be refused before the rest is
  read). Nested values are not validated: the backend does that.

A body whose top-level `model` appears twice is refused by the scanner; `json.loads`
keeps the last, as backends do. The scanner records where the value's bytes are, so
`with_model` can splice a new name in without re-encoding the rest.

This module parses and edits bytes; it performs no I/O.
"""

from __future__ import annotations

import enum
import json
import json.scanner
import re
from typing import Any

import attrs

# Above this, a body is scanned rather than parsed: json.loads of 256 KiB takes ~1 ms.
SMALL_BODY_BYTES = 256 * 1024

_WHITESPACE = re.compile(rb"[ \t\r\n]*")
# The rest of a string after its opening quote: stops at its closing quote, or at
# the end of the data (possibly just before a lone trailing backslash).
_STRING_REST = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.DOTALL)
# Inside nested values: skips every complete string and every scalar, stopping at a
# bracket or at a string that has not fully arrived.
# Possessive quantifiers: no backtracking state is kept, so memory stays flat.
_NESTED_SKIP = re.compile(rb'(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"|[^"\[\]{}]++)*+', re.DOTALL)
# A top-level scalar (number, true, false, null): up to the next structural byte.
_SCALAR = re.compile(rb'[^,}\]\[{"\s]*+')

_BACKSLASH = 0x5C
_QUOTE = 0x22
_OPENERS = frozenset(b"[{")
_CLOSERS = frozenset(b"]}")
# One regular-expression call looks at most this far: bounded time, bounded memory.
SCAN_WINDOW_BYTES = 64 * 1024
# "model" written with every letter escaped (\u006d...) is 32 bytes; a longer key is not it.
_LONGEST_MODEL_KEY = 40


class BadRequest(Exception):
    """The body cannot be routed; the message names what is wrong (param: the field)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@attrs.frozen
class ModelField:
    """The requested model and where its JSON string sits in the body (start, end)."""

    name: str
    start: int
    end: int


def _model_from(payload: Any) -> str:
    if not isinstance(payload, dict):
        raise BadRequest("The request body must be a JSON object.")
    return _checked_model(payload.get("model"), present="model" in payload)


def _checked_model(value: Any, *, present: bool) -> str:
    if not present:
        raise BadRequest("Missing required field 'model'.", param="model")
    if not isinstance(value, str) or not value:
        raise BadRequest("The field 'model' must be a non-empty string.", param="model")
    return value


# json's C scanner, called directly: `json.loads(bytes)` spends 3 of its 4 µs on a
# small body in Python (detecting the encoding, decoding, checking what follows).
_SCAN_JSON: Any = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def parse_small_body(body: bytes | bytearray) -> tuple[str, dict[str, Any]]:
    """The model and the decoded object of a small body."""
    try:
        text = body.decode("utf-8")
        payload, end = _SCAN_JSON(text, 0)
    except (ValueError, StopIteration, RecursionError):
        pass  # json.loads below says what is wrong (or reads UTF-16/32, or a BOM)
    else:
        if end == len(text) or not text[end:].strip(" \t\n\r"):
            return _model_from(payload), payload
    return _parse_exactly(body)


def _parse_exactly(body: bytes | bytearray) -> tuple[str, dict[str, Any]]:
    try:
        payload = json.loads(body)
    except RecursionError as error:
        raise BadRequest("The request body is nested too deeply to be read.") from error
    except ValueError as error:
        raise BadRequest(f"The request body is not valid JSON: {error}") from error
    return _model_from(payload), payload


def with_model(body: bytes | bytearray, field: ModelField, name: str) -> bytes:
    """`body` with the `model` string at `field` replaced by `name`."""
    return b"".join((body[: field.start], json.dumps(name).encode(), body[field.end :]))


def _decode_string(raw: bytes | bytearray, *, where: str) -> str:
    try:
        value = json.loads(raw)
    except ValueError as error:
        raise BadRequest(f"The request body is not valid JSON: {error} in {where}") from error
    assert isinstance(value, str)
    return value


class _At(enum.Enum):
    """Where the walk is (at depth 1 unless noted)."""

    START = "start"  # before the opening brace
    KEY = "key"  # expecting a key or the closing brace
    IN_KEY = "in_key"
    COLON = "colon"
    VALUE = "value"
    IN_STRING_VALUE = "in_string_value"
    NESTED = "nested"  # inside an object or array value (depth >= 2)
    NESTED_STRING = "nested_string"  # a string inside one, not yet fully arrived
    AFTER_VALUE = "after_value"  # expecting a comma or the closing brace
    DONE = "done"


class ModelFieldScanner:
    """Walks a JSON object as its bytes arrive; `field` is set once `model` is read.

    Call `feed(buffer, end)` after each chunk, where `buffer[:end]` is everything
    received so far (the buffer may be larger, e.g. preallocated), and
    `finish(buffer, end)` once the body is complete. Both raise `BadRequest`.
    """

    def __init__(self) -> None:
        self.field: ModelField | None = None
        self._state = _At.START
        self._pos = 0
        self._depth = 0
        self._string_start = 0  # the opening quote of the string being read
        self._key_is_model = False
        self._after_comma = False  # a '}' right after ',' is not JSON

    @property
    def done(self) -> bool:
        return self._state == _At.DONE

    def feed(self, buffer: bytes | bytearray, end: int) -> None:
        """Walk as far as `buffer[:end]` allows, in windows of `SCAN_WINDOW_BYTES`."""
        window = SCAN_WINDOW_BYTES
        while self._pos < end:
            stop = min(end, self._pos + window)
            before = (self._pos, self._state)
            self._step(buffer, stop)
            if (self._pos, self._state) != before:
                window = SCAN_WINDOW_BYTES
            elif stop == end:
                return  # a token that has not fully arrived: wait for more
            else:
                window *= 2  # a token longer than the window (a huge number, say)

    def finish(self, buffer: bytes | bytearray, end: int) -> ModelField:
        self.feed(buffer, end)
        if self._state != _At.DONE:
            raise BadRequest("The request body is not valid JSON: it ends too early.")
        if self.field is None:
            raise BadRequest("Missing required field 'model'.", param="model")
        return self.field

    def _invalid(self, what: str, at: int) -> BadRequest:
        return BadRequest(f"The request body is not valid JSON: {what} at byte {at}.")

    def _skip_whitespace(self, buffer: bytes | bytearray, end: int) -> bool:
        """Move past whitespace; False if the data ran out."""
        match = _WHITESPACE.match(buffer, self._pos, end)
        assert match is not None
        self._pos = match.end()
        return self._pos < end

    def _string_end(self, buffer: bytes | bytearray, end: int) -> int | None:
        """The closing quote of the string being read, or None until it has arrived."""
        match = _STRING_REST.match(buffer, self._pos, end)
        assert match is not None
        stop = match.end()
        if stop < end and buffer[stop] == _QUOTE:
            return stop
        # Resume here with the next chunk: never rescan what is already known good.
        self._pos = stop
        return None

    def _step(self, buffer: bytes | bytearray, end: int) -> bool:
        """Advance by one token, or not at all when it has not fully arrived."""
        state = self._state
        if state == _At.NESTED:
            return self._step_nested(buffer, end)
        if state in (_At.IN_KEY, _At.IN_STRING_VALUE, _At.NESTED_STRING):
            return self._step_string(buffer, end)
        if not self._skip_whitespace(buffer, end):
            return False
        byte = buffer[self._pos]
        if state == _At.START:
            if byte != ord("{"):
                raise BadRequest("The request body must be a JSON object.")
            self._pos += 1
            self._depth = 1
            self._state = _At.KEY
        elif state == _At.KEY:
            if byte == ord("}") and not self._after_comma:
                self._close_object()  # {}
            elif byte == _QUOTE:
                self._string_start = self._pos
                self._pos += 1
                self._after_comma = False
                self._state = _At.IN_KEY
            else:
                raise self._invalid("expected a key", self._pos)
        elif state == _At.COLON:
            if byte != ord(":"):
                raise self._invalid("expected ':'", self._pos)
            self._pos += 1
            self._state = _At.VALUE
        elif state == _At.VALUE:
            self._start_value(buffer, end, byte)
        elif state == _At.AFTER_VALUE:
            if byte == ord(","):
                self._pos += 1
                self._after_comma = True
                self._state = _At.KEY
            elif byte == ord("}"):
                self._close_object()
            else:
                raise self._invalid("expected ',' or '}'", self._pos)
        else:  # _DONE: only whitespace may follow
            raise self._invalid("unexpected data after the object", self._pos)
        return True

    def _close_object(self) -> None:
        self._pos += 1
        self._depth = 0
        self._state = _At.DONE

    def _start_value(self, buffer: bytes | bytearray, end: int, byte: int) -> None:
        if self._key_is_model and byte != _QUOTE:
            raise BadRequest("The field 'model' must be a non-empty string.", param="model")
        if byte == _QUOTE:
            self._string_start = self._pos
            self._pos += 1
            self._state = _At.IN_STRING_VALUE
        elif byte in _OPENERS:
            self._pos += 1
            self._depth = 2
            self._state = _At.NESTED
        else:
            match = _SCALAR.match(buffer, self._pos, end)
            assert match is not None
            if match.end() == self._pos:
                raise self._invalid("expected a value", self._pos)
            if match.end() == end:
                return  # the scalar may go on in the next chunk: look again then
            self._pos = match.end()
            self._state = _At.AFTER_VALUE

    def _step_string(self, buffer: bytes | bytearray, end: int) -> bool:
        closing = self._string_end(buffer, end)
        if closing is None:
            return False
        start, self._pos = self._string_start, closing + 1
        if self._state == _At.NESTED_STRING:
            self._state = _At.NESTED
        elif self._state == _At.IN_KEY:
            raw = buffer[start : self._pos]
            self._key_is_model = len(raw) <= _LONGEST_MODEL_KEY and (
                _decode_string(raw, where="a key") == "model"
            )
            self._state = _At.COLON
        else:
            if self._key_is_model:
                if self.field is not None:
                    raise BadRequest("The field 'model' appears twice.", param="model")
                name = _decode_string(buffer[start : self._pos], where="'model'")
                name = _checked_model(name, present=True)
                self.field = ModelField(name, start, self._pos)
                self._key_is_model = False
            self._state = _At.AFTER_VALUE
        return True

    def _step_nested(self, buffer: bytes | bytearray, end: int) -> bool:
        match = _NESTED_SKIP.match(buffer, self._pos, end)
        assert match is not None
        self._pos = match.end()
        if self._pos >= end:
            return False
        byte = buffer[self._pos]
        if byte == _QUOTE:  # a string that has not fully arrived
            self._string_start = self._pos
            self._pos += 1
            self._state = _At.NESTED_STRING
        elif byte in _OPENERS:
            self._pos += 1
            self._depth += 1
        else:
            assert byte in _CLOSERS
            self._pos += 1
            self._depth -= 1
            if self._depth == 1:
                self._state = _At.AFTER_VALUE
        return True
