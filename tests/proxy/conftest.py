"""Backends for the proxy tests: two fake OpenAI servers per session, as processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import BackendProcess


@pytest.fixture(scope="session")
def backends() -> Iterator[dict[str, BackendProcess]]:
    started = {name: BackendProcess(name) for name in ("alpha", "beta")}
    try:
        yield started
    finally:
        for backend in started.values():
            backend.stop()
