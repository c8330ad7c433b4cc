"""IPython glue only: parse options, show rank output in the cell, let errors propagate.

All process work happens in :mod:`distlab.pool`; this module turns a notebook cell into a pool
call and the pool's outcome into what a learner sees.
"""

from __future__ import annotations

import itertools
import secrets
import shlex
import sys
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import publish_display_data

from distlab.backends import BACKENDS, resolve_backend
from distlab.between_cells import BetweenCells
from distlab.cluster import LAUNCHERS, LOCAL, ClusterLaunch, Settings, launch_for, settings_of
from distlab.errors import BackendUnavailable, CellInterrupted, PoolDied
from distlab.i18n import tr
from distlab.pool import Pool, traces_of
from distlab.records import CallRecord
from distlab.report import parse_ranks
from distlab.sink import PrintSink

DEFAULT_WORLD_SIZE = 4
MAX_WORLD_SIZE = 64
DEFAULT_TIMEOUT = 60.0


class NotebookSink(PrintSink):
    """Like PrintSink, but rich objects from ``display()`` on a rank are shown as rich output, and
    a progress line (a tqdm bar) is one output per rank, updated in place as the rank rewrites it.

    No flush per line: ipykernel sends stdout every 0.2 s and at the end of the cell, and a flush
    from here would wait for its IO thread each time.
    """

    flush_each = False
    PROGRESS_EVERY = 0.1  # seconds between updates of one progress line (tqdm's own pace)

    def __init__(self) -> None:
        super().__init__()
        self._bars: dict[tuple[int, str], tuple[str, float, str]] = {}  # (rank, stream) -> id, when, text
        self._ids = itertools.count()
        self._blank_labels: set[str] = set()  # labels of outputs a rank cleared
        self._run = secrets.token_hex(4)  # display ids stay unique across kernels and restarts

    def begin(self) -> None:
        super().begin()
        self._bars.clear()
        self._blank_labels.clear()

    def display(self, rank: int, data: dict[str, object], metadata: dict[str, object],
                display_id: str | None = None, update: bool = False) -> None:
        """A rank's display ids live in their own namespace per rank, so rank 0's "loss" and rank
        1's "loss" are two outputs, each updated in place (Jupyter updates every output with an id,
        in any cell)."""
        if not display_id:
            if not update:
                sys.stdout.write(f"{self._prefix(rank)}display:\n")
                sys.stdout.flush()
            publish_display_data(data, metadata)
            return
        shown_id = f"distlab-{self._run}-{rank}-{display_id}"
        self._label(rank, shown_id, update, blank=update and data == {"text/plain": ""})  # as clear_output sends
        publish_display_data(data, metadata, transient={"display_id": shown_id}, update=update)

    def _label(self, rank: int, shown_id: str, update: bool, blank: bool) -> None:
        """The "[rank N] display:" line above an output is an output with an id of its own, so that
        ``clear_output`` on the rank (which blanks the output) blanks its label too, and an output
        shown again in the cleared place gets it back."""
        label_id = f"{shown_id}-label"
        if not update:
            sys.stdout.flush()  # the output goes below the lines printed before it
            self._blank_labels.discard(label_id)
        elif blank == (label_id in self._blank_labels):
            return
        elif blank:
            self._blank_labels.add(label_id)
        else:
            self._blank_labels.discard(label_id)
        text = "" if blank else f"{self._prefix(rank)}display:"
        publish_display_data({"text/plain": text}, transient={"display_id": label_id}, update=update)

    def progress(self, rank: int, stream: str, text: str, final: bool) -> None:
        key = (rank, stream)
        now = time.monotonic()
        bar = self._bars.get(key)
        data = {"text/plain": f"{self._prefix(rank)}{text}"}
        if bar is None:
            sys.stdout.flush()  # the bar goes below the lines printed before it
            display_id = f"distlab-{self._run}-{next(self._ids)}"
            publish_display_data(data, transient={"display_id": display_id})
        else:
            display_id, shown_at, shown = bar
            if final and text == shown:
                self._bars.pop(key)
                return
            if not final and now - shown_at < self.PROGRESS_EVERY:
                return
            publish_display_data(data, transient={"display_id": display_id}, update=True)
        if final:
            self._bars.pop(key, None)
        else:
            self._bars[key] = (display_id, now, text)


def notebook_pool(world_size: int, backend: str, cluster: ClusterLaunch | None = None) -> Pool:
    """A pool whose ranks' output shows in the notebook, between cells too."""
    return Pool(world_size, backend, sink=NotebookSink(), cluster=cluster, between_cells=BetweenCells())


class Session:
    """The kernel's one pool and what the magics remember between cells."""

    def __init__(self) -> None:
        self.pool: Pool | None = None
        self.cluster: Settings = LOCAL
        self.last_trace: list[list[CallRecord]] | None = None
        self._cells = itertools.count(1)

    def next_filename(self) -> str:
        return f"<dist cell {next(self._cells)}>"

    def pool_for(self, world_size: int, backend: str) -> Pool:
        pool = self.pool
        if pool is not None and (pool.world_size, pool.requested_backend) == (world_size, backend) \
                and settings_of(pool.cluster) == self.cluster:
            return pool
        fresh = notebook_pool(world_size, backend, launch_for(self.cluster))
        if pool is not None and pool.used:  # a warm pool that ran nothing needs no announcement
            print(tr("distlab: restarting the pool with {n} ranks ({backend}); it had {old} ({old_backend}). "
                     "Variables on the old ranks are gone.", n=world_size, backend=fresh.backend,
                     old=pool.world_size, old_backend=pool.backend))
        self.pool = fresh
        if pool is not None:
            try:
                pool.stop()
            except KeyboardInterrupt:  # stop() ended the old ranks all the same
                raise CellInterrupted(tr("interrupted while the old ranks were stopping: they are stopped, "
                                         "nothing ran. The next cell starts {n} fresh ranks.", n=world_size)) from None
        return fresh

    def close(self) -> None:
        if self.pool is not None:
            self.pool.stop()
            self.pool = None


_session: Session | None = None


def session() -> Session:
    global _session
    if _session is None:
        _session = Session()
    return _session


def _check_world_size(value: int | None, default: int) -> int:
    if value is None:
        return default
    if not 1 <= value <= MAX_WORLD_SIZE:
        raise UsageError(tr("-n must be between 1 and {most}, got {value}", most=MAX_WORLD_SIZE, value=value))
    return value


def _check_backend(backend: str, world_size: int) -> str:
    try:
        resolve_backend(backend, world_size)
    except (ValueError, BackendUnavailable) as exc:
        raise UsageError(str(exc)) from None
    return backend


def _pool_options(magic: Any, line: str) -> tuple[int, str, Any]:
    args = parse_argstring(magic, line)
    current = session().pool
    world_size = _check_world_size(args.nprocs, current.world_size if current else DEFAULT_WORLD_SIZE)
    backend = args.backend or (current.requested_backend if current else "auto")
    launcher = getattr(args, "launcher", None) or session().cluster[0]  # %%dist has no --launcher
    if launcher != "local":  # the GPUs that count are on the nodes, not next to this kernel
        return world_size, backend, args
    return world_size, _check_backend(backend, world_size), args


@magics_class
class DistMagics(Magics):
    @magic_arguments()
    @argument("-n", "--nprocs", type=int, default=None,
              help=f"number of ranks (default: the running pool's, else {DEFAULT_WORLD_SIZE})")
    @argument("--backend", choices=BACKENDS, default=None,
              help="gloo (CPU), nccl (one GPU per rank) or auto (nccl when every rank gets a GPU)")
    @argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
              help=f"seconds before a hung cell is stopped and the pool restarted (default {DEFAULT_TIMEOUT:g})")
    @argument("--ranks", default=None, help="run only on these ranks, e.g. 0,2 or 1-3")
    @argument("--trace", action="store_true", help="record every torch.distributed call and draw a timeline")
    @cell_magic
    def dist(self, line: str, cell: str) -> None:
        """Run this cell on every rank of a torch.distributed process group.

        Each rank has ``rank``, ``world_size``, ``local_rank``, ``device``, ``torch``, ``dist`` and
        ``display``; variables persist from cell to cell. Output comes back labelled ``[rank N]``.
        A failure on any rank fails the cell; a hang is stopped after ``--timeout`` seconds (or one
        second after another rank failed), with every rank's stack, and the pool restarts.

        Examples::

            %%dist -n 4
            t = torch.tensor([rank + 1.0])
            dist.all_reduce(t)      # every rank now holds 1+2+3+4 = 10
            print(t.item())

            %%dist --ranks 0 --timeout 5
            print("only rank 0 runs this")

        On a cluster, start the pool first with ``%dist_start -n 8 --launcher slurm --iface ib0``
        (see ``%dist_start?``); every ``%%dist`` cell then runs on the ranks SLURM placed.
        """
        world_size, backend, args = _pool_options(self.dist, line)
        if not args.timeout > 0:  # nan too (a wait of nan seconds failed deep in the pool)
            raise UsageError(tr("--timeout must be positive, got {value}", value=f"{args.timeout:g}"))
        ranks = None
        if args.ranks is not None:
            try:
                ranks = parse_ranks(args.ranks, world_size)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        state = session()
        pool = state.pool_for(world_size, backend)
        dones = pool.run_cell(cell, state.next_filename(), ranks, args.timeout, args.trace)
        if args.trace:
            state.last_trace = traces_of(dones)
            from distlab.viz import show_trace

            show_trace(state.last_trace, pool.nodes)

    @magic_arguments()
    @argument("-n", "--nprocs", type=int, default=None, help="number of ranks")
    @argument("--backend", choices=BACKENDS, default=None, help="gloo, nccl or auto")
    @argument("--launcher", choices=LAUNCHERS, default=None,
              help="local (default: ranks forked next to this kernel), slurm (srun inside your "
                   "allocation starts them on its nodes) or external (prints the command any launcher "
                   "runs once per rank: python -m distlab.join)")
    @argument("--iface", default=None,
              help="with slurm/external: the network interface the kernel listens on and the ranks use "
                   "(e.g. ib0, eth0), or its subnet (e.g. 10.1.0.0/16) when nodes name it differently; "
                   "only its address is listened on")
    @argument("--srun-args", default="", help="extra srun options, e.g. \"--nodes=2 --ntasks-per-node=4\"")
    @line_magic
    def dist_start(self, line: str) -> None:
        """Start the rank pool now (the first ``%%dist`` cell does this for you).

        On a cluster, inside a SLURM allocation (``salloc -N 2 --ntasks-per-node 4``, or JupyterLab
        started in a batch job)::

            %dist_start -n 8 --launcher slurm --iface eth0

        and every later ``%%dist`` cell runs on those ranks. Any other launcher:
        ``--launcher external`` prints the command to start once per rank.
        """
        world_size, backend, args = _pool_options(self.dist_start, line)
        state = session()
        if args.launcher is not None:
            if args.launcher != "local" and not args.iface:
                raise UsageError(tr("--launcher {launcher} needs --iface: the network interface the ranks "
                                    "reach this kernel on", launcher=args.launcher))
            if args.iface:  # a mistyped name would fail every later cell: say so before anything changes
                from distlab.join import local_interface

                try:
                    local_interface(args.iface)
                except PoolDied as exc:
                    raise UsageError(str(exc)) from None
            # IPython keeps the quotes around --srun-args "..." in the value: split twice
            srun_args = tuple(shlex.split(" ".join(shlex.split(args.srun_args))))
            state.cluster = (args.launcher, args.iface or "", srun_args)
        pool = state.pool_for(world_size, backend)
        pool.ensure_ready()
        where = pool.where()
        print(tr("distlab: {n} ranks ready ({backend})", n=pool.world_size, backend=pool.backend)
              + (f": {where}" if where else ""))

    @line_magic
    def dist_stop(self, line: str) -> None:
        """Stop every rank; the next ``%%dist`` cell starts fresh ones."""
        session().close()
        print(tr("distlab: pool stopped"))

    @line_magic
    def dist_restart(self, line: str) -> None:
        """Replace every rank with a fresh one (all rank variables are lost)."""
        pool = session().pool
        if pool is None:
            raise UsageError(tr("no pool is running: run a %%dist cell or %dist_start first"))
        pool.restart()
        pool.ensure_ready()
        print(tr("distlab: pool restarted, {n} fresh ranks ({backend})", n=pool.world_size, backend=pool.backend))

    @line_magic
    def dist_status(self, line: str) -> None:
        """World size, backend, and each rank's pid and state."""
        pool = session().pool
        if pool is None:
            print(tr("distlab: no pool (the first %%dist cell starts one)"))
            return
        print(tr("distlab: {n} ranks, backend {backend}, generation {generation}, restarts {restarts}",
                 n=pool.world_size, backend=pool.backend, generation=pool.generation, restarts=pool.restarts))
        for row in pool.status():
            where = tr(" on {node}", node=row["node"]) if row.get("node") else ""
            state = str(row["state"])
            state = tr(state) if " " not in state else tr("exited ({how})", how=state.split("(", 1)[1].rstrip(")"))
            print(tr("  rank {rank}{where}: pid {pid}, {state}", rank=row["rank"], where=where, pid=row["pid"],
                     state=state))

    @magic_arguments()
    @argument("name", help="a variable defined on the ranks")
    @argument("--ranks", default=None, help="only these ranks, e.g. 0,2")
    @line_magic
    def dist_pull(self, line: str) -> list[Any]:
        """``%dist_pull NAME`` -> [NAME on rank 0, NAME on rank 1, ...] in the kernel."""
        args = parse_argstring(self.dist_pull, line)
        pool = self._running()
        ranks = self._ranks(args.ranks, pool.world_size)
        return pool.pull(args.name, ranks)

    @magic_arguments()
    @argument("names", nargs="+", help="kernel variables to copy to every rank")
    @argument("--ranks", default=None, help="only these ranks, e.g. 0,2")
    @line_magic
    def dist_push(self, line: str) -> None:
        """``%dist_push NAME`` copies a kernel variable to every rank under the same name."""
        args = parse_argstring(self.dist_push, line)
        pool = self._running()
        ranks = self._ranks(args.ranks, pool.world_size)
        user_ns = self.shell.user_ns if self.shell is not None else {}
        for name in args.names:
            if name not in user_ns:
                raise UsageError(tr("{name} is not defined in the kernel", name=repr(name)))
        for name in args.names:
            pool.push(name, user_ns[name], ranks)

    def _running(self) -> Pool:
        pool = session().pool
        if pool is None:
            raise UsageError(tr("no pool is running: run a %%dist cell or %dist_start first"))
        return pool

    @staticmethod
    def _ranks(text: str | None, world_size: int) -> tuple[int, ...] | None:
        if text is None:
            return None
        try:
            return parse_ranks(text, world_size)
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def register(ipython: Any) -> None:
    ipython.register_magics(DistMagics)
    state = session()
    if state.pool is None:  # warm up: the launcher imports torch while the learner reads
        state.pool = notebook_pool(DEFAULT_WORLD_SIZE, "auto")
        state.pool.start()


def unregister(ipython: Any) -> None:
    session().close()
