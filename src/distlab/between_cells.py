"""Rank output that arrives while no ``%%dist`` cell runs: a thread a cell left running, a logger
on a timer, an asynchronous checkpoint reporting that it is done.

Without this, such lines waited in the socket until the next ``%%dist`` cell and then looked as if
that cell had printed them. Here the kernel's own event loop reads the ranks' connections between
cells and shows the lines as they come, where Jupyter shows a kernel thread's prints (under the
cell run last). The loop runs callbacks only while no cell runs, in the kernel's main thread, so
nothing here runs beside a cell and nothing needs a lock. Where there is no such loop (plain
Python, the grader, a Windows proactor loop), nothing is watched and the lines come with the next
cell, as before.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from multiprocessing.connection import Connection

from distlab import protocol

Handle = Callable[[int, protocol.Message], None]
BATCH = 64  # messages read per call: a rank printing without pause must not keep the kernel from its next cell
Refused = Callable[[int, Exception], None]


class BetweenCells:
    """Watches the ready ranks' connections from the end of one task to the start of the next."""

    def __init__(self) -> None:
        self._watched: dict[int, asyncio.AbstractEventLoop] = {}  # fd -> the loop it is watched on
        self.seen = False  # something was shown since the last task (its unfinished line is pending)

    def watch(self, conns: dict[int, Connection], handle: Handle, refused: Refused) -> None:
        try:
            loop = asyncio.get_running_loop()  # the kernel's, when called from a cell
        except RuntimeError:
            return
        for rank, conn in conns.items():
            try:
                fd = conn.fileno()
                loop.add_reader(fd, self._read, fd, rank, conn, handle, refused)
            except (NotImplementedError, OSError, ValueError, RuntimeError):  # no readers here, or closed
                return
            self._watched[fd] = loop

    def pause(self) -> None:
        """Stop watching before a task (its own wait reads the connections) or a restart."""
        for fd, loop in self._watched.items():
            try:
                loop.remove_reader(fd)
            except (OSError, ValueError, RuntimeError):
                pass
        self._watched.clear()

    def _read(self, fd: int, rank: int, conn: Connection, handle: Handle, refused: Refused) -> None:
        try:
            for _ in range(BATCH):  # then back to the loop, which calls again while more is waiting
                if not protocol.waiting(conn):
                    break
                handle(rank, protocol.recv(conn))
                self.seen = True
        except (EOFError, OSError):  # the rank is gone: the next task finds out and says so
            self._forget(fd)
        except pickle.UnpicklingError as exc:
            refused(rank, exc)
            self.seen = True
        except Exception:  # noqa: BLE001 - a callback that raised would be called again and again
            self._forget(fd)

    def _forget(self, fd: int) -> None:
        loop = self._watched.pop(fd, None)
        if loop is not None:
            loop.remove_reader(fd)
