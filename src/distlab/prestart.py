"""The launcher process, started before the rest of the kit is imported.

The launcher's torch import (about a second) is the floor under a cold start, so ``%load_ext``
starts it first, with nothing but the standard library, and the hub adopts it a moment later.
The launcher imports torch before it reads where to connect (the hub's socket and key) from
its stdin, so nothing it needs has to exist yet. Standard library only, on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

LOG = "launcher.log"  # in the folder take() returns: what the launcher printed, for error messages
_started: tuple[str, subprocess.Popen[bytes], dict[str, str]] | None = None


def start_early() -> None:
    """Start the launcher now, for the next ``take()``."""
    global _started
    if _started is None:
        _started = _start()


def take() -> tuple[str, subprocess.Popen[bytes], dict[str, str]]:
    """A private folder, a launcher writing its log there (the early one if it still runs), and the
    kernel's environment when it started, which its ranks follow from (distlab.follow)."""
    global _started
    started, _started = _started, None
    if started is not None and started[1].poll() is None:
        return started
    if started is not None:
        shutil.rmtree(started[0], ignore_errors=True)
    return _start()


def can_fork() -> bool:
    """Windows has no fork: the kit says so at once, instead of a launcher that dies unexplained."""
    return hasattr(os, "fork")


def cannot_fork() -> str:
    """What to do where ``can_fork()`` is False."""
    from distlab.i18n import tr

    return tr("distlab forks its ranks from a process that has imported torch once, and Windows cannot fork "
              "a process. Run JupyterLab in WSL (Windows Subsystem for Linux, e.g. Ubuntu): there `make lab` "
              "works as on Linux.")


def _start() -> tuple[str, subprocess.Popen[bytes], dict[str, str]]:
    if not can_fork():
        from distlab.errors import PoolDied

        raise PoolDied(cannot_fork())
    folder = tempfile.mkdtemp(prefix="distlab-")
    os.chmod(folder, 0o700)
    kernel_env = dict(os.environ)
    env = dict(kernel_env)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["MPLBACKEND"] = "module://distlab.rank_backend"
    env["PYTHONUNBUFFERED"] = "1"
    with open(os.path.join(folder, LOG), "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "distlab.launcher", folder],
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, env=env,
        )
    return folder, launcher, kernel_env
