"""Where rank output goes in the kernel: one labelled line per line a rank wrote.

A rank's stdout and stderr arrive in pieces. Each (rank, stream) keeps its unfinished line, and a
carriage return behaves as in a Jupyter output area: text after a ``"\\r"`` replaces the line, and
``"\\r\\n"`` ends it. So a progress bar (tqdm writes ``"\\r 40%|####  |"`` again and again) is one
live line per rank, not hundreds of lines.
"""

from __future__ import annotations

import re
import sys
from collections import deque
from typing import Protocol

from distlab.i18n import tr

SHOWN_PER_RANK = 1_000_000  # characters of output shown per rank and task as they come
TAIL_LINES = 100  # past that, the last lines kept and shown when the task ends ...
TAIL_CHARS = 20_000  # ... and at most this many characters of them
LONGEST_LINE = 65_536  # an unfinished line longer than this is shown as it is (a wall of text)

_BREAK = re.compile(r"(\r\n|\n|\r)")


class Sink(Protocol):
    def output(self, rank: int, stream: str, text: str) -> None: ...
    def display(self, rank: int, data: dict[str, object], metadata: dict[str, object],
                display_id: str | None = None, update: bool = False) -> None: ...


class UnfinishedLine:
    """The text a stream wrote since its last newline, with carriage returns applied."""

    __slots__ = ("text", "returned", "live")

    def __init__(self) -> None:
        self.text = ""
        self.returned = False  # a "\r" came last: more text replaces the line, "\n" ends it
        self.live = False      # the line has been rewritten: it is a progress line

    def feed(self, chunk: str) -> tuple[list[tuple[str, bool]], bool]:
        """The lines ``chunk`` finished, each with whether it was live, and whether the line
        left unfinished was rewritten."""
        finished: list[tuple[str, bool]] = []
        rewritten = False
        for piece in _BREAK.split(chunk):
            if piece in ("\n", "\r\n"):
                finished.append(self.finish())
                rewritten = False  # what was rewritten has ended; only a new rewrite counts
            elif piece == "\r":
                self.returned = True
            elif piece:
                if self.returned:
                    self.text, self.returned, self.live = "", False, True
                self.text += piece
                rewritten = rewritten or self.live
                if len(self.text) > LONGEST_LINE and not self.live:
                    finished.append(self.finish())
        return finished, rewritten

    def finish(self) -> tuple[str, bool]:
        line = (self.text, self.live)
        self.text, self.returned, self.live = "", False, False
        return line


class PrintSink:
    """Writes every rank line to stdout as '[rank N] line' (stderr lines too: see the README).

    Past ``SHOWN_PER_RANK`` characters a rank's output is no longer printed as it comes; its
    last ``TAIL_LINES`` lines are kept and printed at the end, after a line that says how much
    was left out, so a final result or message after a long loop still shows. A progress line
    is printed once, as it stands when it ends; :class:`distlab.magic.NotebookSink` shows it live.
    """

    flush_each = True  # a terminal or pipe shows lines as they come
    nodes: dict[int, str] = {}  # set by a pool whose ranks run on other hosts

    def __init__(self) -> None:
        self.shown: dict[int, int] = {}
        self.cut: dict[int, int] = {}
        self.tail: dict[int, deque[str]] = {}
        self.tail_size: dict[int, int] = {}
        self.unfinished: dict[tuple[int, str], UnfinishedLine] = {}

    def begin(self) -> None:
        self.shown.clear()
        self.cut.clear()
        self.tail.clear()
        self.tail_size.clear()
        self.unfinished.clear()

    def output(self, rank: int, stream: str, text: str) -> None:
        line = self.unfinished.setdefault((rank, stream), UnfinishedLine())
        finished, rewritten = line.feed(text)
        self._finished(rank, stream, finished)
        if rewritten:
            self.progress(rank, stream, line.text, final=False)

    def end(self) -> None:
        """The task ended: what is left unfinished is shown as it stands, then the kept tails."""
        for (rank, stream), line in sorted(self.unfinished.items()):
            if line.text:
                self._finished(rank, stream, [line.finish()])
        self.unfinished.clear()
        for rank, tail in sorted(self.tail.items()):
            cut = self.cut.get(rank, 0)
            if cut:
                sys.stdout.write(self._prefix(rank) + tr("... {cut} more characters of output were not shown; "
                                                         "the last {n} lines follow", cut=cut, n=len(tail)) + "\n")
            self._write(rank, list(tail))
        if self.flush_each:
            sys.stdout.flush()

    def display(self, rank: int, data: dict[str, object], metadata: dict[str, object],
                display_id: str | None = None, update: bool = False) -> None:
        """A terminal cannot replace what it printed: an update is printed as a new line, and an
        output cleared (``clear_output`` on a rank, which sends an empty one) prints nothing."""
        text = data.get("text/plain", "")
        if text or not update:
            sys.stdout.write(f"{self._prefix(rank)}{text}\n")

    def progress(self, rank: int, stream: str, text: str, final: bool) -> None:
        """A progress line changed (``final``: it ended as ``text``). Here it is printed once it ends."""
        if final:
            self._lines(rank, [text])

    def _finished(self, rank: int, stream: str, finished: list[tuple[str, bool]]) -> None:
        plain: list[str] = []
        for text, live in finished:
            if live:
                self._lines(rank, plain)
                plain = []
                self.progress(rank, stream, text, final=True)
            else:
                plain.append(text)
        self._lines(rank, plain)

    def _lines(self, rank: int, lines: list[str]) -> None:
        shown = self.shown.get(rank, 0)
        head: list[str] = []
        for line in lines:
            if shown < SHOWN_PER_RANK:
                head.append(line)
                shown += len(line) + 1
            else:
                self._keep_tail(rank, line)
        self.shown[rank] = shown
        if head:
            self._write(rank, head)

    def _prefix(self, rank: int) -> str:
        node = self.nodes.get(rank)
        return f"[rank {rank} @{node}] " if node else f"[rank {rank}] "

    def _write(self, rank: int, lines: list[str]) -> None:
        prefix = self._prefix(rank)
        sys.stdout.write("".join(f"{prefix}{line}\n" for line in lines))
        if self.flush_each:
            sys.stdout.flush()

    def _keep_tail(self, rank: int, line: str) -> None:
        tail = self.tail.setdefault(rank, deque())
        size = self.tail_size.get(rank, 0)
        tail.append(line)
        size += len(line) + 1
        while len(tail) > TAIL_LINES or size > TAIL_CHARS:
            dropped = len(tail.popleft()) + 1
            size -= dropped
            self.cut[rank] = self.cut.get(rank, 0) + dropped
        self.tail_size[rank] = size
