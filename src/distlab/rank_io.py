"""A rank's output: file descriptors 1 and 2 captured and forwarded to the kernel line by line.

Capturing at the descriptor level catches what C++ (gloo, NCCL) writes as well as print().
Every pipe is drained by its own thread, so a rank that writes megabytes never blocks. A sync
marker written through each pipe guarantees that all output of a task reaches the kernel before
the task's result does.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from distlab.protocol import Display, Output

Send = Callable[[Any], None]
CHUNK = 65536
current_display: Callable[..., None] | None = None  # the rank's display(), once the rank is up


class _Forwarder(threading.Thread):
    def __init__(self, fd: int, stream: str, rank: int, send: Send) -> None:
        super().__init__(daemon=True, name=f"distlab-{stream}")
        self.fd = fd
        self.stream = stream
        self.rank = rank
        self.send = send
        self.marker = b""
        self.seen = threading.Event()

    def run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGUSR1})
        pending = b""
        while True:
            try:
                chunk = os.read(self.fd, CHUNK)
            except OSError:
                return
            if not chunk:
                return
            pending += chunk
            marker = self.marker
            if marker and marker in pending:
                before, _, pending = pending.partition(marker)
                self._emit(before)
                self.seen.set()
            cut = pending.rfind(b"\n") + 1
            if cut and not (self.marker and self.marker[:1] in pending[cut:]):
                self._emit(pending[:cut])
                pending = pending[cut:]
            elif len(pending) > CHUNK:
                self._emit(pending)
                pending = b""

    def _emit(self, data: bytes) -> None:
        if data:
            self.send(Output(self.rank, self.stream, data.decode("utf-8", "replace")))  # type: ignore[arg-type]


class CapturedOutput:
    """Replaces fds 1 and 2 with pipes read by forwarder threads."""

    def __init__(self, rank: int, send: Send) -> None:
        self.forwarders = []
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            forwarder = _Forwarder(read_end, stream, rank, send)
            forwarder.start()
            self.forwarders.append(forwarder)
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), line_buffering=True, write_through=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), line_buffering=True, write_through=True)
        self._count = 0

    def sync(self, timeout: float = 2.0) -> None:
        """Return once everything written so far has been sent to the kernel."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        self._count += 1
        token = f"\x00distlab-sync-{os.getpid()}-{self._count}\x00".encode()
        for forwarder, fd in zip(self.forwarders, (1, 2), strict=True):
            forwarder.seen.clear()
            forwarder.marker = token
            os.write(fd, token)
        for forwarder in self.forwarders:
            forwarder.seen.wait(timeout)
            forwarder.marker = b""


def mime_bundle(obj: Any) -> tuple[dict[str, object], dict[str, object]]:
    """The richest representations of ``obj`` that a notebook can show, without IPython."""
    data: dict[str, object] = {"text/plain": repr(obj)}
    metadata: dict[str, object] = {}
    if type(obj).__module__.startswith("matplotlib") and hasattr(obj, "savefig"):
        buffer = io.BytesIO()
        obj.savefig(buffer, format="png", bbox_inches="tight")
        data["image/png"] = base64.b64encode(buffer.getvalue()).decode()
        return data, metadata
    bundle = getattr(obj, "_repr_mimebundle_", None)
    if callable(bundle):
        result = bundle()
        if isinstance(result, tuple):
            result, metadata = result
        data.update(result or {})
        return data, metadata
    for mime, method in (
        ("text/html", "_repr_html_"), ("image/svg+xml", "_repr_svg_"), ("text/markdown", "_repr_markdown_"),
        ("text/latex", "_repr_latex_"), ("image/png", "_repr_png_"),
    ):
        render = getattr(obj, method, None)
        value = render() if callable(render) else None
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode()
        if value is not None:
            data[mime] = value
    return data, metadata


def make_display(rank: int, send: Send, output: CapturedOutput) -> Callable[..., None]:
    def display(*objs: Any) -> None:
        """Show objects (figures, HTML, anything with a repr) in the cell, labelled by rank."""
        output.sync()
        for obj in objs:
            data, metadata = mime_bundle(obj)
            send(Display(rank, data, metadata))

    return display
