"""What makes a script written to start its own ranks run as a cell on ranks that already exist.

Scripts written for torchrun call ``init_process_group`` themselves; scripts written for
``mp.spawn`` (PyTorch's DDP tutorial) or for ``mp.Process`` (the tutorial "Writing Distributed
Applications with PyTorch") start one process per rank. On the ranks these processes already
exist, so each rank runs its own share itself, and says so once. Functions from modules, the fork
start method, and processes that are not one per rank start as usual (a spawned child gets the
cell's functions by value: see cellpickle).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from distlab import cellpickle
from distlab.i18n import tr


def install(rank: int, world_size: int) -> None:
    """Called once a rank has joined its process group."""
    make_reinit_harmless()
    cellpickle.install()
    make_spawn_run_here(rank, world_size)
    make_process_run_here(rank, world_size)
    make_start_method_repeatable()


def make_reinit_harmless() -> None:
    """Code written for torchrun calls init_process_group itself; the group already exists, so skip it."""
    original = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if dist.is_initialized():
            _note_skipped_init(args, kwargs)
            return None
        return original(*args, **kwargs)

    init_process_group.__doc__ = original.__doc__
    dist.init_process_group = init_process_group


def make_spawn_run_here(rank: int, world_size: int) -> None:
    """Scripts written for ``mp.spawn`` (PyTorch's DDP tutorial) call ``mp.spawn(fn, args,
    nprocs)`` (or ``mp.start_processes``) with ``fn`` defined in the cell. A spawned child cannot
    import the cell (it dies with "Can't get attribute"), and the ranks already are the processes it
    would start: so each rank runs ``fn(rank, *args)`` itself. A function from a module, or the fork
    start method, starts processes as usual."""
    spawn_module: Any = sys.modules.get("torch.multiprocessing.spawn")
    for entry in ("spawn", "start_processes"):
        original = getattr(spawn_module, entry, None)
        if original is None:  # another torch than the ones this was written for: leave it alone
            continue
        replacement = _runs_here(original, entry, rank, world_size)
        setattr(spawn_module, entry, replacement)
        setattr(torch.multiprocessing, entry, replacement)


def _runs_here(original: Any, entry: str, rank: int, world_size: int) -> Any:
    """``original`` (``mp.spawn`` or ``mp.start_processes``, which share their signature), made
    to run a cell's function on this rank instead of in new processes."""

    def runs_here(fn: Any, args: tuple[Any, ...] = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
                  start_method: str = "spawn") -> Any:
        if getattr(fn, "__module__", None) != "__main__" or start_method == "fork":
            return original(fn, args, nprocs, join, daemon, start_method)
        name = getattr(fn, "__name__", "fn")
        if nprocs != world_size:
            raise RuntimeError(tr(
                "mp.{entry}({name}, nprocs={n}) would start {n} processes on each of this cell's {w} ranks, and "
                "they could not import {name} from the cell. Run the cell with %%dist -n {n}: mp.{entry} then "
                "runs {name}(rank, ...) on the ranks themselves.", entry=entry, name=name, n=nprocs, w=world_size))
        if rank == 0:
            print(tr("distlab: mp.{entry} runs {name}(rank, ...) on this cell's {n} ranks, which already are the "
                     "processes it would start.", entry=entry, name=name, n=nprocs), file=sys.stderr)
        fn(rank, *args)
        return None if join else _SpawnedHere()

    runs_here.__doc__ = original.__doc__
    runs_here.__name__ = entry
    return runs_here


class _SpawnedHere:
    """What ``mp.spawn(..., join=False)`` returns when the function already ran on the rank."""

    def join(self, timeout: float | None = None) -> bool:
        return True

    def pids(self) -> list[int]:
        return [os.getpid()]


def _note_skipped_init(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Say so when the skipped call asked for another world size or backend than the pool has,
    because the cell will run with the pool's, not the script's."""
    backend = kwargs.get("backend", args[0] if args else None)
    world_size = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
    actual_size, actual_backend = dist.get_world_size(), str(dist.get_backend())
    wanted = []
    if isinstance(world_size, int) and world_size > 0 and world_size != actual_size:
        wanted.append(f"world_size={world_size}")
    if isinstance(backend, str) and backend and backend.lower() not in actual_backend.lower():
        wanted.append(f"backend={backend!r}")
    if wanted and dist.get_rank() == 0:
        print(tr("distlab: the ranks already form a process group ({n} ranks, {backend}), so this init_process_group call "
                 "was skipped and its {wanted} does not apply. Run the cell with %%dist -n N --backend B to change them.",
                 n=actual_size, backend=actual_backend,
                 wanted=", ".join(wanted)), file=sys.stderr)


def make_process_run_here(rank: int, world_size: int) -> None:
    """``for r in range(size): mp.Process(target=init_process, args=(r, size, run)).start()``:
    the process whose first argument is this rank's number runs here, when it is started, and the
    others are left to their own ranks. Its exception fails the cell on this rank, with its line.
    Any other process a cell starts is a real child."""
    base = multiprocessing.process.BaseProcess
    original = base.start

    def start(self: Any) -> None:
        target: Any = getattr(self, "_target", None)
        method = type(self)._start_method or multiprocessing.get_start_method()
        if method == "fork" or getattr(target, "__module__", None) != "__main__":
            return original(self)
        name = getattr(target, "__name__", "target")
        args, kwargs = tuple(self._args), dict(self._kwargs)
        shaped = len(args) >= 2 and all(isinstance(a, int) and not isinstance(a, bool) for a in args[:2])
        if not shaped or not 0 <= args[0] < args[1]:
            return original(self)  # not one process per rank: a child, which gets the target by value (cellpickle)
        if args[1] != world_size:
            raise RuntimeError(tr(
                "mp.Process({name}, args=({r}, {n}, ...)) starts rank {r} of {n}, and this cell has {w} ranks. "
                "Run the cell with %%dist -n {n}: each rank then runs {name} itself.",
                name=name, r=args[0], n=args[1], w=world_size))
        self._popen = _RanHere()
        if args[0] != rank:
            return None  # that process is another rank's
        if rank == 0:
            print(tr("distlab: mp.Process runs {name}(rank, ...) on this cell's {n} ranks, which already are the "
                     "processes it would start.", name=name, n=world_size), file=sys.stderr)
        target(*args, **kwargs)
        return None

    start.__doc__ = original.__doc__
    base.start = start  # type: ignore[method-assign]


class _RanHere:
    """Stands in for the child of an ``mp.Process`` whose function ran on its rank: it has ended."""

    returncode = 0

    def __init__(self) -> None:
        self.pid = os.getpid()

    def poll(self, flag: int = 0) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def terminate(self) -> None:
        pass

    kill = terminate

    def close(self) -> None:
        pass


def make_start_method_repeatable() -> None:
    """A script sets its start method once, in a fresh process; a rank lives on from cell to cell.
    So the second ``mp.set_start_method("spawn")`` would fail with "context has already been set",
    and so would the first after any earlier cell used a Pool, a Queue or a DataLoader (Python then
    fixes the default method for good). Asking for the method already set is a no-op here, and a
    method Python fixed by itself gives way to the one a cell asks for; changing a method a cell
    set still fails, as it should."""
    original = multiprocessing.set_start_method
    set_by_a_cell = False

    def set_start_method(method: str | None, force: bool = False) -> None:
        nonlocal set_by_a_cell
        current = multiprocessing.get_start_method(allow_none=True)
        if not force and method is not None and current == method:
            set_by_a_cell = True
            return None
        if current is not None and not set_by_a_cell:
            force = True  # Python fixed it on first use; no cell chose it
        original(method, force)
        set_by_a_cell = method is not None
        return None

    set_start_method.__doc__ = original.__doc__
    multiprocessing.set_start_method = set_start_method
    torch.multiprocessing.set_start_method = set_start_method  # type: ignore[attr-defined]
