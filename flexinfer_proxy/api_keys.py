"""Optional API keys: bearer tokens the proxy accepts, read from a Secret.

`--api-key-secret NAMESPACE/NAME`: every value in the Secret's `data` is one
accepted key (the names are free: `team-a`, `ci`, ...), so a key is rotated by
adding the new one and then removing the old. The Secret is read at start and
every `refresh` seconds; until the first read the proxy answers 503 (it does not
know yet whom to let in), a Secret that is missing or empty lets nobody in (401),
and a failed re-read keeps the keys it had. Comparisons take constant time.
Needs `get` on that one Secret (deploy/proxy-rbac.yaml).

This module decides "is this request's key one of ours"; it does not answer HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import logging
from collections.abc import Iterable

from flexinfer_kube.kubeapi import KubeApi, KubeError, NotFound
from flexinfer_kube.resources import SECRETS

log = logging.getLogger("flexinfer.proxy.api_keys")

REFRESH_SECONDS = 30.0


def bearer_token(header: str | None) -> bytes | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip().encode()


class ApiKeys:
    """The accepted keys; `None` until they were read once."""

    def __init__(self, keys: Iterable[str] | None = None) -> None:
        self._keys: tuple[bytes, ...] | None = (
            None if keys is None else tuple(k.encode() for k in keys)
        )

    @property
    def loaded(self) -> bool:
        return self._keys is not None

    def replace(self, keys: Iterable[bytes]) -> None:
        self._keys = tuple(keys)

    def accepts(self, authorization: str | None) -> bool:
        token = bearer_token(authorization)
        if token is None or not self._keys:
            return False
        # Compare against every key, always: the time taken says nothing about which.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(token, key)
        return matched


def keys_from_secret(secret: dict[str, object]) -> list[bytes]:
    data = secret.get("data") or {}
    keys = []
    if isinstance(data, dict):
        for name, value in sorted(data.items()):
            try:
                key = base64.b64decode(str(value), validate=True).strip()
            except (binascii.Error, ValueError):
                log.warning("API key %r in the Secret is not base64; ignored", name)
                continue
            if key:
                keys.append(key)
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
