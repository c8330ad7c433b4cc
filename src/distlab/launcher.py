"""The preloaded parent of every rank: imports torch once, then forks ranks on demand.

It is started by the kernel's hub with ``sys.executable`` in a new session (its own process group),
never by forking the kernel, and it never touches CUDA, so forked ranks start clean. It stays
single-threaded because only then is fork safe. It dies with the kernel: when the hub's socket
closes or its parent changes, it kills its ranks and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import gc
import importlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

from distlab import protocol
from distlab.protocol import KillGeneration, LauncherHello, RankExited, Shutdown, SpawnRanks

POLL_SECONDS = 0.02
EXTRAS_AFTER_IDLE = 3.0  # seconds without requests before the optional preload starts
QUOTA_CHECK_SECONDS = 0.25  # how often the folders of ranks with a write quota are measured


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


_PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> None:
    """Become the parent of every orphan below this process (Linux; no-op elsewhere).

    Why: a process that a rank starts in a session of its own (``setsid``, ``start_new_session``, a
    daemon's double fork) leaves the rank's process group, so killing that group misses it, and
    once its parent is gone it would belong to init and outlive the kernel. With this set on the
    launcher and on every rank, such a process stays below its rank while the rank lives and comes
    to the launcher when the rank ends, which then ends it (``Launcher.end_adopted``).
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def preload() -> None:
    """Import what every rank needs, once, before any fork.

    The cyclic collector is off meanwhile: importing torch builds hundreds of thousands of objects
    and almost no garbage, and the collections it would trigger cost about 8% of the import, which
    is on the path to the first cell.
    """
    with _collector_paused():
        import cloudpickle  # noqa: F401
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401

        import distlab.worker  # noqa: F401


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # what was imported is permanent: ranks' collections skip it (and pages stay shared)
        gc.enable()


def preload_extras() -> None:
    """What training cells import (optimizers pull in torch._dynamo, about a second per rank),
    loaded once while the learner reads, so ranks forked later start with it."""
    with _collector_paused():
        for name in ("torch._dynamo", "torch.optim", "torch.distributed.fsdp", "torch.nn.parallel"):
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - an optional speed-up; ranks import it themselves if needed
                print(f"distlab launcher: could not preload {name}: {exc}", file=sys.stderr)


def preload_grading() -> None:
    """What every grading rank imports: the grading harness and every exercise module, whose
    catalog parses each exercise's source (about 110 ms of one core per rank, paid again by each of
    the ranks of every batch of every part: 148 ranks to grade the seven references). Loaded once, before
    the first grading ranks are forked, so they start with it. Only the kit's own modules: nothing
    a submission sends is in them. A launcher that forks grading ranks then skips preload_extras,
    which no check needs: its second of import would run while a hanging part keeps the launcher
    idle, and hold up the spawn of the next part's ranks, whose clock is running."""
    with _collector_paused():
        try:
            import distlab.trace  # noqa: F401 - the recorder every part's guard starts
            from distlab.grading import harness  # noqa: F401
            from distlab.grading.catalog import ENTRIES

            for known in ENTRIES:
                known.load()
        except Exception as exc:  # noqa: BLE001 - an optional speed-up; ranks import it themselves if needed
            print(f"distlab launcher: could not preload the grading modules: {exc}", file=sys.stderr)


class _KernelGone(Exception):
    """A message to the kernel could not be sent: it has died."""


class Launcher:
    def __init__(self, conn: Connection, path: str, key: bytes, parent: int) -> None:
        self.conn = conn
        self.path = path
        self.key = key
        self.parent = parent
        self.children: dict[int, tuple[str, int, int]] = {}  # pid -> (pool_id, generation, rank)
        self.quotas: dict[int, tuple[str, int]] = {}  # pid -> (its own folder, bytes it may keep there)
        self.reasons: dict[int, str] = {}  # pid -> why the launcher ended it
        self.trackers: set[int] = set()  # pids of the resource trackers ranks share (see start_tracker)
        self._networks_work: bool | None = None  # can grading ranks get a network of their own? (asked once)
        self._grading_loaded = False
        self._next_quota_check = 0.0

    def serve(self) -> bool:
        """Spawn and reap ranks until the kernel says stop (False) or is gone (True). Any other
        error propagates: its traceback in the launcher's log is what the kernel shows."""
        idle_since = time.monotonic()
        extras_loaded = False
        try:
            while os.getppid() == self.parent:
                try:
                    message = protocol.recv(self.conn) if self.conn.poll(POLL_SECONDS) else None
                except (EOFError, OSError):
                    return True  # the kernel is gone: its connection may end before we get a new parent
                if isinstance(message, Shutdown):
                    return False
                if message is not None:
                    self.handle(message)
                    idle_since = time.monotonic()
                elif not extras_loaded and time.monotonic() - idle_since > EXTRAS_AFTER_IDLE:
                    if not self._grading_loaded:  # see preload_grading: grading ranks need none of it
                        preload_extras()
                    extras_loaded = True
                self.police_quotas()
                self.reap()
            return True
        except _KernelGone:
            return True
        finally:
            self.kill_all()

    def _tell_kernel(self, message: protocol.Message) -> None:
        try:
            protocol.send(self.conn, message)
        except OSError:
            raise _KernelGone from None

    def handle(self, message: protocol.Message) -> None:
        if isinstance(message, SpawnRanks):
            self.spawn(message)
        elif isinstance(message, KillGeneration):
            for pid, (pool_id, generation, _) in self.children.items():
                if (pool_id, generation) == (message.pool_id, message.generation):
                    _kill_group(pid)

    def spawn(self, request: SpawnRanks) -> None:
        if request.writes_confined and not self._grading_loaded:  # grading ranks: see preload_grading
            preload_grading()
            self._grading_loaded = True
        network = self._private_network(request)
        store: socket.socket | None = None
        if network is not None:  # rank 0 makes its store in the ranks' own network, on known ports
            from distlab import private_network

            port, scripts_port = private_network.STORE_PORT, private_network.SCRIPTS_PORT
        else:  # rank 0 hosts the TCPStore on this socket; the OS picks the port, so there is no race
            store = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            store.bind(("127.0.0.1", 0))
            store.listen(128)
            port = store.getsockname()[1]
            scripts_port = _free_port()
        # a grading rank starts no process, so it needs no tracker of the names its processes share
        tracker = None if request.writes_confined else os.pipe()
        if request.writes_confined:  # every rank's files exist before any rank is shut out of the others'
            for rank in request.ranks:
                os.makedirs(self._own_folder_path(request.pool_id, request.generation, rank), mode=0o700, exist_ok=True)
                open(self._stack_path(request.pool_id, request.generation, rank), "a").close()  # appended to by the rank
        if request.unreadable or request.writes_confined:
            from distlab import confine

            confine.prepare((*request.unreadable, *self._other_ranks_files(request, -1)))
        for rank in request.ranks:
            pid = os.fork()
            if pid == 0:
                if tracker is not None:
                    os.close(tracker[0])
                    share_resource_tracker(tracker[1])
                self._become_rank(request, rank, store, port, scripts_port, network)
            if network is not None and not network.first:
                network.first = pid
            try:
                os.setpgid(pid, pid)  # here too, so the group exists before any kill (no race with the child)
            except OSError:
                pass  # the child got there first
            self.children[pid] = (request.pool_id, request.generation, rank)
            if request.writes_confined and request.write_quota:
                own = self._own_folder_path(request.pool_id, request.generation, rank)
                self.quotas[pid] = (own, request.write_quota)
        if store is not None:
            store.close()
        if network is not None:
            network.close()
        if tracker is not None:
            self.start_tracker(*tracker)

    def _private_network(self, request: SpawnRanks) -> _PrivateNetwork | None:
        """A network of their own for grading ranks, where this machine allows one (asked once)."""
        if not request.writes_confined:
            return None
        if self._networks_work is None:
            from distlab import private_network

            self._networks_work = private_network.works_here()
        return _PrivateNetwork(*os.pipe(), others=len(request.ranks) - 1) if self._networks_work else None

    def start_tracker(self, read_end: int, write_end: int) -> None:
        """Fork multiprocessing's resource tracker for ranks that already hold ``write_end``.

        Why: a rank's processes share named semaphores (every spawn or forkserver Queue, Lock or
        Pool makes some) and shared memory; multiprocessing's tracker unlinks what is left when the
        last process that registered names has gone. Started by a rank, the tracker would sit in
        the rank's process group and die in the same SIGKILL, leaving the names in /dev/shm for
        good. Started here, outside that group, it outlives the ranks by the moment it needs to
        clean up: every rank of the generation holds the write end, so it reads end-of-file when
        the last of them (and their children) has ended, unlinks what they left and exits.
        """
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(write_end)
                kept = _keep_only(read_end)
                from multiprocessing import resource_tracker

                resource_tracker.main(kept)
                code = 0
            except BaseException:  # noqa: BLE001 - SystemExit from main() included; nothing to report to
                pass
            finally:
                os._exit(code)
        os.close(read_end)
        os.close(write_end)
        self.trackers.add(pid)

    def police_quotas(self) -> None:
        """A rank confined to its own folder may keep only so much there: past its quota it is
        ended (its writes are too fast to wait for the cell's deadline), and the kernel says why."""
        now = time.monotonic()
        if not self.quotas or now < self._next_quota_check:
            return
        self._next_quota_check = now + QUOTA_CHECK_SECONDS
        from distlab import confine

        for pid, (folder, quota) in list(self.quotas.items()):
            if pid not in self.reasons and confine.folder_exceeds(folder, quota):  # reap() drops the ended
                self.reasons[pid] = protocol.WRITE_QUOTA_EXCEEDED
                _kill_group(pid)

    def _become_rank(self, request: SpawnRanks, rank: int, store: socket.socket | None, port: int,
                     scripts_port: int, network: _PrivateNetwork | None) -> None:
        code = 1
        try:
            self.conn.close()
            os.setpgid(0, 0)  # its own process group: what the rank starts ends with it (_kill_group)
            die_with_parent()
            adopt_orphans()  # and what leaves the group stays below the rank (see adopt_orphans)
            if network is not None:
                network.enter()
                if rank == 0:
                    from distlab import private_network

                    store = private_network.store_socket()
            if request.unreadable or request.memory_limit or request.writes_confined:  # before its first thread
                from distlab import confine

                writable = self._own_folder(request, rank) if request.writes_confined else None
                confine.confine((*request.unreadable, *self._other_ranks_files(request, rank)), writable)
                if request.writes_confined:  # a grading rank: threads, but no process of its own
                    confine.forbid_new_processes()
                if request.write_quota:
                    confine.limit_file_size(request.write_quota)
                if request.memory_limit:
                    confine.limit_memory(request.memory_limit)
            from distlab.worker import RankSpec, rank_main

            spec = RankSpec(
                pool_id=request.pool_id, generation=request.generation, rank=rank,
                world_size=request.world_size, backend=request.backend,
                hub_path=self.path, key=self.key, store_port=port, scripts_port=scripts_port,
            )
            code = rank_main(spec, store if rank == 0 else None)
            if rank != 0 and store is not None:
                store.close()
        except BaseException as exc:  # noqa: BLE001 - it never reached the kernel: the launcher's log says why
            with contextlib.suppress(OSError):
                os.write(2, protocol.early_failure(request.pool_id, request.generation, rank, exc).encode())
        finally:
            os._exit(code)

    def _own_folder(self, request: SpawnRanks, rank: int) -> list[str]:
        """What a rank confined to its own files may write: a fresh temporary folder (its TMPDIR,
        removed when the rank ends), its stack file and /dev/null; both made by ``spawn``."""
        from distlab import confine

        own = self._own_folder_path(request.pool_id, request.generation, rank)
        os.environ["TMPDIR"] = own
        tempfile.tempdir = own
        return [own, self._stack_path(request.pool_id, request.generation, rank), *confine.SHARED_WRITABLE]

    def _other_ranks_files(self, request: SpawnRanks, rank: int) -> list[str]:
        """A grading rank may not read the other ranks' folders and stack files: a file one rank
        writes and another reads is communication no recorder sees (an exercise that allows only
        reduce_scatter and all_gather would be passed by ranks that swap their tensors so)."""
        if not request.writes_confined:
            return []
        others = [other for other in range(request.world_size) if other != rank]
        return ([self._own_folder_path(request.pool_id, request.generation, other) for other in others]
                + [self._stack_path(request.pool_id, request.generation, other) for other in others])

    def _stack_path(self, pool_id: str, generation: int, rank: int) -> str:
        return protocol.stack_file(os.path.dirname(self.path), pool_id, generation, rank)

    def _own_folder_path(self, pool_id: str, generation: int, rank: int) -> str:
        return os.path.join(os.path.dirname(self.path), f"tmp-{pool_id}-{generation}-{rank}")

    def reap(self) -> None:
        while self.children or self.trackers:
            try:  # look before reaping: while the rank is a zombie its group id cannot be reused
                exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if exited is None:
                return
            if exited.si_pid in self.trackers:  # it cleaned up after a generation that has ended
                self.trackers.discard(exited.si_pid)
                os.waitpid(exited.si_pid, 0)
                continue
            _kill_group(exited.si_pid)  # what the rank left running (a subprocess, a server) ends too
            pid, status = os.waitpid(exited.si_pid, 0)
            pool_id, generation, rank = self.children.pop(pid, ("", 0, -1))
            self.quotas.pop(pid, None)
            reason = self.reasons.pop(pid, "")
            if rank >= 0:
                self.end_adopted()  # what the rank started in sessions of its own came to us as it ended
                shutil.rmtree(self._own_folder_path(pool_id, generation, rank), ignore_errors=True)
                # and its stack file (read only while it lives): a grader makes thousands of ranks,
                # and each confined rank lists this folder to shut itself out of the others' files
                with contextlib.suppress(OSError):
                    os.unlink(self._stack_path(pool_id, generation, rank))
                code = os.waitstatus_to_exitcode(status)
                self._tell_kernel(RankExited(pool_id, generation, rank, pid, code, reason))

    def kill_all(self) -> None:
        for pid in list(self.children):
            _kill_group(pid)
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.children.clear()
        self.end_adopted()
        self.await_trackers()

    def await_trackers(self, seconds: float = 1.0) -> None:
        """Give the trackers of the ranks just ended the moment they need to unlink what those
        ranks left; a tracker that takes longer is killed (its names stay, nothing waits forever)."""
        deadline = time.monotonic() + seconds
        while self.trackers and time.monotonic() < deadline:
            for pid in list(self.trackers):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                self.trackers.discard(pid)
            if self.trackers:
                time.sleep(0.01)
        for pid in self.trackers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        self.trackers.clear()

    def end_adopted(self) -> None:
        """End the processes that came to the launcher when the rank that started them ended.

        Every child of the launcher that is not a live rank is one of these (see adopt_orphans).
        Killing one hands its own orphans to us in turn, so this repeats until none is left; each
        is reaped, so no zombie stays.
        """
        for _ in range(100):  # a deadline in rounds: a fork bomb cannot keep the launcher here
            adopted = [pid for pid in _children_of(os.getpid())
                       if pid not in self.children and pid not in self.trackers]
            if not adopted:
                return
            for pid in adopted:
                _kill_group(pid)
            for pid in adopted:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


@dataclasses.dataclass
class _PrivateNetwork:
    """How the ranks of one grading run meet in a network of their own (distlab.private_network):
    the first rank forked makes it and then lets the others in, one byte each through a pipe."""

    read_end: int
    write_end: int
    others: int  # ranks that wait for the first
    first: int = 0  # the first rank's pid, once it is forked

    def enter(self) -> None:
        """In a rank, right after its fork, before its first thread."""
        from distlab import private_network

        if not self.first:
            os.close(self.read_end)
            try:
                private_network.isolate()
            except OSError as exc:
                raise OSError(f"this machine gave the grading ranks no network of their own: {exc}") from exc
            os.write(self.write_end, b"." * self.others)
            os.close(self.write_end)
        else:
            os.close(self.write_end)
            if os.read(self.read_end, 1) != b".":
                raise OSError("the first rank could not make the ranks' own network")
            os.close(self.read_end)
            private_network.join(self.first)

    def close(self) -> None:
        """In the launcher, once every rank is forked: a first rank that fails is then seen by the
        others as the end of the pipe, so none waits for it for ever."""
        os.close(self.read_end)
        os.close(self.write_end)


def share_resource_tracker(write_end: int) -> None:
    """Make this process report the names it creates to the tracker behind ``write_end``, as a
    child that multiprocessing spawns does (``spawn_main`` sets the same attribute); the processes
    it starts in turn are handed that tracker by multiprocessing itself."""
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._fd = write_end  # type: ignore[attr-defined]


def _keep_only(fd: int) -> int:
    """Close every descriptor but the standard three and a copy of ``fd`` (returned), with stderr
    sent to /dev/null: a tracker must not hold the kernel's connection or a rank's store open,
    and its warnings about leftovers it cleans up are not news."""
    kept = fcntl.fcntl(fd, fcntl.F_DUPFD, 3)  # above the standard three, whatever ``fd`` was
    os.closerange(3, kept)
    os.closerange(kept + 1, os.sysconf("SC_OPEN_MAX"))
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    return kept




def _free_port() -> int:
    """A loopback port nothing listens on, for MASTER_PORT: code that makes its own rendezvous
    (``rpc.init_rpc``, ``init_process_group`` after ``destroy_process_group``) starts its own store
    there, which the port of the ranks' own store would refuse."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
    finally:
        probe.close()


def _children_of(parent: int) -> list[int]:
    """The pids whose parent is ``parent``, read from /proc (empty where there is none)."""
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended meanwhile
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry))
    return found


def _kill_group(pid: int) -> None:
    """SIGKILL a rank and every process in its group (it leads one; see _become_rank). Called only
    for a rank not yet reaped, so the group id is still this rank's."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:  # no such group after all: the rank alone
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> None:
    """``python -m distlab.launcher FOLDER``: FOLDER is the kernel's (distlab.prestart), which the
    launcher removes if the kernel dies without doing so: it is the last of the kernel's processes."""
    folder = sys.argv.pop(1) if len(sys.argv) > 1 else ""  # ranks inherit sys.argv: a script's argparse reads it
    kernel = os.getppid()
    gone = False
    try:
        gone = _serve_the_kernel(kernel)
    finally:
        if folder and (gone or os.getppid() != kernel):
            shutil.rmtree(folder, ignore_errors=True)


def _serve_the_kernel(kernel: int) -> bool:
    """Serve until the kernel stops us (False) or is gone (True)."""
    adopt_orphans()
    preload()  # first: the kernel writes where to connect meanwhile (see distlab.prestart)
    line = sys.stdin.readline()
    if not line:
        return True  # the kernel died before it said where to connect
    config = json.loads(line)
    # no PR_SET_PDEATHSIG here: it fires when the kernel *thread* that started us exits; we watch
    # the parent pid and the hub socket instead
    if os.getppid() != config["parent"] or kernel != config["parent"]:
        return True  # the kernel died before we got here
    key = bytes.fromhex(config["key"])
    try:
        conn = protocol.connect(config["path"], key)
        protocol.send(conn, LauncherHello(os.getpid()))
    except (OSError, EOFError):
        if os.getppid() != kernel:
            return True  # it died meanwhile
        raise
    return Launcher(conn, config["path"], key, config["parent"]).serve()


if __name__ == "__main__":
    main()
