"""The body's `model`: the scanner agrees with json.loads, chunk by chunk, and says why not."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer_proxy.model_field import (
    SCAN_WINDOW_BYTES,
    BadRequest,
    ModelFieldScanner,
    parse_small_body,
    with_model,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def scan(body: bytes, *, chunk: int | None = None) -> str:
    """Feed `body` in pieces of `chunk` bytes (all at once without) and return the model."""
    scanner = ModelFieldScanner()
    step = chunk or len(body) or 1
    for end in range(step, len(body), step):
        scanner.feed(body, end)
    field = scanner.finish(body, len(body))
    assert json.loads(body[field.start : field.end]) == field.name
    return field.name


@settings(deadline=None)  # a shared 2-core machine: timing is not what this checks
@given(
    model=st.text(min_size=1),
    others=st.dictionaries(st.text().filter(lambda k: k != "model"), json_values, max_size=5),
    position=st.integers(min_value=0, max_value=5),
    ascii_only=st.booleans(),
    spaced=st.booleans(),
    chunk=st.integers(min_value=1, max_value=64),
)
def test_the_scanner_finds_what_json_loads_finds(
    model: str,
    others: dict[str, Any],
    position: int,
    ascii_only: bool,
    spaced: bool,
    chunk: int,
) -> None:
    items = list(others.items())
    items.insert(min(position, len(items)), ("model", model))
    separators = (" , ", " : ") if spaced else (",", ":")
    body = json.dumps(dict(items), ensure_ascii=ascii_only, separators=separators).encode()
    assert parse_small_body(body)[0] == model
    assert scan(body) == model
    assert scan(body, chunk=chunk) == model


@settings(deadline=None)
@given(value=json_values.filter(lambda v: not isinstance(v, dict)))
def test_a_body_that_is_not_an_object_is_refused_by_both(value: Any) -> None:
    body = json.dumps(value).encode()
    for read in (parse_small_body, scan):
        with pytest.raises(BadRequest, match="must be a JSON object"):
            read(body)


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (b'{"messages": []}', "Missing required field 'model'", "model"),
        (b"{}", "Missing required field 'model'", "model"),
        (b'{"model": 7}', "'model' must be a non-empty string", "model"),
        (b'{"model": ""}', "'model' must be a non-empty string", "model"),
        (b'{"model": null}', "'model' must be a non-empty string", "model"),
        (b'{"model": "a", "model": "b"}', "'model' appears twice", "model"),
        (b'{"model": "a",}', "not valid JSON", None),
        (b'{"model" "a"}', "expected ':'", None),
        (b'{"model": "a"', "ends too early", None),
        (b'{"model": "a"} x', "unexpected data", None),
        (b'{"model": "a\\x"}', "not valid JSON", None),
        (b"{model: 1}", "expected a key", None),
    ],
)
def test_bodies_the_scanner_refuses(body: bytes, message: str, param: str | None) -> None:
    with pytest.raises(BadRequest, match=message) as raised:
        scan(body)
    assert raised.value.param == param


def test_deep_nesting_is_a_bad_request_not_a_recursion_error() -> None:
    deep = b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(BadRequest, match="nested too deeply"):
        parse_small_body(deep)
    assert scan(deep) == "m"  # the scanner keeps a counter, not a stack


def test_the_model_is_known_before_the_rest_of_the_body_arrives() -> None:
    head = b'{"model": "early", "input": ["'
    body = head + b"x" * (3 * SCAN_WINDOW_BYTES) + b'"]}'
    scanner = ModelFieldScanner()
    scanner.feed(body, len(head))
    assert scanner.field is not None and scanner.field.name == "early"
    scanner.feed(body, len(head) + 10)
    assert not scanner.done
    assert scanner.finish(body, len(body)).name == "early"


@pytest.mark.parametrize(
    "filler",
    [
        b'"' + b'\\"' * SCAN_WINDOW_BYTES + b'"',  # escapes across every window edge
        b"[" + b",".join([b'"ab"'] * 40_000) + b"]",
        b"1" + b"0" * (3 * SCAN_WINDOW_BYTES),  # a number longer than a window
        b'{"model": "nested, not the one"}',
    ],
)
def test_large_values_on_either_side_are_skipped(filler: bytes) -> None:
    for body in (
        b'{"input": ' + filler + b', "model": "late"}',
        b'{"model": "late", "input": ' + filler + b"}",
    ):
        assert scan(body) == "late"
        assert scan(body, chunk=4093) == "late"


def test_an_escaped_key_is_still_the_model() -> None:
    body = b'{"mod\\u0065l": "m", "x": 1}'
    assert parse_small_body(body)[0] == scan(body) == "m"


def test_with_model_splices_the_new_name_in() -> None:
    body = b'{"input": "x", "model": "asked", "n": 1}'
    scanner = ModelFieldScanner()
    field = scanner.finish(body, len(body))
    rewritten = with_model(body, field, 'served "name"')
    assert json.loads(rewritten) == {"input": "x", "model": 'served "name"', "n": 1}


def _reading(body: bytes) -> tuple[Any, ...]:
    """What `parse_small_body` makes of `body`: its result, or its refusal."""
    try:
        return ("read", parse_small_body(body))
    except BadRequest as error:
        return ("refused", str(error), error.param)


def _reading_with_json_loads(body: bytes) -> tuple[Any, ...]:
    """The same, as json.loads reads it (the reader before the C scanner's shortcut)."""
    try:
        payload = json.loads(body)
    except RecursionError:
        return ("refused", "The request body is nested too deeply to be read.", None)
    except ValueError as error:
        return ("refused", f"The request body is not valid JSON: {error}", None)
    if not isinstance(payload, dict):
        return ("refused", "The request body must be a JSON object.", None)
    if "model" not in payload:
        return ("refused", "Missing required field 'model'.", "model")
    if not isinstance(payload["model"], str) or not payload["model"]:
        return ("refused", "The field 'model' must be a non-empty string.", "model")
    return ("read", (payload["model"], payload))


@settings(deadline=None)
@given(
    value=json_values | st.dictionaries(st.just("model"), json_values, min_size=1),
    before=st.sampled_from(["", " ", "\n\t", "\ufeff"]),
    after=st.sampled_from(["", " \r\n", "x", "}", " 1", "\x00"]),
    encoding=st.sampled_from(["utf-8", "utf-16", "utf-32"]),
    noise=st.binary(max_size=4),
)
def test_the_small_body_reader_says_what_json_loads_says(
    value: Any, before: str, after: str, encoding: str, noise: bytes
) -> None:
    """The C scanner's shortcut reads, refuses and words refusals as json.loads does:
    surrounding whitespace, trailing data, a byte-order mark, UTF-16/32, stray bytes."""
    text = before + json.dumps(value, ensure_ascii=False) + after
    for body in (
        text.encode(encoding, "surrogatepass"),
        text.encode("utf-8", "surrogatepass") + noise,
    ):
        assert _reading(body) == _reading_with_json_loads(body)
