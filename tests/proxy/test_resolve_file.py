"""--resolve-file: names from a hosts file reach backends on other loopback addresses."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import aiohttp
import pytest

from flexinfer_proxy.resolve_file import HostsFileResolver, parse_hosts

from .harness import BackendProcess, StaticProxy, async_test


def test_hosts_lines_comments_and_bad_lines() -> None:
    text = "# dev cluster\n127.0.0.2 a.ns.svc  A2.ns.svc # two names\n\n::1 six.ns.svc\n"
    assert parse_hosts(text) == {
        "a.ns.svc": ["127.0.0.2"],
        "a2.ns.svc": ["127.0.0.2"],
        "six.ns.svc": ["::1"],
    }
    with pytest.raises(ValueError, match="line 1: 'not-an-ip' is not an IP address"):
        parse_hosts("not-an-ip name\n")
    with pytest.raises(ValueError, match=r"line 2: 127\.0\.0\.3 has no name"):
        parse_hosts("127.0.0.2 a\n127.0.0.3\n")


@async_test
async def test_the_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 model.ns.svc\n")
    resolver = HostsFileResolver(hosts)
    try:
        first = await resolver.resolve("model.ns.svc", 8000, socket.AF_INET)
        assert [r["host"] for r in first] == ["127.0.0.2"]
        replacement = tmp_path / "hosts.new"
        replacement.write_text("127.0.0.3 model.ns.svc\n")
        os.replace(replacement, hosts)  # as a writer should: a new file renamed over
        second = await resolver.resolve("model.ns.svc", 8000, socket.AF_INET)
        assert [r["host"] for r in second] == ["127.0.0.3"]
        # A broken rewrite keeps the last good names.
        hosts.write_text("garbage line\n")
        kept = await resolver.resolve("model.ns.svc", 8000, socket.AF_INET)
        assert [r["host"] for r in kept] == ["127.0.0.3"]
    finally:
        await resolver.close()


@async_test
async def test_a_name_only_the_file_knows_reaches_a_backend_on_127_0_0_2(tmp_path: Path) -> None:
    backend = BackendProcess("elsewhere", host="127.0.0.2")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 only-in-the-file.dev.svc\n")
    endpoint = f"http://only-in-the-file.dev.svc:{backend.port}/v1"
    proxy = StaticProxy(
        [{"name": "m", "endpoint": endpoint}],
        "--resolve-file",
        str(hosts),
        log_path=tmp_path / "log",
    )
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{proxy.url}/v1/chat/completions", json={"model": "m"}) as response,
        ):
            assert response.status == 200
            assert (await response.json())["backend"] == "elsewhere"
    finally:
        proxy.stop()
        backend.stop()
