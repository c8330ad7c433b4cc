"""A real Jupyter kernel for tests: execute code, collect what the notebook would show."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import AsyncKernelManager, KernelManager
from jupyter_client.utils import run_sync

# evaluated in a kernel with the kit loaded: [its folder in /tmp, its launcher's pid], which must
# both be gone after the kernel is, however it ended
HUB_FOLDER_AND_LAUNCHER = ("[__import__('distlab.hub').hub.Hub.get().dir, "
                           "__import__('distlab.hub').hub.Hub.get().launcher.pid]")


class _UnixSockets:
    """A kernel that talks over Unix sockets in a directory of its own, not over TCP ports.

    Why: for TCP, jupyter_client finds free ports, closes them, and the kernel binds them a moment
    later. The suite starts kernels and rank groups on two workers at once, and now and then
    another process takes a port in that moment: the kernel dies with "Address already in use"
    and a notebook test fails for a reason that is not the kit's. Paths in a fresh directory
    cannot collide. (Learners' kernels are started by JupyterLab and are not affected.)
    """

    def __init__(self, **traits: Any) -> None:
        super().__init__(**traits)  # type: ignore[call-arg]
        self._sockets = tempfile.mkdtemp(prefix="distlab-kernel-")
        self.transport = "ipc"
        self.ip = os.path.join(self._sockets, "kernel")

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)  # type: ignore[misc]
        if not restart:
            shutil.rmtree(self._sockets, ignore_errors=True)


class UnixSocketKernelManager(_UnixSockets, KernelManager):
    """A blocking kernel manager on Unix sockets (see _UnixSockets)."""

    def cleanup_resources(self, restart: bool = False) -> None:
        # KernelManager's own wraps its base coroutine, which would keep the directory
        run_sync(self._async_cleanup_resources)(restart=restart)


class AsyncUnixSocketKernelManager(_UnixSockets, AsyncKernelManager):
    """nbclient's kernel manager on Unix sockets: ``NotebookClient(kernel_manager_class=...)``."""


@dataclass
class Reply:
    stdout: str = ""
    stderr: str = ""
    error: dict[str, Any] | None = None
    status: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    msg_id: str = ""

    @property
    def traceback(self) -> str:
        return "\n".join(self.error["traceback"]) if self.error else ""

    def shown(self) -> list[dict[str, Any]]:
        """The rich outputs as a notebook shows them once the cell is done: an update replaces
        the data of every output displayed with its id (as JupyterLab's output area does)."""
        shown: list[dict[str, Any]] = []
        for output in self.outputs:
            display_id = output.get("transient", {}).get("display_id")
            if output["msg_type"] == "update_display_data":
                for earlier in shown:
                    if display_id is not None and earlier.get("transient", {}).get("display_id") == display_id:
                        earlier["data"] = output["data"]
            else:
                shown.append(dict(output))
        return shown


class KernelSession:
    """One ipykernel process started from this venv's python (as a notebook server would)."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        self.manager = UnixSocketKernelManager()
        self.manager.kernel_spec.argv[0] = sys.executable  # type: ignore[union-attr]
        # the kernel's own log (not cell output) goes nowhere: tests keep stderr clean
        self.manager.start_kernel(env=env, stderr=subprocess.DEVNULL)
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)  # a deadline, long enough for a start on a loaded machine

    @property
    def pid(self) -> int:
        return self.manager.provisioner.pid  # type: ignore[union-attr]

    def execute(self, code: str, timeout: float = 120.0,
                interrupt_on: tuple[str, int] | None = None,
                after_interrupt: Callable[[], None] | None = None) -> Reply:
        """Run ``code``; with ``interrupt_on=(text, count)``, press the stop button (SIGINT) as soon
        as the cell's output holds ``text`` ``count`` times (every rank said it got there), then
        call ``after_interrupt``."""
        reply = Reply()
        started = time.monotonic()
        msg_id = self.client.execute(code)
        reply.msg_id = msg_id
        interrupted = False
        while True:
            if interrupt_on is not None and not interrupted and reply.stdout.count(interrupt_on[0]) >= interrupt_on[1]:
                self.manager.interrupt_kernel()
                interrupted = True
                if after_interrupt is not None:
                    after_interrupt()
            remaining = timeout - (time.monotonic() - started)
            if remaining <= 0:
                raise TimeoutError(f"kernel did not finish within {timeout} s: {code[:80]!r}")
            try:
                msg = self.client.get_iopub_msg(timeout=min(remaining, 0.2))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    reply.stdout += content["text"]
                else:
                    reply.stderr += content["text"]
            elif kind == "error":
                reply.error = content
            elif kind in ("display_data", "execute_result", "update_display_data"):
                reply.outputs.append({**content, "msg_type": kind})
            elif kind == "status" and content["execution_state"] == "idle":
                break
        while True:  # the execute_reply says "error" even when IPython only printed a UsageError
            msg = self.client.get_shell_msg(timeout=max(1.0, timeout - (time.monotonic() - started)))
            if msg["parent_header"].get("msg_id") == msg_id:
                reply.status = msg["content"]["status"]
                if reply.status == "error" and reply.error is None:
                    reply.error = {k: msg["content"].get(k) for k in ("ename", "evalue", "traceback")}
                break
        reply.seconds = time.monotonic() - started
        return reply

    def stdout_after(self, reply: Reply, done: Callable[[str], bool], timeout: float = 60.0) -> str:
        """What the kernel printed under ``reply``'s cell after that cell finished, read until
        ``done`` holds for it (output from a thread that outlived the cell)."""
        text = ""
        deadline = time.monotonic() + timeout
        while not done(text):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no such output within {timeout} s; got {text!r}")
            try:
                msg = self.client.get_iopub_msg(timeout=min(remaining, 0.2))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == reply.msg_id and msg["msg_type"] == "stream" \
                    and msg["content"]["name"] == "stdout":
                text += msg["content"]["text"]
        return text

    def value(self, expression: str) -> Any:
        """The kernel's ``repr`` of an expression, evaluated back here (for plain data)."""
        reply = self.execute(f"_value = {expression}\nprint(repr(_value))")
        assert reply.error is None, reply.traceback
        return eval(reply.stdout)  # noqa: S307 - our own kernel's repr of plain data

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)

    def kill(self) -> None:
        """SIGKILL the kernel process alone, as a crash or the OOM killer would."""
        os.kill(self.pid, signal.SIGKILL)
        self.client.stop_channels()
        self.manager.cleanup_resources()
