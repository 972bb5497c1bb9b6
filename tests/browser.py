"""A real browser for the tests that need one: Debian's Chromium, driven by Playwright.

Chromium comes from apt, the way the image build gets buildah and debootstrap
(`flexinfer_devcluster.image.ensure_tools`): installed once with apt-get when
/usr/bin/chromium is missing, as root; without root the test is skipped saying so.
Playwright's own browser download (`playwright install`) is never used: Playwright
drives the system's Chromium through `executable_path`. Installs are serialized by a
file lock, as several test sessions may share the machine.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
PACKAGE = "chromium"
LOCK = Path.home() / ".cache" / "flexinfer" / "chromium-install.lock"


def ensure_chromium() -> Path:
    """The Chromium binary, installed with apt-get if missing; skips when it cannot be."""
    if CHROMIUM.exists():
        return CHROMIUM
    if os.geteuid() != 0:
        pytest.skip(f"{CHROMIUM} is missing and installing {PACKAGE} with apt-get needs root")
    if shutil.which("apt-get") is None:
        pytest.skip(f"{CHROMIUM} is missing and there is no apt-get to install {PACKAGE} with")
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not CHROMIUM.exists():  # another session may have installed it meanwhile
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            for step in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", PACKAGE]):
                done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=900)
                assert done.returncode == 0, f"{' '.join(step)} failed:\n{done.stderr[-2000:]}"
    assert CHROMIUM.exists(), f"apt-get installed {PACKAGE} but {CHROMIUM} is not there"
    return CHROMIUM
