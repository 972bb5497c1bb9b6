"""The API key Secret's format: bare tokens, scoped ones, and entries that are refused."""

from __future__ import annotations

import base64
import logging
import re

import pytest

from flexinfer_proxy.api_keys import ApiKeys, KeyFormatError, keys_from_secret, parse_key


def test_a_bare_token_reaches_every_namespace_as_before_scopes() -> None:
    key = parse_key("admin", "sk-admin-1\n")
    assert (key.token, key.name, key.namespaces) == (b"sk-admin-1", "admin", None)
    assert parse_key("ci", "sk-ci namespaces=*").namespaces is None


def test_a_scoped_token_reaches_the_namespaces_it_lists() -> None:
    key = parse_key("alice", "sk-alice  namespaces=team-a,team-b")
    assert key.namespaces == frozenset({"team-a", "team-b"})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "'k' is empty"),
        ("sk-1 namespace=team-a", "'namespace=team-a' is not understood"),
        ("sk-1 team-a", "'team-a' is not understood"),
        ("sk-1 namespaces=", "namespaces= lists no namespace"),
        ("sk-1 namespaces=Team_A", "names 'Team_A', not a namespace name"),
        ("sk-1 namespaces=*,team-a", "mixes '*' with namespaces"),
        ("sk-1 namespaces=a namespaces=b", "'namespaces=b' is not understood"),
        ("sk,1", "characters a bearer token may not have"),
    ],
)
def test_an_entry_the_proxy_cannot_read_is_refused_naming_it(value: str, message: str) -> None:
    with pytest.raises(KeyFormatError, match=re.escape(message)):
        parse_key("k", value)


def test_a_refused_entry_is_left_out_and_logged_never_widened(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def encoded(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    secret = {
        "data": {
            "good": encoded("sk-good namespaces=team-a"),
            "typo": encoded("sk-typo namespace=team-a"),
            "garbled": "%%%",
        }
    }
    with caplog.at_level(logging.ERROR, logger="flexinfer.proxy.api_keys"):
        keys = keys_from_secret(secret)
    assert [key.name for key in keys] == ["good"]
    assert "'typo'" in caplog.text and "'garbled'" in caplog.text


def test_a_token_in_two_entries_reaches_what_either_grants() -> None:
    keys = ApiKeys.from_entries(
        {"a": "sk-shared namespaces=team-a", "b": "sk-shared namespaces=team-b", "c": "sk-c"}
    )
    shared = keys.key_for("Bearer sk-shared")
    assert shared is not None and shared.namespaces == frozenset({"team-a", "team-b"})
    assert keys.key_for("Bearer sk-c") is not None
    assert keys.key_for("Bearer sk-other") is None
    assert keys.key_for("sk-c") is None, "only bearer tokens"
    widened = ApiKeys.from_entries({"a": "sk-x namespaces=team-a", "b": "sk-x"})
    key = widened.key_for("Bearer sk-x")
    assert key is not None and key.namespaces is None
