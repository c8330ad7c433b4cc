"""distlab: run notebook cells and functions on real torch.distributed ranks.

``%load_ext distlab`` adds the ``%%dist`` cell magic; ``distlab.run`` does the same for plain Python.

The public names are loaded on first use (PEP 562), not when the package is imported: the
launcher, which every rank is forked from, imports ``distlab.launcher`` before torch, and every
module it does not need there would delay the first cell.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distlab.api import RunResult, run
    from distlab.errors import BackendUnavailable, CellInterrupted, DistlabError, PoolDied, RankError, RankTimeout
    from distlab.records import CallRecord

__all__ = [
    "BackendUnavailable", "CallRecord", "CellInterrupted", "DistlabError", "PoolDied", "RankError", "RankTimeout",
    "RunResult", "last_trace", "load_ipython_extension", "run", "unload_ipython_extension",
]
__version__ = "0.1.0"

_LAZY = {
    "run": "distlab.api", "RunResult": "distlab.api", "CallRecord": "distlab.records",
    **{name: "distlab.errors" for name in (
        "BackendUnavailable", "CellInterrupted", "DistlabError", "PoolDied", "RankError", "RankTimeout")},
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'distlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext distlab``: register the magics and warm up a pool in the background.

    The launcher is started first, so its torch import runs while this kernel imports the magics.
    """
    from distlab import prestart

    if not prestart.can_fork():
        from IPython.core.error import UsageError

        raise UsageError(prestart.cannot_fork())
    hub = sys.modules.get("distlab.hub")
    if hub is None or hub.Hub._current is None:  # a kernel that has a hub keeps its launcher
        prestart.start_early()
    from distlab.magic import register

    register(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from distlab.magic import unregister

    unregister(ipython)


def last_trace() -> list[list[CallRecord]] | None:
    """The per-rank call records of the last ``%%dist --trace`` cell (None before any)."""
    from distlab.magic import session

    return session().last_trace
