"""A rank's output: file descriptors 1 and 2 captured and forwarded to the kernel line by line.

Capturing at the descriptor level catches what C++ (gloo, NCCL) writes as well as print().
Every pipe is drained by its own thread, so a rank that writes megabytes never blocks. When a
task ends, the rank drains the pipes itself before it reports, so all output of a task reaches
the kernel before the task's result does.
"""

from __future__ import annotations

import base64
import codecs
import importlib.abc
import importlib.machinery
import io
import os
import select
import signal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from distlab.i18n import tr
from distlab.protocol import Display, Output

Send = Callable[[Any], None]
CHUNK = 65536
current_display: Callable[..., None] | None = None  # the rank's display(), once the rank is up


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


def mime_bundle(obj: Any) -> tuple[dict[str, object], dict[str, object]]:
    """The richest representations of ``obj`` that a notebook can show, without IPython, as plain
    values: the kernel reads a message only when everything in it is a builtin type, and a
    ``_repr_html_`` may well return a numpy string."""
    data, metadata = _mime_bundle(obj)
    return _plain(data), _plain(metadata)


def _plain(value: Any) -> Any:
    """``value`` with builtin types only (JSON's, as a notebook stores them)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    for convert, sign in ((int, "__index__"), (float, "__float__")):  # numpy's and torch's scalars
        if isinstance(value, convert) or hasattr(value, sign):
            try:
                return convert(value)
            except (TypeError, ValueError, OverflowError):
                pass
    return str(value)


def _mime_bundle(obj: Any) -> tuple[dict[str, object], dict[str, object]]:
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
        ("text/latex", "_repr_latex_"), ("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"),
        ("application/json", "_repr_json_"),
    ):
        render = getattr(obj, method, None)
        value = render() if callable(render) else None
        if isinstance(value, tuple) and len(value) == 2:  # (data, metadata), as IPython's Image gives
            value, metadata[mime] = value
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode()
        if value is not None:
            data[mime] = value
    return data, metadata


def make_display(rank: int, send: Send, output: CapturedOutput) -> Callable[..., Any]:
    def display(*objs: Any, raw: bool = False, metadata: dict[str, object] | None = None,
                display_id: Any = None, **_options: Any) -> DisplayHandle | None:
        """Show objects (figures, HTML, anything with a repr) in the cell, labelled by rank. Takes
        IPython's ``display`` arguments: ``raw=True`` objects are bundles already; a display id
        gives a handle whose ``update`` shows the new value below (a rank has no output to replace)."""
        output.sync()
        for obj in objs:
            data, extra = (_plain(obj), {}) if raw and isinstance(obj, dict) else mime_bundle(obj)
            send(Display(rank, data, {**extra, **_plain(metadata or {})}))
        return DisplayHandle(display) if display_id else None

    return display


class DisplayHandle:
    """What ``display(..., display_id=True)`` returns on a rank."""

    def __init__(self, show: Callable[..., Any]) -> None:
        self._show = show

    def display(self, obj: Any, **options: Any) -> None:
        self._show(obj, **options)

    def update(self, obj: Any, **options: Any) -> None:
        self._show(obj, **options)


def show_value(value: Any) -> None:
    """A cell's last value: printed when text is all it has (a tensor, a number), as the labelled
    line it always was; shown richly when it has more (a DataFrame's table, HTML, an image)."""
    data, metadata = mime_bundle(value)
    if set(data) == {"text/plain"} or current_display is None:
        print(data["text/plain"])
    else:  # the bundle made above, not a second one (repr and _repr_html_ may be costly)
        current_display(data, raw=True, metadata=metadata)


_IPYTHON_DISPLAY = "IPython.core.display_functions"


def route_ipython_display() -> None:
    """``from IPython.display import display, HTML`` on a rank: IPython, with no kernel around it,
    prints ``<IPython.core.display.HTML object>``. Its ``display`` becomes the rank's own, which
    shows the object in the cell, now or whenever IPython is first imported (importing it here
    would add its import time to every cold start)."""
    module = sys.modules.get(_IPYTHON_DISPLAY)
    if module is not None:
        module.display = _display_for_ipython  # type: ignore[attr-defined]
    elif not any(isinstance(finder, _RouteOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RouteOnImport())


def _display_for_ipython(*objs: Any, **options: Any) -> Any:
    if current_display is None:
        print(*(repr(obj) for obj in objs))
        return None
    return current_display(*objs, **options)


class _RouteOnImport(importlib.abc.MetaPathFinder):
    """Finds IPython's display module with the other finders, and routes its ``display`` as soon as
    the module has run, before ``IPython.display`` copies the name."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _IPYTHON_DISPLAY:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader.exec_module = _then_route(spec.loader.exec_module)  # type: ignore[method-assign,assignment]
                return spec
        return None


def _then_route(run: Callable[[types.ModuleType], None]) -> Callable[[types.ModuleType], None]:
    def exec_module(module: types.ModuleType) -> None:
        run(module)
        module.display = _display_for_ipython  # type: ignore[attr-defined]

    return exec_module
