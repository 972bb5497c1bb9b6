"""Optional API keys: bearer tokens the proxy accepts, and the namespaces each reaches.

`--api-key-secret NAMESPACE/NAME`: every entry of the Secret's `data` is one key; its
name is free (`alice`, `team-a-ci`, ...) and names the key in logs and in the
per-client limits; its value is the token, optionally followed by the namespaces the
key reaches:

    sk-alice-5f2c                               every namespace the proxy routes
    sk-alice-5f2c namespaces=team-a,team-b      team-a and team-b only
    sk-ci-77aa namespaces=*                     every namespace (said explicitly)

A bare token (the format from before scopes) keeps its meaning: the key reaches
every namespace the proxy routes, an administrator's key. A value the proxy cannot
read (an unknown field, an empty list, a namespace that is not a DNS label, a token
with characters RFC 6750 does not allow) is refused: logged with the entry's name and
left out, so a typo never widens what a key reaches. A token listed in several
entries reaches what any of them grants.

A key is rotated by adding the new one and then removing the old. The Secret is read
at start and every `refresh` seconds; until the first read the proxy answers 503 (it
does not know yet whom to let in), a Secret that is missing or empty lets nobody in
(401), and a failed re-read keeps the keys it had. Comparisons take constant time
and compare against every key. Needs `get` on that one Secret (deploy/proxy-rbac.yaml).

This module decides "which key is this, and what may it reach"; it does not answer
HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import logging
import re
from collections.abc import Iterable, Mapping

import attrs

from flexinfer_kube.kubeapi import KubeApi, KubeError, NotFound
from flexinfer_kube.resources import SECRETS

log = logging.getLogger("flexinfer.proxy.api_keys")

REFRESH_SECONDS = 30.0
EVERY_NAMESPACE = "*"

# RFC 6750 2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class KeyFormatError(ValueError):
    """A Secret entry that is not `<token>[ namespaces=<ns>,...]`."""


@attrs.frozen
class ApiKey:
    """One accepted key: its token, its entry's name, and the namespaces it reaches."""

    token: bytes = attrs.field(repr=False)
    name: str
    namespaces: frozenset[str] | None = None  # None: every namespace the proxy routes

    def merged(self, other: ApiKey) -> ApiKey:
        """The same token listed twice reaches what either entry grants."""
        if self.namespaces is None or other.namespaces is None:
            return attrs.evolve(self, namespaces=None)
        return attrs.evolve(self, namespaces=self.namespaces | other.namespaces)


def parse_key(name: str, value: str) -> ApiKey:
    """One Secret entry (its name and decoded value) as a key; raises `KeyFormatError`."""
    words = value.split()
    if not words:
        raise KeyFormatError(f"API key {name!r} is empty")
    token, *fields = words
    if not _TOKEN.fullmatch(token):
        raise KeyFormatError(
            f"API key {name!r}: the token has characters a bearer token may not have "
            "(allowed: letters, digits, - . _ ~ + / and trailing =)"
        )
    namespaces: frozenset[str] | None = None
    seen = False
    for field in fields:
        key, sep, text = field.partition("=")
        if key != "namespaces" or not sep or seen:
            raise KeyFormatError(
                f"API key {name!r}: {field!r} is not understood; expected "
                "'<token>' or '<token> namespaces=<namespace>[,<namespace>...]'"
            )
        seen = True
        listed = [item for item in text.split(",") if item]
        if not listed:
            raise KeyFormatError(f"API key {name!r}: namespaces= lists no namespace")
        if EVERY_NAMESPACE in listed:
            if len(listed) > 1:
                raise KeyFormatError(
                    f"API key {name!r}: namespaces={text!r} mixes '*' with namespaces"
                )
            continue
        for namespace in listed:
            if not _NAMESPACE.fullmatch(namespace):
                raise KeyFormatError(
                    f"API key {name!r}: namespaces= names {namespace!r}, not a namespace name"
                )
        namespaces = frozenset(listed)
    return ApiKey(token.encode(), name, namespaces)


def bearer_token(header: str | None) -> bytes | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip().encode()


class ApiKeys:
    """The accepted keys; not `loaded` until they were read once."""

    def __init__(self, keys: Iterable[ApiKey] | None = None) -> None:
        self._keys: tuple[ApiKey, ...] | None = None if keys is None else tuple(keys)

    @classmethod
    def from_entries(cls, entries: Mapping[str, str]) -> ApiKeys:
        """Keys from entries in the Secret's format (name → value); raises on a bad one."""
        return cls(parse_key(name, value) for name, value in entries.items())

    @property
    def loaded(self) -> bool:
        return self._keys is not None

    def replace(self, keys: Iterable[ApiKey]) -> None:
        self._keys = tuple(keys)

    def key_for(self, authorization: str | None) -> ApiKey | None:
        """The key an `Authorization` header carries, or None when it is not one of ours."""
        token = bearer_token(authorization)
        if token is None or not self._keys:
            return None
        # Compare against every key, always: the time taken says nothing about which.
        found: ApiKey | None = None
        for key in self._keys:
            if hmac.compare_digest(token, key.token):
                found = key if found is None else found.merged(key)
        return found


def keys_from_secret(secret: Mapping[str, object]) -> list[ApiKey]:
    """Every readable entry of the Secret's `data`; the others are logged and left out."""
    data = secret.get("data") or {}
    keys = []
    if isinstance(data, Mapping):
        for name, value in sorted(data.items()):
            try:
                text = base64.b64decode(str(value), validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                log.error("API key %r in the Secret is not base64 UTF-8 text; ignored", name)
                continue
            try:
                keys.append(parse_key(str(name), text))
            except KeyFormatError as error:
                log.error("%s; this key is ignored", error)
    return keys


class SecretKeySource:
    """Keeps `keys` in step with a Secret, re-reading it every `refresh` seconds."""

    def __init__(
        self, api: KubeApi, namespace: str, name: str, *, refresh: float = REFRESH_SECONDS
    ) -> None:
        self.keys = ApiKeys()
        self._api = api
        self._namespace = namespace
        self._name = name
        self._refresh = refresh
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def read_once(self) -> None:
        where = f"{self._namespace}/{self._name}"
        try:
            secret = await asyncio.to_thread(self._api.get, SECRETS, self._namespace, self._name)
        except NotFound:
            log.error("API key Secret %s does not exist: every request is refused", where)
            self.keys.replace(())
            return
        except KubeError as error:
            log.warning("reading the API key Secret %s failed: %s", where, error)
            return
        keys = keys_from_secret(secret)
        if not keys:
            log.error("API key Secret %s holds no key: every request is refused", where)
        self.keys.replace(keys)

    async def _run(self) -> None:
        while True:
            await self.read_once()
            await asyncio.sleep(self._refresh)
