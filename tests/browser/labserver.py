"""Start and stop `make lab` the way a learner does, for tests.

The browser suite and tests/test_make_lab.py both need a real JupyterLab started by the
Makefile's own `lab` target (so a broken target breaks the tests), on a port the OS picks,
with a secret token, in its own process group that the test stops by pid - never by name.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# What the browser suite leaves behind, git-ignored: screenshots, page consoles, the lab log;
# and scratch notebooks, written under the served root so the browser opens them like
# course notebooks.
SCREENSHOTS = REPO / "artifacts" / "screenshots"
SCRATCH = REPO / "artifacts" / "browser"
# JupyterLab logs "http://127.0.0.1:<port>/lab...?token=..." once it listens; LAB_PORT=0 lets the
# OS choose a free port, so two test runs (or a learner's own lab) never collide.
_URL_RE = re.compile(r"http://127\.0\.0\.1:(\d+)/")


@dataclass
class LabServer:
    """A running `make lab`: its process (leader of its own group), address and log."""

    proc: subprocess.Popen[bytes]
    port: int
    token: str
    log_path: Path
    runtime_dir: Path  # kernels' connection files and sockets, the server's own files
    _log_file: Any = field(repr=False, default=None)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """`path` (e.g. "lab/tree/notebooks/x.ipynb") on this server, token attached."""
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}/{path.lstrip('/')}{sep}token={self.token}"

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """Call the server's REST API with the token; returns the decoded JSON (or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.base_url}/{path.lstrip('/')}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def log_tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def shutdown_kernels(self) -> None:
        """Shut down every kernel (and so every rank pool) the browser started."""
        for session in self.api("GET", "api/sessions"):
            self.api("DELETE", f"api/sessions/{session['id']}")


@contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """Let children see SIGINT with its default action, as under a terminal.

    A shell that starts `make test` in the background ignores SIGINT, and an ignored signal
    stays ignored across exec, so Ctrl-C would never reach JupyterLab. A handled signal is
    reset to its default by exec, so a Python handler is installed around the spawn.
    """
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_lab(
    log_path: Path,
    lab_flags: str = "",
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    make_args: tuple[str, ...] = (),
) -> LabServer:
    """Run `make lab LAB_PORT=0 LAB_FLAGS="--no-browser ..."` and wait until it answers.

    The token goes in through JUPYTER_TOKEN (jupyter_server reads it), so it never shows in
    `ps`. stdout/stderr go to a file, never to a pipe nobody drains.
    """
    token = secrets.token_hex(16)
    run_env = dict(os.environ if env is None else env)
    run_env["JUPYTER_TOKEN"] = token
    # the server's and its kernels' files go in a short-lived folder of this run, not the user's
    # ~/.local/share/jupyter/runtime (a Unix socket path must stay under 108 bytes, hence /tmp)
    runtime_dir = Path(tempfile.mkdtemp(prefix="distlab-lab-"))
    run_env["JUPYTER_RUNTIME_DIR"] = str(runtime_dir)
    run_env.pop("MAKEFLAGS", None)  # a parent `make test -j` must not leak its flags into ours
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed in stop_lab
    # kernels on Unix sockets: the suite's other worker cannot take a kernel's port between
    # jupyter_client choosing it and the kernel binding it (see kernel_session._UnixSockets)
    flags = f"--no-browser --KernelManager.transport=ipc {lab_flags}".strip()
    with _sigint_not_ignored():
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "-C", str(REPO), "lab", "LAB_PORT=0",
             f"LAB_FLAGS={flags}", *make_args],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=run_env,
            start_new_session=True,  # own process group: the test stops exactly what it started
        )
    server = LabServer(proc=proc, port=0, token=token, log_path=log_path, runtime_dir=runtime_dir,
                       _log_file=log_file)
    try:
        server.port = _wait_for_port(server, time.monotonic() + timeout)
        _wait_until_answering(server, time.monotonic() + timeout)
    except BaseException:
        stop_lab(server)
        raise
    return server


def _wait_for_port(server: LabServer, deadline: float) -> int:
    while time.monotonic() < deadline:
        match = _URL_RE.search(server.log_path.read_text(errors="replace"))
        if match:
            return int(match.group(1))
        if server.proc.poll() is not None:
            raise RuntimeError(f"make lab exited with {server.proc.returncode}:\n{server.log_tail()}")
        time.sleep(0.2)
    raise TimeoutError(f"make lab printed no URL in time:\n{server.log_tail()}")


def _wait_until_answering(server: LabServer, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            server.api("GET", "api/status", timeout=5)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if server.proc.poll() is not None:
                raise RuntimeError(f"make lab exited:\n{server.log_tail()}") from None
            time.sleep(0.2)
    raise TimeoutError(f"JupyterLab did not answer in time:\n{server.log_tail()}")


def stop_lab(server: LabServer, timeout: float = 30.0) -> int:
    """Ctrl-C the server's process group; escalate to SIGTERM, then SIGKILL. Returns make's code.

    Signals go to the group the test created (pgid == make's pid), so nothing else on the
    machine is touched.
    """
    pgid = server.proc.pid
    try:
        for sig, wait_s in ((signal.SIGINT, timeout), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if server.proc.poll() is not None:
                break
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                server.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        _reap_group(pgid)
    finally:
        if server._log_file is not None:
            server._log_file.close()
        shutil.rmtree(server.runtime_dir, ignore_errors=True)
    return server.proc.returncode if server.proc.returncode is not None else -9


def _reap_group(pgid: int, timeout: float = 10.0) -> None:
    """Wait for stragglers of the group (JupyterLab's own children) to exit; then kill them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    """True while any process is left in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def port_is_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:`port` any more."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0
