"""`--resolve-file`: backend host names from a hosts-format file, before system DNS.

For the dev cluster only (issue 14): there, a rendered Service's name
(`<model>.<namespace>.svc`) has no DNS, and the process-backed node serves each pod
on its own loopback address. The file has `/etc/hosts` lines, `<ip> <name>
[<name>...]`, `#` comments and blank lines; it is re-read whenever its mtime
changes, so whoever writes it can add names while the proxy runs (write a new file
and rename it over the old one). A name the file does not list goes to the
resolver behind it (aiohttp's default). In production the flag is not given and
cluster DNS answers.

This module resolves names; it knows nothing of models.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from pathlib import Path

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

log = logging.getLogger("flexinfer.proxy.resolve_file")


def parse_hosts(text: str, *, source: str = "hosts file") -> dict[str, list[str]]:
    """Name -> addresses (in file order) from hosts-format text; bad lines name themselves."""
    names: dict[str, list[str]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        address, *aliases = fields
        try:
            ipaddress.ip_address(address)
        except ValueError as error:
            raise ValueError(f"{source} line {number}: {address!r} is not an IP address") from error
        if not aliases:
            raise ValueError(f"{source} line {number}: {address} has no name")
        for alias in aliases:
            names.setdefault(alias.lower().rstrip("."), []).append(address)
    return names


class HostsFileResolver(AbstractResolver):
    def __init__(self, path: str | Path, *, fallback: AbstractResolver | None = None) -> None:
        self._path = Path(path)
        self._fallback = fallback or DefaultResolver()
        self._names: dict[str, list[str]] = {}
        self._stamp: tuple[int, int] | None = None
        self._reload()

    def _reload(self) -> None:
        """Re-read the file if it changed; keep the last good view if it cannot be read."""
        try:
            info = os.stat(self._path)
        except OSError as error:
            if self._stamp is not None:
                log.warning("cannot read %s (%s); keeping the names read before", self._path, error)
                self._stamp = None
            return
        stamp = (info.st_mtime_ns, info.st_ino)
        if stamp == self._stamp:
            return
        try:
            self._names = parse_hosts(self._path.read_text(), source=str(self._path))
        except (OSError, ValueError) as error:
            log.warning("%s; keeping the names read before", error)
            return
        self._stamp = stamp
        log.info("read %d names from %s", len(self._names), self._path)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self._reload()
        addresses = self._names.get(host.lower().rstrip("."))
        if not addresses:
            return await self._fallback.resolve(host, port, family)
        results: list[ResolveResult] = []
        for address in addresses:
            is_v6 = ipaddress.ip_address(address).version == 6
            if (family == socket.AF_INET and is_v6) or (family == socket.AF_INET6 and not is_v6):
                continue
            results.append(
                ResolveResult(
                    hostname=host,
                    host=address,
                    port=port,
                    family=socket.AF_INET6 if is_v6 else socket.AF_INET,
                    proto=0,
                    flags=socket.AI_NUMERICHOST,
                )
            )
        if not results:
            raise OSError(f"{host} has no {family.name} address in {self._path}")
        return results

    async def close(self) -> None:
        await self._fallback.close()
