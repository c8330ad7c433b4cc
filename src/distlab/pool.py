"""A set of persistent rank processes and the one loop that waits for them.

Plain Python, no IPython: the magic, ``distlab.run`` and the grader all use it. Every wait has a
deadline. When a rank fails while others are still busy, the others get a short grace; if they
are still stuck after it, they are hung in a collective: their stacks are taken, every rank is
killed (by pid, through the launcher that forked them) and a fresh generation is started.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal

import cloudpickle

from distlab import codeship, follow, protocol
from distlab.backends import resolve_backend
from distlab.between_cells import BetweenCells
from distlab.cluster import ClusterLaunch
from distlab.confine import QUOTA_ENTRIES, WRITE_QUOTA
from distlab.errors import CellInterrupted, PoolDied, RankError, RankTimeout, TransferFailed
from distlab.hub import Hub
from distlab.i18n import tr
from distlab.protocol import Display, Done, FailureKind, KillGeneration, Output, RankFailure, RankReady, SpawnRanks
from distlab.records import CallRecord
from distlab.report import format_failures, format_stacks, rank_label
from distlab.sink import PrintSink, Sink

START_TIMEOUT = 120.0
HANG_GRACE = 1.0        # how long other ranks may keep running after one failed
INTERRUPT_GRACE = 2.0   # how long ranks get to stop after an interrupt
STACK_WAIT = 1.0
EXIT_CODE_WAIT = 1.0


def placement(nodes: dict[int, str]) -> dict[int, tuple[int, int, int]]:
    """Each rank's (node rank, local rank, local world size) from the host each rank runs on:
    hosts in order of their lowest rank, ranks on a host in rank order (torchrun's numbering)."""
    hosts = list(dict.fromkeys(nodes[rank] for rank in sorted(nodes)))
    places = {}
    for rank, node in nodes.items():
        neighbours = sorted(r for r, other in nodes.items() if other == node)
        places[rank] = (hosts.index(node), neighbours.index(rank), len(neighbours))
    return places


@contextlib.contextmanager
def stop_button_held() -> Iterator[list[bool]]:
    """While a task's bytes go out, a press of the stop button waits: a KeyboardInterrupt raised
    between two writes would leave half a message in a rank's channel, and ranks running a task
    the kernel no longer waits for. The yielded list says whether it was pressed (and how often);
    the caller hands the press on. (Only the main thread can hold it: elsewhere nothing changes.)"""
    pressed: list[bool] = []
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield pressed
        return
    signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(True))
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class RankHandle:
    rank: int
    conn: Connection
    pid: int
    ready: bool = False
    busy: bool = False


class Pool:
    """``world_size`` ranks joined in one process group; start() is quick, work waits for readiness."""

    def __init__(self, world_size: int, backend: str = "auto", hub: Hub | None = None,
                 sink: Sink | None = None, eager_restart: bool = True,
                 cluster: ClusterLaunch | None = None, unreadable: Sequence[str] = (),
                 memory_limit: int = 0, confine_writes: bool = False,
                 between_cells: BetweenCells | None = None) -> None:
        """``unreadable``: folders the ranks may never read files from; ``memory_limit``: bytes of
        data each rank may hold (0: no limit). The grader's, for ranks forked here: see
        :mod:`distlab.confine`. ``between_cells``: show what ranks print between tasks as it comes
        (in a kernel; see :mod:`distlab.between_cells`)."""
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self.requested_backend = backend
        self.cluster = cluster  # None: ranks forked here by the kit's launcher
        self.unreadable = tuple(unreadable)
        self.memory_limit = memory_limit
        self.confine_writes = confine_writes
        # on a cluster the kernel cannot count the nodes' GPUs: "auto" means gloo there
        self.backend = resolve_backend(backend, world_size) if cluster is None else (
            "nccl" if backend == "nccl" else "gloo")
        self.nodes: dict[int, str] = {}
        if cluster is not None and backend == "auto":
            print(tr("distlab: on a cluster this kernel cannot see the nodes' GPUs, so the ranks use gloo; "
                     "--backend nccl gives each rank the GPU of its SLURM_LOCALID."), flush=True)
        self.hub = hub or Hub.get()
        self.sink: Sink = sink or PrintSink()
        self.pool_id = secrets.token_hex(4)
        self.generation = 0
        self.handles: dict[int, RankHandle] = {}
        self.started = False
        self._tasks = itertools.count(1)
        self.restarts = 0
        self.eager_restart = eager_restart  # start the next generation right after a failure
        self.used = False  # has any task run on this pool (so its ranks may hold state)?
        self._ungrouped: set[int] = set()  # ranks whose last task destroyed their process group
        self._regroups = 0
        self.between_cells = between_cells

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.started:
            return
        if not self.hub.alive():
            self.hub = Hub.get()
        self.generation += 1
        self.handles = {}
        self._ungrouped = set()
        self._rendezvous_sent = False
        if self.cluster is None:
            self.hub.send_launcher(SpawnRanks(self.pool_id, self.generation, self.world_size, self.backend,
                                              tuple(range(self.world_size)), self.unreadable, self.memory_limit,
                                              self.confine_writes, WRITE_QUOTA if self.confine_writes else 0))
        else:
            hub = self.hub.listen_tcp(self.cluster.address())
            env = self.cluster.environment(hub, self.hub.key, self.pool_id, self.generation, self.backend,
                                           os.environ.get("DISTLAB_KEY_DIR") or os.path.expanduser("~/.distlab"))
            note = self.cluster.start(self.world_size, env, self._srun_log())
            if note:
                print(note, flush=True)
        self.started = True

    def _send_rendezvous(self) -> None:
        """Joined ranks: once all have said hello, tell each where rank 0's TCPStore listens."""
        hellos = self.hub.hellos(self.pool_id, self.generation)
        self.nodes = {rank: hello.node for rank, hello in hellos.items()}
        if hasattr(self.sink, "nodes"):
            self.sink.nodes = dict(self.nodes)  # output lines say which host printed them
        refusals = sorted({hello.nccl_refusal for hello in hellos.values() if hello.nccl_refusal})
        if refusals:  # all ranks must agree, so all move to gloo; the next generations start there
            self.backend = "gloo"
            print(tr("distlab: NCCL needs one GPU per rank, and a node has fewer ({nodes}): the ranks use gloo instead.",
                     nodes="; ".join(refusals)), flush=True)
        address, _, port = hellos[0].store.rpartition(":")
        places = placement(self.nodes)
        for rank, handle in self.handles.items():
            node_rank, local_rank, local_world_size = places[rank]
            protocol.send(handle.conn, protocol.Rendezvous(address, int(port), self.backend,
                                                           node_rank, local_rank, local_world_size))
        self._rendezvous_sent = True

    def _srun_log(self) -> str:
        """srun's own output, one file per generation (an old srun may still be ending)."""
        return os.path.join(self.hub.dir, f"srun-{self.pool_id}-{self.generation}.log")

    def _cluster_log(self) -> str:
        """What srun said for this generation, and which of the ranks' last nodes SLURM holds down."""
        try:
            with open(self._srun_log(), errors="replace") as log:
                said = log.read()[-4000:]
        except OSError:
            said = ""
        lost = self.cluster.down(list(self.nodes.values())) if self.cluster is not None else ""
        if lost:
            said = "\n".join(filter(None, [said.rstrip("\n"), tr("the allocation lost node {nodes}", nodes=lost)]))
        return said

    def ensure_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Start the ranks if need be and wait until every one is ready. An interrupt here says
        in one line that nothing ran (not distlab's own traceback); locally the ranks go on
        starting, so the next cell finds them sooner; on a cluster the request is withdrawn."""
        try:
            self.start()
            if self.cluster is None:
                self._wait_ready(timeout)
                return
            try:  # an interrupted or failed start leaves nothing queued or running on the cluster
                self._wait_ready(timeout)
            except BaseException:
                if not all(h.ready for h in self.handles.values()) or len(self.handles) < self.world_size:
                    self._kill()
                raise
        except CellInterrupted:
            raise
        except KeyboardInterrupt:
            if self.cluster is not None:  # the request was withdrawn above
                raise CellInterrupted(tr("interrupted while the ranks were starting: nothing ran, and nothing is "
                                         "left queued or running. The next cell starts them again.")) from None
            raise CellInterrupted(tr("interrupted while the ranks were starting: nothing ran on them. "
                                     "The next cell waits for them again.")) from None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        said_pending, said_lost, next_look = "", "", time.monotonic() + 2.0
        errors: dict[int, str] = {}
        while not all(h.ready for h in self.handles.values()) or len(self.handles) < self.world_size:
            for rank, (conn, pid) in self.hub.take_arrivals(self.pool_id, self.generation).items():
                self.handles[rank] = RankHandle(rank, conn, pid)
            if self.cluster is not None and not self._rendezvous_sent and len(self.handles) == self.world_size:
                self._send_rendezvous()
            if self.cluster is not None and self.cluster.exited() is not None:
                detail = self._cluster_log()
                self._kill()
                raise PoolDied(tr("the ranks could not start their process group ({backend}):\n{detail}",
                                  backend=self.backend, detail=detail))
            if self.cluster is not None and not self.handles and time.monotonic() > next_look:
                next_look = time.monotonic() + 5.0
                pending = self.cluster.pending()
                if pending and pending != said_pending:
                    print(tr("distlab: SLURM has not started the ranks yet: {pending}. Waiting; interrupt "
                             "the cell to withdraw the request.", pending=pending), flush=True)
                    said_pending = pending
                lost = self.cluster.down(list(self.nodes.values())) if pending else ""
                if lost and lost != said_lost:
                    print(tr("distlab: the allocation lost node {nodes}: SLURM starts no rank there until it is "
                             "back (or ask for other nodes with %dist_start --srun-args).", nodes=lost), flush=True)
                    said_lost = lost
            waiting = [h.conn for h in self.handles.values() if not h.ready]
            for conn in self.hub.wait(waiting, 0.05):
                handle = next(h for h in self.handles.values() if h.conn is conn)
                try:
                    message = protocol.recv(conn)
                except (EOFError, OSError):
                    errors.setdefault(handle.rank, "the rank closed its connection while starting")
                    continue
                if isinstance(message, RankReady):
                    if message.error:
                        errors[handle.rank] = message.error
                    handle.ready = not message.error
                else:
                    self.show(handle.rank, message)
            exits = self.hub.exits(self.pool_id, self.generation)
            if errors or exits or not self.hub.alive():
                self._kill()
                detail = "\n".join(f"rank {r}: {text}" for r, text in sorted(errors.items()))
                detail += "".join(f"\nrank {r} exited with code {c}" for r, c in sorted(exits.items()))
                detail += "".join(f"\n{line}" for line in protocol.early_failures(  # why, if they said
                    self.hub.launcher_log(), self.pool_id, self.generation))
                if self.cluster is not None:  # srun says why (a task launch failed on a node, ...)
                    detail += "\n" + self._cluster_log()
                raise PoolDied(tr("the ranks could not start their process group ({backend}):\n{detail}",
                                  backend=self.backend, detail=detail or self.hub.launcher_log()))
            if time.monotonic() > deadline:
                detail = self._cluster_log() if self.cluster is not None else ""
                self._kill()
                raise PoolDied(tr("the ranks did not start within {seconds} s", seconds=f"{timeout:.0f}")
                               + (f"\n{detail}" if detail else ""))

    def stop(self) -> None:
        """Ask ranks to leave; kill any that do not within a second."""
        if not self.started:
            return
        for handle in self.handles.values():
            try:
                protocol.send(handle.conn, protocol.Stop())
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        try:
            while time.monotonic() < deadline and self.hub.alive():
                if len(self.hub.exits(self.pool_id, self.generation)) >= len(self.handles):
                    break
                self.hub.wait([], 0.02)
        finally:  # interrupted while they leave: they end all the same
            self._kill()

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def _kill(self, wait: bool = True) -> None:
        """End this generation's ranks; on a cluster ``wait=False`` leaves srun's end to the
        background (a failed cell should not wait for it)."""
        if self.cluster is not None:
            for control in self.hub.controls(self.pool_id, self.generation).values():
                try:
                    protocol.send(control, protocol.Control("exit"))
                except OSError:
                    pass
            self.cluster.stop(wait)
        elif self.started and self.hub.alive():
            try:
                self.hub.send_launcher(KillGeneration(self.pool_id, self.generation))
            except PoolDied:
                pass
        self._pause_between_cells()
        for handle in self.handles.values():
            handle.conn.close()
        self.handles = {}
        self.hub.forget(self.pool_id, self.generation)
        self.started = False

    def where(self, ranks: Sequence[int] | None = None) -> str:
        """On a cluster: which node each rank runs on, "ranks 0-1 on node a; ..." ("" on one machine)."""
        by_node: dict[str, list[int]] = {}
        for rank in sorted(set(range(self.world_size) if ranks is None else ranks)):
            by_node.setdefault(self.nodes.get(rank, "?"), []).append(rank)
        if not self.nodes or not by_node:
            return ""
        return "; ".join(tr("{ranks} on node {node}", ranks=rank_label(rs), node=node) for node, rs in by_node.items())

    def status(self) -> list[dict[str, Any]]:
        exits = self.hub.exits(self.pool_id, self.generation) if self.started else {}
        rows = []
        for rank in range(self.world_size):
            handle = self.handles.get(rank)
            state = "stopped" if not self.started else "starting"
            if handle is not None:
                state = "busy" if handle.busy else "idle" if handle.ready else "starting"
            if rank in exits:
                state = f"exited ({exits[rank]})"
            row = {"rank": rank, "pid": handle.pid if handle else None, "state": state}
            if self.cluster is not None:
                row["node"] = self.nodes.get(rank, "")
            rows.append(row)
        return rows

    # --- work ---------------------------------------------------------------------------------
    def run_cell(self, source: str, filename: str, ranks: Sequence[int] | None = None,
                 timeout: float = 60.0, trace: bool = False) -> dict[int, Done]:
        cell_lines = {filename: source.splitlines()}
        context = self._kernel_context()
        return self.execute(lambda t: protocol.RunCell(t, source, filename, trace, context), ranks, timeout,
                            cell_lines)

    def call(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
             timeout: float = 60.0, trace: bool = False) -> dict[int, Done]:
        files, sources = codeship.describe(fn)
        try:
            payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}), files, sources))
        except Exception as exc:  # noqa: BLE001 - whatever pickling raises, the learner's news is the same
            raise TransferFailed.to_ranks(tr("the function or its arguments"), exc) from None
        context = self._kernel_context()
        return self.execute(lambda t: protocol.RunFunction(t, payload, trace, context), None, timeout)

    def _kernel_context(self) -> protocol.KernelContext:
        """What the ranks follow of the kernel (distlab.follow). Grading ranks get the import path
        alone: a grade must not depend on the folder or variables the notebook's kernel was left with."""
        if self.confine_writes:
            return protocol.KernelContext(sys_path=follow.import_path())
        return follow.capture(self.hub.launcher_environ)

    def pull(self, name: str, ranks: Sequence[int] | None = None, timeout: float = 60.0) -> list[Any]:
        return values_of(self.execute(lambda t: protocol.Pull(t, name), ranks, timeout))

    def push(self, name: str, value: Any, ranks: Sequence[int] | None = None, timeout: float = 60.0) -> None:
        try:
            payload = cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - as in call()
            raise TransferFailed.to_ranks(tr("the value of {name!r}", name=name), exc) from None
        context = self._kernel_context()  # a value of a module beside the notebook unpickles there
        self.execute(lambda t: protocol.Push(t, name, payload, context), ranks, timeout)

    def execute(self, make_task: Callable[[int], protocol.Task], ranks: Sequence[int] | None,
                timeout: float, cell_lines: dict[str, list[str]] | None = None) -> dict[int, Done]:
        """Run one task on ``ranks``; every rank's Done, or the outcome's error raised."""
        outcome = self.submit(make_task, ranks, timeout, cell_lines)
        error = outcome.error()
        if error is not None:
            raise error
        return outcome.dones

    def submit(self, make_task: Callable[[int], protocol.Task], ranks: Sequence[int] | None,
               timeout: float, cell_lines: dict[str, list[str]] | None = None) -> Outcome:
        """Send one task to ``ranks`` (all by default) and wait for every one of them, with a deadline."""
        self._pause_between_cells()
        try:
            return self._submit(make_task, ranks, timeout, cell_lines)
        finally:
            self._watch_between_cells()

    def _submit(self, make_task: Callable[[int], protocol.Task], ranks: Sequence[int] | None,
                timeout: float, cell_lines: dict[str, list[str]] | None) -> Outcome:
        self.ensure_ready()
        self.used = True
        if self._ungrouped:  # a cell destroyed the group (scripts end so): every rank joins a new one first
            self._regroup(timeout)
        targets = sorted(set(ranks)) if ranks is not None else list(range(self.world_size))
        generation = self.generation
        task_id = next(self._tasks)
        message = protocol.encode(make_task(task_id))
        begin = getattr(self.sink, "begin", None)
        if begin:
            begin()
        waiter = _Waiter(self, task_id, targets)
        with stop_button_held() as pressed:
            for rank in targets:
                try:
                    self.handles[rank].conn.send_bytes(message)
                    self.handles[rank].busy = True
                except OSError:
                    waiter.lost[rank] = None
                    waiter.pending.discard(rank)
        for _ in pressed:
            waiter.press_stop()
        try:
            waiter.wait(timeout)
        finally:
            self._end_sink()
            for handle in self.handles.values():
                handle.busy = False
        outcome = waiter.outcome(timeout, cell_lines or {})
        if self.generation == generation:  # (after a restart every rank has a fresh group)
            self._ungrouped |= {rank for rank, done in outcome.dones.items() if not done.grouped}
        return outcome

    def _regroup(self, timeout: float) -> None:
        """Rebuild the process group on every rank, even when the next task runs on a few: a new
        group needs all of them, and ranks that kept the old one must leave it too."""
        self._ungrouped = set()
        self._regroups += 1
        regroup = self._regroups
        error = self._submit(lambda t: protocol.Regroup(t, regroup), None, timeout, None).error()
        if error is not None:
            raise error

    def _watch_between_cells(self) -> None:
        if self.between_cells is not None and self.started:
            ready = {rank: handle.conn for rank, handle in self.handles.items() if handle.ready}
            self.between_cells.watch(ready, self.show, self.refused)

    def _pause_between_cells(self) -> None:
        """Before the next task reads the connections: stop watching, and end the lines that
        were left unfinished between cells (the task's sink starts afresh)."""
        if self.between_cells is None:
            return
        self.between_cells.pause()
        if self.between_cells.seen:
            self.between_cells.seen = False
            self._end_sink()

    def _end_sink(self) -> None:
        """Show what the sink still holds (unfinished lines, kept tails): a task or an idle spell ended."""
        end = getattr(self.sink, "end", None)
        if end:
            end()

    # --- used by the waiter -------------------------------------------------------------------
    def show(self, rank: int, message: protocol.Message) -> None:
        """A rank's output or display, whenever it comes (a task's Done is the waiter's)."""
        if isinstance(message, Output):
            self.sink.output(rank, message.stream, message.text)
        elif isinstance(message, Display):
            self.sink.display(rank, message.data, message.metadata, message.display_id, message.update)

    def refused(self, rank: int, why: Exception) -> None:
        """A message the kernel would not unpickle: the rank goes on; the cell says what was dropped."""
        self.sink.output(rank, "stderr", tr("distlab: the kernel refused a message from rank {rank} ({why})",
                                            rank=rank, why=why) + "\n")

    def interrupt(self, task: int, ranks: Sequence[int]) -> None:
        """The stop button, for the ranks still running ``task``: a Cancel naming the task first,
        then the signal. A rank the signal reaches before it has begun the task reads the Cancel
        when it does, and stops there (see protocol.Cancel)."""
        message = protocol.encode(protocol.Cancel(task))
        for rank in ranks:
            handle = self._open_handle(rank)
            if handle is None:
                continue
            try:
                handle.conn.send_bytes(message)
            except OSError:  # gone: the wait notices
                pass
        self.signal_ranks(ranks, signal.SIGINT)

    def _open_handle(self, rank: int) -> RankHandle | None:
        """The rank's handle while its connection is open (a rank that died closed it)."""
        handle = self.handles.get(rank)
        return None if handle is None or handle.conn.closed else handle

    def signal_ranks(self, ranks: Sequence[int], signum: int) -> None:
        """Signal our own ranks directly, without a hop through the launcher (which may be busy).

        Only ranks whose connection is still open are signalled: a rank that died closed it, so a
        recycled pid is never hit.
        """
        if self.cluster is not None:  # on other hosts: ask through each rank's control connection
            controls = self.hub.controls(self.pool_id, self.generation)
            for rank in ranks:
                if rank in controls and signum == signal.SIGINT:
                    try:
                        protocol.send(controls[rank], protocol.Control("interrupt"))
                    except OSError:
                        pass
            return
        for rank in ranks:
            handle = self._open_handle(rank)
            if handle is None:
                continue
            try:
                if protocol.waiting(handle.conn) and not _still_open(handle.conn):
                    continue
                os.kill(handle.pid, signum)
            except (ProcessLookupError, OSError):
                pass

    def take_stacks(self, ranks: Sequence[int]) -> dict[int, str]:
        """Every listed rank's Python stack, dumped by faulthandler on SIGUSR1."""
        if self.cluster is not None:
            return self._remote_stacks(ranks)
        paths = {r: self.hub.stack_path(self.pool_id, self.generation, r) for r in ranks}
        for path in paths.values():
            open(path, "w").close()
        self.signal_ranks(ranks, signal.SIGUSR1)
        deadline = time.monotonic() + STACK_WAIT
        sizes: dict[int, int] = {}
        while time.monotonic() < deadline:
            self.hub.wait([], 0.03)
            now = {r: _size(p) for r, p in paths.items()}
            if all(now.values()) and now == sizes:
                break
            sizes = now
        stacks = {}
        for rank, path in paths.items():
            with open(path, errors="replace") as dump:
                stacks[rank] = dump.read()
            handle = self.handles.get(rank)
            if not stacks[rank].strip() and handle is not None:  # no answer: say what holds the process
                stacks[rank] = _why_silent(handle.pid)
        return stacks

    def _remote_stacks(self, ranks: Sequence[int]) -> dict[int, str]:
        controls = self.hub.controls(self.pool_id, self.generation)
        asked = {}
        for rank in ranks:
            if rank in controls:
                try:
                    protocol.send(controls[rank], protocol.Control("stack"))
                    asked[rank] = controls[rank]
                except OSError:
                    pass
        stacks = {rank: "" for rank in ranks}
        deadline = time.monotonic() + STACK_WAIT
        while asked and time.monotonic() < deadline:
            for conn in self.hub.wait(list(asked.values()), 0.05):
                rank = next(r for r, c in asked.items() if c is conn)
                del asked[rank]
                try:
                    message = protocol.recv(conn)
                except (EOFError, OSError):
                    continue
                if isinstance(message, protocol.Stack):
                    stacks[rank] = message.text
        return stacks

    def fresh_start(self) -> str:
        """Kill every rank and start a new generation; returns the sentence that says so."""
        self._kill(wait=False)
        self.restarts += 1
        if self.eager_restart:
            self.start()
        return tr("Rank state was lost: every rank was stopped and the pool restarted with {n} fresh "
                  "ranks ({backend}).", n=self.world_size, backend=self.backend)


def values_of(dones: dict[int, Done]) -> list[Any]:
    """Each rank's returned value, in rank order. The one place the kernel unpickles a rank's
    result: only bytes it asked for, from ranks that proved they hold the pool's key."""
    values = []
    for rank in sorted(dones):
        data = dones[rank].value
        try:
            values.append(pickle.loads(data) if data is not None else None)
        except Exception as exc:  # noqa: BLE001 - any failure to rebuild it is the same news to the learner
            raise TransferFailed.not_rebuilt(rank, exc) from None
    return values


def traces_of(dones: dict[int, Done]) -> list[list[CallRecord]]:
    """Each rank's recorded torch.distributed calls (``--trace``), in rank order."""
    traces = [dones[r].trace for r in sorted(dones)]
    return [pickle.loads(trace) if trace else [] for trace in traces]


def _still_open(conn: Connection) -> bool:
    """False when the peer has closed: a zero-byte read on the socket, without consuming data."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    finally:
        sock.close()


_SILENT_STATES = {
    "T": "the rank process is stopped (SIGSTOP, Ctrl-Z or a debugger holds it)",
    "t": "the rank process is stopped (SIGSTOP, Ctrl-Z or a debugger holds it)",
    "D": "the rank process waits in the operating system (disk or network file system I/O)",
    "Z": "the rank process has exited",
}


def _why_silent(pid: int) -> str:
    """What the OS says of a rank that did not dump its stack (Linux: /proc/PID/stat), or ""."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    template = _SILENT_STATES.get(state)
    return f"({tr(template)})" if template else ""


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class _Waiter:
    """The wait for one task: collects results, notices failures, crashes and interrupts."""

    def __init__(self, pool: Pool, task_id: int, targets: list[int]) -> None:
        self.pool = pool
        self.task_id = task_id
        self.pending = set(targets)
        self.dones: dict[int, Done] = {}
        self.lost: dict[int, int | None] = {}
        self.first_bad: float | None = None
        self.interrupted_at: float | None = None
        self.pressed_twice = False
        self.reason = ""

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.pending:
            now = time.monotonic()
            end = deadline
            if self.first_bad is not None:
                end = min(end, self.first_bad + HANG_GRACE)
            if self.interrupted_at is not None:
                end = min(end, self.interrupted_at + INTERRUPT_GRACE)
            if now >= end:
                self.reason = "deadline" if end == deadline else "grace"
                return
            if self.pressed_twice:
                return  # a second interrupt: stop waiting at once
            try:
                self._pump(min(end - now, 0.25))
            except KeyboardInterrupt:
                self.press_stop()
            if self.first_bad is None and (self.lost or any(d.failure for d in self.dones.values())):
                self.first_bad = time.monotonic()

    def press_stop(self) -> None:
        """The first press stops the ranks still running (they get INTERRUPT_GRACE); the second
        ends the wait at once."""
        if self.interrupted_at is not None:
            self.pressed_twice = True
            return
        self.interrupted_at = time.monotonic()
        self.pool.interrupt(self.task_id, sorted(self.pending))

    def _pump(self, timeout: float) -> None:
        pool = self.pool
        conns = {pool.handles[r].conn: r for r in self.pending}
        for conn in pool.hub.wait(list(conns), timeout):
            rank = conns[conn]
            try:
                while rank in self.pending and protocol.waiting(conn):
                    self._handle(rank, protocol.recv(conn))
            except (EOFError, OSError):
                self.lost[rank] = None
                self.pending.discard(rank)
            except pickle.UnpicklingError as exc:
                pool.refused(rank, exc)
        exits = pool.hub.exits(pool.pool_id, pool.generation)
        for rank in list(self.pending):
            if rank in exits:
                self.lost[rank] = exits[rank]
                self.pending.discard(rank)

    def _handle(self, rank: int, message: protocol.Message) -> None:
        if isinstance(message, Done):
            if message.task == self.task_id:
                self.dones[rank] = message
                self.pending.discard(rank)
        else:
            self.pool.show(rank, message)

    def _exit_codes(self) -> None:
        pool = self.pool
        deadline = time.monotonic() + EXIT_CODE_WAIT
        while any(code is None for code in self.lost.values()) and time.monotonic() < deadline:
            pool.hub.wait([], 0.02)
            exits = pool.hub.exits(pool.pool_id, pool.generation)
            for rank in self.lost:
                if self.lost[rank] is None and rank in exits:
                    self.lost[rank] = exits[rank]

    def outcome(self, timeout: float, cell_lines: dict[str, list[str]]) -> Outcome:
        """What the task came to. Ranks still running are stopped here (their stacks taken first)
        and, like lost ranks, replaced by a fresh generation: the only place a task restarts the pool."""
        pool = self.pool
        failures = [d.failure for r, d in sorted(self.dones.items()) if d.failure is not None]
        where = pool.where([f.rank for f in failures] + list(self.lost) + list(self.pending))
        if self.lost:
            self._exit_codes()
            remote = pool.cluster is not None
            launcher_gone = not remote and not pool.hub.alive()
            failures += [crash_failure(rank, code, remote, launcher_gone,
                                       pool.hub.exit_reason(pool.pool_id, pool.generation, rank))
                         for rank, code in sorted(self.lost.items())]
            failures.sort(key=lambda f: f.rank)
        stuck = sorted(self.pending)
        stacks = pool.take_stacks(stuck) if stuck else {}
        restarted = pool.fresh_start() if stuck or self.lost else ""
        note = "\n".join(filter(None, [where if failures or stuck else "", restarted]))
        if self.interrupted_at is not None:
            status: Status = "interrupted"
        elif stuck:
            status = "timed_out" if self.reason == "deadline" and not failures else "hung"
        elif self.lost:
            status = "lost"
        else:
            status = "failed" if failures else "finished"
        return Outcome(status, pool.world_size, self.dones, failures, stacks, note, cell_lines, timeout,
                       self.pressed_twice)


Status = Literal["finished", "failed", "lost", "hung", "timed_out", "interrupted"]


@dataclass
class Outcome:
    """What one task came to on the ranks it was sent to: the one value a wait returns.

    ``finished``: every rank returned. ``failed``: some raised. ``lost``: some rank's process or
    connection went away (the pool was restarted). ``hung``: ranks were still waiting after
    another failed, and ``timed_out``: the deadline passed with ranks still running (their
    ``stacks`` say where; restarted). ``interrupted``: the user pressed stop.
    """

    status: Status
    world_size: int
    dones: dict[int, Done]
    failures: list[RankFailure]
    stacks: dict[int, str]  # every rank still running when the wait ended -> its stack ("": no answer)
    note: str = ""  # which node each involved rank ran on, and the restart, if any
    cell_lines: dict[str, list[str]] = field(default_factory=dict)
    timeout: float = 0.0
    pressed_twice: bool = False  # interrupted again before the ranks' grace ran out

    def error(self) -> RankError | RankTimeout | CellInterrupted | None:
        """The exception that renders this outcome in a notebook (None when it finished)."""
        stuck = sorted(self.stacks)
        failed = format_failures(self.failures) if self.failures else ""
        if self.status == "interrupted":
            if not stuck:
                return CellInterrupted(tr("interrupted: every rank stopped"),
                                       "\n".join(filter(None, [failed, self.note])))
            report = format_stacks(self.stacks, self.cell_lines)
            one = len(stuck) == 1
            if self.pressed_twice:
                template = ("interrupted twice; {ranks} was killed at once" if one
                            else "interrupted twice; {ranks} were killed at once")
            else:
                template = ("interrupted; {ranks} did not stop within {grace} s and was killed" if one
                            else "interrupted; {ranks} did not stop within {grace} s and were killed")
            said = tr(template, ranks=rank_label(stuck), grace=f"{INTERRUPT_GRACE:.0f}")
            return CellInterrupted(
                said,
                "\n".join(filter(None, [failed, report, self.note])))
        if self.status == "timed_out":
            reason = tr("the cell ran past its {timeout} s deadline: {ranks} still running "
                        "(a deadlock, or raise --timeout)", timeout=f"{self.timeout:g}", ranks=rank_label(stuck))
            reason += self._subset_hint()
            return RankTimeout.hung(reason, self.stacks, self.failures, self.cell_lines, self.note)
        if self.status == "hung":
            bad = sorted({f.rank for f in self.failures})
            template = ("{bad} failed and {stuck} hung waiting for it (stopped {grace} s later)" if len(bad) == 1
                        else "{bad} failed and {stuck} hung waiting for them (stopped {grace} s later)")
            reason = tr(template, bad=rank_label(bad), stuck=rank_label(stuck), grace=f"{HANG_GRACE:g}")
            return RankTimeout.hung(reason, self.stacks, self.failures, self.cell_lines, self.note)
        if self.failures:
            return RankError.from_failures(self.failures, self.world_size, self.note)
        return None

    def _subset_hint(self) -> str:
        """``--ranks 0`` with a collective on the default group waits for ranks that never run the
        cell: the commonest deadlock of the option, and the stack alone does not say why."""
        ran = set(self.dones) | set(self.stacks) | {f.rank for f in self.failures}
        if len(ran) >= self.world_size or not any("distributed_c10d" in s for s in self.stacks.values()):
            return ""
        absent = sorted(set(range(self.world_size)) - ran)
        return "\n" + tr("Only {ran} ran this cell (--ranks), and a collective on the default group also waits for "
                         "{absent}. Make a group of the ranks that run it in a cell every rank runs "
                         "(g = dist.new_group([...])) and pass group=g.",
                         ran=rank_label(sorted(ran)), absent=rank_label(absent))


def crash_failure(rank: int, code: int | None, remote: bool = False, launcher_gone: bool = False,
                  reason: str = "") -> RankFailure:
    """A rank that went away mid-task. On another host the kernel learns no exit status: all it
    sees is its connection closed, or (a dead node, a cut network) timed out. Here, a rank whose
    launcher died ends with it (and no one is left to report its status)."""
    if reason == protocol.WRITE_QUOTA_EXCEEDED:
        message = tr("the rank kept more than {mb} MB of files in its temporary folder (or over {entries} files), "
                     "more than a grading rank may, and was stopped", mb=WRITE_QUOTA >> 20, entries=f"{QUOTA_ENTRIES:,}")
    elif code is None and launcher_gone:
        message = tr("the rank ended with its launcher (the process that forks the ranks), which was killed "
                     "or crashed; fresh ranks start with a new one")
    elif code is None and remote:
        message = tr("the kernel lost its connection to the rank: its process ended, or its node or the "
                     "network to it went down")
    elif code is None:
        message = tr("the rank process ended (exit status unknown)")
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        message = tr("the rank process was killed by {signal}", signal=name)
    else:
        message = tr("the rank process exited with code {code}", code=code)
    shown = ""
    if code == -signal.SIGKILL:  # nothing here sends it mid-cell: a person, or the kernel's OOM killer
        shown = f"RankCrashed: {message}\n" + tr(
            "(If no one killed it, the usual cause is Linux's out-of-memory killer: the ranks together needed "
            "more memory than this machine or container has, and each rank holds its own copy of what a cell "
            "makes. Use smaller tensors or fewer ranks; the next cell starts fresh ranks.)") + "\n"
    return RankFailure(rank, "RankCrashed", message, traceback=shown, exitcode=code if code is not None else -1,
                       kind=FailureKind.CRASHED)
