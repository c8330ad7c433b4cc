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

import multiprocessing.reduction
import types
from typing import Any

import cloudpickle


def install() -> None:
    """Make multiprocessing send cell-defined functions and classes by value (idempotent)."""
    multiprocessing.reduction.ForkingPickler.reducer_override = _by_value  # type: ignore[method-assign]


def _by_value(self: Any, obj: Any) -> Any:
    if isinstance(obj, (types.FunctionType, type)) and getattr(obj, "__module__", None) == "__main__":
        return _rebuild, (cloudpickle.dumps(obj),)
    return NotImplemented


def _rebuild(blob: bytes) -> Any:
    install()  # a child sends instances of the cell's classes back to its rank the same way
    return cloudpickle.loads(blob)
