"""Child processes of the local cluster: dying with their starter, ending with a grace period.

Shared by `localcluster` (the control-plane binaries) and `processnode` (the model
servers it runs for pods). Linux process groups and signals only; no cluster I/O.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def die_with_thread_hook() -> Callable[[], None] | None:
    """A `preexec_fn` asking the kernel to SIGKILL the child when its starting thread dies.

    That covers a test run killed with SIGKILL, where atexit cannot run. The kernel ties
    it to the *thread* that forks, so use it only from a thread that outlives the child
    (the main thread, or a runner thread that stops its children before it ends).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None

    def hook() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return hook


def signal_group(pid: int, signum: int) -> None:
    """Send `signum` to the process group led by `pid` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def terminate_group(popen: subprocess.Popen[bytes], *, grace: float = 10.0) -> None:
    """SIGTERM the group, wait up to `grace` seconds for its leader, then SIGKILL."""
    signal_group(popen.pid, signal.SIGTERM)
    try:
        popen.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        signal_group(popen.pid, signal.SIGKILL)
        popen.wait()
    # The leader is reaped; anything else left in its group goes too.
    signal_group(popen.pid, signal.SIGKILL)
