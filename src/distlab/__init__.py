"""distlab: run notebook cells and functions on real torch.distributed ranks.

``%load_ext distlab`` adds the ``%%dist`` cell magic; ``distlab.run`` does the same for plain Python.
"""

from __future__ import annotations

from typing import Any

from distlab.api import RunResult, run
from distlab.errors import BackendUnavailable, CellInterrupted, DistlabError, PoolDied, RankError, RankTimeout
from distlab.records import CallRecord

__all__ = [
    "BackendUnavailable", "CellInterrupted", "DistlabError", "PoolDied", "RankError", "RankTimeout",
    "RunResult", "last_trace", "load_ipython_extension", "run", "unload_ipython_extension",
]
__version__ = "0.1.0"


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext distlab``: register the magics and warm up a pool in the background."""
    from distlab.magic import register

    register(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from distlab.magic import unregister

    unregister(ipython)


def last_trace() -> list[list[CallRecord]] | None:
    """The per-rank call records of the last ``%%dist --trace`` cell (None before any)."""
    from distlab.magic import session

    return session().last_trace
