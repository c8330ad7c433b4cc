"""Functions and classes a cell defines travel by value to the processes the cell starts.

A process started with spawn or forkserver is a new Python: it finds the functions and classes it
is sent by importing them, and a rank's ``__main__`` is its cells, which no file holds. So
``get_context("spawn").Pool().map(f, ...)``, a DataLoader whose workers use spawn (macOS's
default) or ``ProcessPoolExecutor(mp_context=...)`` would fail with "Can't get attribute", or
hang. multiprocessing pickles with its ``ForkingPickler``; on a rank, that pickler sends what a
cell defined by value (cloudpickle, which the kernel already uses to ship cells' functions), and
everything else as before. This module imports no torch: a spawned child imports it to rebuild them.
"""

from __future__ import annotations

import multiprocessing.context
import multiprocessing.reduction
import sys
import types
from typing import Any

import cloudpickle


def install() -> None:
    """Make multiprocessing send cell-defined functions and classes by value (idempotent)."""
    multiprocessing.reduction.ForkingPickler.reducer_override = _by_value  # type: ignore[method-assign]


def _by_value(self: Any, obj: Any) -> Any:
    if (isinstance(obj, (types.FunctionType, type)) and getattr(obj, "__module__", None) == "__main__"
            and (not _found_by_name(obj) or _a_fresh_python_may_read_this())):
        return _rebuild, (cloudpickle.dumps(obj),)
    return NotImplemented


def _found_by_name(obj: Any) -> bool:
    """Whether pickle's by-name route works here at all: not in a spawned child, whose copies of
    the cell's classes came by value (and whose results go back to the rank)."""
    return getattr(sys.modules.get("__main__"), getattr(obj, "__qualname__", ""), None) is obj


def _a_fresh_python_may_read_this() -> bool:
    """By value costs what the function refers to (a 1 GB tensor it reads, on every task of a
    Pool): pay it only where a child could not find the object by name, that is while a spawn or
    forkserver child is being started or is alive. A forked child has the rank's ``__main__``."""
    if multiprocessing.context.get_spawning_popen() is not None:
        return True
    return any(getattr(child, "_start_method", "fork") != "fork" for child in multiprocessing.active_children())


def _rebuild(blob: bytes) -> Any:
    install()  # a child sends instances of the cell's classes back to its rank the same way
    return cloudpickle.loads(blob)
