"""Which optional dependencies (`pip install 'flexinfer[EXTRA]'`) each entry point needs.

The base install is the pure core and attrs. The controller, the proxy and the command
each come with an extra (pyproject.toml); an entry point calls `require_extra` before
it imports anything of its extra, so a missing one ends the process with a message
naming the extra to install, not a traceback. This module imports nothing outside the
standard library (it runs where the extras are absent) and decides nothing else.
"""

from __future__ import annotations

import importlib.util
import sys

USAGE = 2

# The modules each extra brings, by the name they are imported under; kept equal to
# pyproject.toml's `[project.optional-dependencies]` by tests/test_wheel.py. (uvloop is
# left out: the proxy runs on asyncio's loop without it.)
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "controller": ("kubernetes", "prometheus_client", "yaml"),
    "proxy": ("kubernetes", "prometheus_client", "aiohttp", "httptools"),
    "cli": ("kubernetes", "prometheus_client", "yaml", "jsonschema"),
}


def missing_modules(extra: str) -> list[str]:
    """The modules of `extra` that cannot be imported here."""
    return [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]


def require_extra(extra: str, *, what: str) -> None:
    """End the process (exit 2) saying which extra to install when `extra` is missing."""
    missing = missing_modules(extra)
    if missing:
        print(
            f"{what} needs the `{extra}` extra, which is not installed "
            f"({', '.join(missing)} missing): pip install 'flexinfer[{extra}]'",
            file=sys.stderr,
        )
        raise SystemExit(USAGE)
