"""A rank's output: file descriptors 1 and 2 captured and forwarded to the kernel line by line.

Capturing at the descriptor level catches what C++ (gloo, NCCL) writes as well as print().
Every pipe is drained by its own thread, so a rank that writes megabytes never blocks. When a
task ends, the rank drains the pipes itself before it reports, so all output of a task reaches
the kernel before the task's result does.
"""

from __future__ import annotations

import codecs
import io
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from distlab.i18n import tr
from distlab.protocol import Output

Send = Callable[[Any], None]
CHUNK = 65536


class _Forwarder(threading.Thread):
    """Reads one pipe and sends its lines to the kernel.

    The thread and ``flush`` (called by the rank's main thread when a task ends) read the pipe
    under one lock, so after ``flush`` returns every byte written before it has been sent.
    """

    def __init__(self, fd: int, stream: str, rank: int, send: Send) -> None:
        super().__init__(daemon=True, name=f"distlab-{stream}")
        self.fd = fd
        self.stream = stream
        self.rank = rank
        self.send = send
        self.lock = threading.Lock()
        self.pending = b""
        self.line_open = False  # the last text sent did not end its line (print(..., end=""))
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        os.set_blocking(fd, False)

    def run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGUSR1})
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLHUP)
        open_ = True
        while open_:
            poller.poll()
            with self.lock:
                open_ = self._drain(final=False)

    def flush(self) -> None:
        with self.lock:
            self._drain(final=True)

    def _drain(self, final: bool) -> bool:
        """Read what the pipe holds and send whole lines (everything when ``final``); False at EOF."""
        open_ = True
        while True:
            try:
                chunk = os.read(self.fd, CHUNK)
            except BlockingIOError:
                break
            except OSError:
                open_ = False
                break
            if not chunk:
                open_ = False
                break
            self.pending += chunk
            self._emit_lines(final=False)
        self._emit_lines(final=final or not open_)
        return open_

    def _emit_lines(self, final: bool) -> None:
        """Send whole lines; and the unfinished one too when a carriage return rewrote it (a
        progress bar is shown as it moves) or it grew past a chunk."""
        line_start = self.pending.rfind(b"\n") + 1
        rewritten = self.pending.find(b"\r", line_start) >= 0
        cut = len(self.pending) if final or rewritten or len(self.pending) > CHUNK else line_start
        if cut:
            data, self.pending = self.pending[:cut], self.pending[cut:]
            text = self.decoder.decode(data, final=final)  # a character split across reads waits
            if text:
                self.send(Output(self.rank, self.stream, text))  # type: ignore[arg-type]
                self.line_open = not text.endswith("\n")

    def line_is_open(self) -> bool:
        """Does the output so far end in the middle of a line?"""
        with self.lock:
            self._drain(final=False)
            return bool(self.pending) or self.line_open


class NoKeyboard(io.TextIOBase):
    """A rank's stdin. Nobody can type to a rank, so reading says so instead of a bare
    "EOF when reading a line"; it is still an EOFError, for code that catches that."""

    encoding = "utf-8"
    errors = "strict"
    name = "<stdin>"

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> str:
        raise EOFError(tr("a rank has no keyboard, so input() and sys.stdin cannot read here. Read the value "
                          "in a normal cell, then copy it to the ranks with %dist_push NAME"))

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return self.read()


def _text(fd: int) -> io.TextIOWrapper:
    """A line-buffered text stream on ``fd`` that does not close the descriptor when closed itself."""
    return io.TextIOWrapper(os.fdopen(fd, "wb", buffering=0, closefd=False), line_buffering=True, write_through=True)


class CapturedOutput:
    """Replaces fds 1 and 2 with pipes read by forwarder threads."""

    def __init__(self, rank: int, send: Send) -> None:
        self.forwarders = []
        self._spares: dict[int, int] = {}  # fd -> a spare write end of its pipe
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.set_inheritable(write_end, False)
            self._spares[fd] = write_end
            forwarder = _Forwarder(read_end, stream, rank, send)
            forwarder.start()
            self.forwarders.append(forwarder)
        self.stdout, self.stderr = _text(1), _text(2)
        sys.stdout, sys.stderr = self.stdout, self.stderr
        sys.stdin = NoKeyboard()

    def repair(self) -> None:
        """Put back what a previous cell closed (``os.close(1)``, ``sys.stdout.close()``,
        ``sys.stdout = None``), so one cell cannot leave a rank failing or mute for the rest of its
        life. A redirection that still works (``sys.stdout = open(...)``) is the learner's and stays."""
        for fd, spare in self._spares.items():
            try:
                os.fstat(fd)
            except OSError:
                os.dup2(spare, fd)
        if self.stdout.closed:
            self.stdout = _text(1)
        if self.stderr.closed:
            self.stderr = _text(2)
        if sys.stdout is None or sys.stdout.closed:
            sys.stdout = self.stdout
        if sys.stderr is None or sys.stderr.closed:
            sys.stderr = self.stderr

    def start_a_line(self) -> None:
        """Before a cell's value is shown: end a line the cell left open (``sys.stdout.write("x")``
        or ``print(..., end="")``), so the value is a line of its own, as Jupyter shows it apart."""
        flush_standard_streams()
        if self.forwarders[0].line_is_open():
            try:
                os.write(1, b"\n")
            except OSError:  # the cell closed fd 1: repair() puts it back for the next one
                pass

    def sync(self) -> None:
        """Return once everything written so far has been sent to the kernel."""
        flush_standard_streams()
        for forwarder in self.forwarders:
            forwarder.flush()


def flush_standard_streams() -> None:
    """Push what ``sys.stdout`` and ``sys.stderr`` hold into fds 1 and 2, whatever a cell made of them."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or replaced by None or a stub
            pass
