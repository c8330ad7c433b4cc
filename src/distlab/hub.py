"""The kernel's end of every channel: one private Unix socket and one preloaded launcher.

Ranks connect back to the hub and prove they hold its key; the hub hands each connection to the
pool that asked for it. The launcher imports torch once and forks ranks on demand, so a pool starts
in a fraction of a second instead of paying one torch import per rank. The kernel itself never
imports torch here and never forks.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import threading
from collections import defaultdict
from multiprocessing.connection import Connection

from distlab import prestart, protocol
from distlab.errors import PoolDied
from distlab.protocol import ControlHello, LauncherHello, RankExited, RankHello


class Hub:
    """Owns the socket, the key and the launcher process; shared by every pool in this process."""

    _current: Hub | None = None

    def __init__(self) -> None:
        self.key = secrets.token_bytes(32)
        # the launcher is already importing torch if %load_ext started it
        self.dir, self.launcher, self.launcher_environ = prestart.take()
        self.path = os.path.join(self.dir, "hub.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._lock = threading.Lock()
        self._queued: list[protocol.Message] = []  # for the launcher, until it has connected
        self._wake_r, self._wake_w = os.pipe()  # the accept thread wakes a waiting main thread
        self._stop_r, self._stop_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self._log_path = os.path.join(self.dir, prestart.LOG)
        assert self.launcher.stdin is not None
        config = {"path": self.path, "key": self.key.hex(), "parent": os.getpid()}
        try:
            self.launcher.stdin.write(json.dumps(config).encode() + b"\n")
            self.launcher.stdin.close()
        except BrokenPipeError:
            pass  # it died already: alive() says so, and the log says why
        self._launcher_conn: Connection | None = None
        self._arrived: dict[tuple[str, int], dict[int, tuple[Connection, int]]] = defaultdict(dict)
        self._exits: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
        self._exit_reasons: dict[tuple[str, int], dict[int, str]] = defaultdict(dict)
        self._hellos: dict[tuple[str, int], dict[int, RankHello]] = defaultdict(dict)
        self._controls: dict[tuple[str, int], dict[int, Connection]] = defaultdict(dict)
        self._tcp: socket.socket | None = None  # cluster mode: ranks on other hosts connect here
        self.closed = False
        self._acceptor: threading.Thread | None = threading.Thread(
            target=self._accept_forever, name="distlab-accept", daemon=True)
        self._acceptor.start()

    @classmethod
    def get(cls) -> Hub:
        """The process-wide hub, started on first use (and again if its launcher died)."""
        if cls._current is None or not cls._current.alive():
            if cls._current is not None:
                cls._current.close()
            cls._current = cls()
        return cls._current

    def alive(self) -> bool:
        return not self.closed and self.launcher.poll() is None

    def launcher_log(self) -> str:
        try:
            with open(self._log_path, errors="replace") as log:
                return log.read()[-4000:]
        except OSError:
            return ""

    # --- the launcher -------------------------------------------------------------------------
    def send_launcher(self, message: protocol.Message) -> None:
        """Send now, or as soon as the launcher has connected: callers never wait for torch's import."""
        if not self.alive():
            raise PoolDied(f"the distlab launcher exited (code {self.launcher.poll()}):\n{self.launcher_log()}")
        with self._lock:
            if self._launcher_conn is None:
                self._queued.append(message)
                return
            try:
                protocol.send(self._launcher_conn, message)
            except OSError as exc:
                raise PoolDied(f"lost the distlab launcher: {exc}\n{self.launcher_log()}") from exc

    # --- waiting ------------------------------------------------------------------------------
    def wait(self, conns: list[Connection], timeout: float) -> list[Connection]:
        """Wait for any of ``conns``, or for news from the hub's thread (an arrival, a rank exit)."""
        # select.poll directly, not multiprocessing's wait(): that builds a selector each time,
        # and the kernel waits several times per cell.
        poller = select.poll()
        by_fd = {c.fileno(): c for c in conns}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(max(0, math.ceil(timeout * 1000)))}
        if self._wake_r in ready:
            try:
                os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass
        return [c for fd, c in by_fd.items() if fd in ready]

    def listen_tcp(self, address: str) -> str:
        """Also accept ranks over TCP on ``address`` (one interface's address, never every
        interface unless the user names 0.0.0.0); returns "address:port". Idempotent."""
        if self._tcp is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((address, 0))
            listener.listen(256)
            listener.setblocking(False)
            self._tcp = listener
            os.write(self._stop_w, b"+")  # the accept thread picks up the new listener
        host, port = self._tcp.getsockname()[:2]
        return f"{host}:{port}"

    def _accept_forever(self) -> None:
        """Accept and authenticate peers at once, even while the kernel is idle between cells, and
        record what the launcher reports (rank exits) as it comes.

        Ranks then finish joining their process group while the learner reads, nobody waits on a
        handshake the kernel is not looking at, and a wait in the kernel has no side effects.
        """
        while True:
            listeners = [self._listener] + ([self._tcp] if self._tcp is not None else [])
            launcher = self._launcher_conn if not self.closed else None
            fds = [x.fileno() for x in listeners] + [self._stop_r] + ([launcher.fileno()] if launcher else [])
            readable, _, _ = select.select(fds, [], [])
            if self._stop_r in readable:
                if os.read(self._stop_r, 1) != b"+":
                    return
                continue
            for listener in listeners:
                if listener.fileno() in readable:
                    self._accept_one(listener)
            if launcher is not None and launcher.fileno() in readable:
                self._drain_launcher(launcher)
                os.write(self._wake_w, b"!")

    def _accept_one(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except OSError:  # nothing to accept after all, or the listener was closed
            return
        sock.setblocking(True)
        if sock.family == socket.AF_INET:
            protocol.tune_tcp(sock)
        conn = Connection(sock.detach())
        try:
            protocol.server_handshake(conn, self.key)
            if not conn.poll(protocol.HANDSHAKE_TIMEOUT):
                raise protocol.HandshakeFailed("no hello")
            hello = protocol.recv(conn)
        except Exception:  # noqa: BLE001 - a peer that fails the handshake or says nonsense is dropped
            conn.close()
            return
        with self._lock:
            if isinstance(hello, LauncherHello) and self._launcher_conn is None and hello.pid == self.launcher.pid:
                for message in self._queued:
                    protocol.send(conn, message)
                self._queued.clear()
                self._launcher_conn = conn
            elif isinstance(hello, RankHello):
                self._arrived[(hello.pool_id, hello.generation)][hello.rank] = (conn, hello.pid)
                self._hellos[(hello.pool_id, hello.generation)][hello.rank] = hello
            elif isinstance(hello, ControlHello):
                self._controls[(hello.pool_id, hello.generation)][hello.rank] = conn
            else:
                conn.close()
        os.write(self._wake_w, b"!")

    def _drain_launcher(self, launcher: Connection) -> None:
        while True:
            try:
                if not protocol.waiting(launcher):
                    return
                message = protocol.recv(launcher)
            except (EOFError, OSError):
                self.closed = True  # the launcher is gone; close() closes the connection
                return
            if isinstance(message, RankExited):
                with self._lock:
                    self._exits[(message.pool_id, message.generation)][message.rank] = message.returncode
                    if message.reason:
                        self._exit_reasons[(message.pool_id, message.generation)][message.rank] = message.reason

    def take_arrivals(self, pool_id: str, generation: int) -> dict[int, tuple[Connection, int]]:
        with self._lock:
            return self._arrived.pop((pool_id, generation), {})

    def hellos(self, pool_id: str, generation: int) -> dict[int, RankHello]:
        with self._lock:
            return dict(self._hellos.get((pool_id, generation), {}))

    def controls(self, pool_id: str, generation: int) -> dict[int, Connection]:
        with self._lock:
            return dict(self._controls.get((pool_id, generation), {}))

    def exits(self, pool_id: str, generation: int) -> dict[int, int]:
        with self._lock:
            return dict(self._exits.get((pool_id, generation), {}))

    def exit_reason(self, pool_id: str, generation: int, rank: int) -> str:
        """Why the launcher ended this rank ("" when it ended by itself)."""
        with self._lock:
            return self._exit_reasons.get((pool_id, generation), {}).get(rank, "")

    def forget(self, pool_id: str, generation: int) -> None:
        for conn, _ in self.take_arrivals(pool_id, generation).values():
            conn.close()
        with self._lock:
            self._exits.pop((pool_id, generation), None)
            self._exit_reasons.pop((pool_id, generation), None)
            self._hellos.pop((pool_id, generation), None)
        for conn in self._controls.pop((pool_id, generation), {}).values():
            conn.close()

    def stack_path(self, pool_id: str, generation: int, rank: int) -> str:
        return protocol.stack_file(self.dir, pool_id, generation, rank)

    # --- shutdown -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the launcher and with it every rank (they share its process group)."""
        if self._acceptor is None:
            return  # closed already
        self.closed = True
        if self._launcher_conn is not None and self.launcher.poll() is None:
            try:
                protocol.send(self._launcher_conn, protocol.Shutdown())
            except OSError:
                pass
            try:
                self.launcher.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        if self.launcher.poll() is None:
            try:
                os.killpg(self.launcher.pid, signal.SIGKILL)  # the group we created: launcher + ranks
            except (ProcessLookupError, PermissionError):
                pass
            self.launcher.wait()
        # the folder now, not last: a kernel killed during the rest (the acceptor's join may take
        # seconds) left it behind, and its launcher, already gone, could not remove it for it
        shutil.rmtree(self.dir, ignore_errors=True)
        os.write(self._stop_w, b"!")  # the thread first: it may be reading the launcher's connection
        self._acceptor.join(timeout=protocol.HANDSHAKE_TIMEOUT + 1.0)
        self._acceptor = None
        if self._launcher_conn is not None:
            self._launcher_conn.close()
        self._listener.close()
        if self._tcp is not None:
            self._tcp.close()
        for fd in (self._wake_r, self._wake_w, self._stop_r, self._stop_w):
            os.close(fd)


def _close_current() -> None:
    if Hub._current is not None:
        Hub._current.close()
        Hub._current = None


atexit.register(_close_current)
