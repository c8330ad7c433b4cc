"""``distlab.run``: run one function on fresh ranks, for scripts, tests and the grader."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from distlab.cluster import ClusterLaunch, launch_for
from distlab.pool import Pool, traces_of, values_of
from distlab.records import CallRecord


class RunResult(list):  # type: ignore[type-arg]
    """The per-rank return values, indexed by rank; ``.trace`` holds per-rank call records when traced."""

    trace: list[list[CallRecord]] | None = None


def _notebook_cluster() -> ClusterLaunch | None:
    """In a notebook whose pool runs on a cluster (``%dist_start --launcher slurm``), ``run`` and
    everything built on it (the bench, the exercises' checks) place their ranks there too."""
    magic = sys.modules.get("distlab.magic")
    return None if magic is None else launch_for(magic.session().cluster)


def run(
    fn: Callable[..., Any],
    world_size: int = 2,
    backend: str = "gloo",
    timeout: float = 60.0,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    trace: bool = False,
) -> RunResult:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh ranks and return each rank's result.

    The process group is initialised before ``fn`` starts and the ranks are gone when this
    returns, so nothing leaks from one call to the next. ``fn`` may be defined in a notebook:
    it is sent by value. A failure on any rank raises RankError; a hang past ``timeout`` raises
    RankTimeout with every stuck rank's stack.

    >>> import distlab
    >>> def hello():
    ...     import torch.distributed as dist
    ...     return dist.get_rank()
    >>> distlab.run(hello, world_size=2)
    [0, 1]
    """
    pool = Pool(world_size, backend, eager_restart=False, cluster=_notebook_cluster())
    try:
        dones = pool.call(fn, args, kwargs, timeout=timeout, trace=trace)
    finally:
        pool.stop()
    result = RunResult(values_of(dones))
    if trace:
        result.trace = traces_of(dones)
    return result
