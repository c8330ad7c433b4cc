"""Cold start and per-cell overhead of %%dist over 2 SLURM nodes, beside the local launcher, in one run.

Needs root: it brings up the two-node cluster of tests/slurm_cluster.py (Debian's slurm-wlm and
munge, nodes in network namespaces on this machine) and drives two real kernels as a notebook
would. Both sides run 4 ranks on gloo; the cluster's ranks are placed 2 per node by srun and join
over TCP. Run: sudo .venv/bin/python bench/bench_cluster.py [--reps 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from kernel_session import KernelSession  # noqa: E402
from slurm_cluster import LOOP_CELL, NETWORK, SlurmCluster, skip_reason, when_every_rank_is_looping  # noqa: E402

FIRST = "%%dist\nt = torch.ones(4)\ndist.all_reduce(t)\nt.sum().item()"
LOCAL_START = "%load_ext distlab\n%dist_start -n 4 --backend gloo"
SLURM_START = (f'%load_ext distlab\n%dist_start -n 4 --launcher slurm --iface {NETWORK} '
               '--srun-args "--nodes=2 --ntasks-per-node=2"')


def _ok(reply):  # type: ignore[no-untyped-def]
    if reply.error is not None:
        raise RuntimeError(reply.traceback)
    return reply


def measure(start: str, reps: int) -> dict[str, float]:
    kernel = KernelSession()
    try:
        began = time.perf_counter()
        _ok(kernel.execute(start, timeout=300))
        _ok(kernel.execute(FIRST, timeout=300))
        cold = time.perf_counter() - began
        diffs, cells = [], []
        for _ in range(reps):
            empty = _ok(kernel.execute("pass")).seconds
            cell = _ok(kernel.execute("%%dist\nprint(rank)")).seconds
            diffs.append(cell - empty)
            cells.append(_ok(kernel.execute(FIRST)).seconds - empty)
        return {"cold": cold, "per_cell": statistics.median(diffs), "all_reduce_cell": statistics.median(cells)}
    finally:
        kernel.shutdown()


def fault_to_failure(cluster: SlurmCluster, fault: str) -> float:
    """Seconds from a fault on dlnode2, mid-cell, to the failed cell naming the node."""
    import tempfile
    from pathlib import Path

    kernel = KernelSession()
    marks = Path(tempfile.mkdtemp())
    struck: list[float] = []

    def strike() -> None:
        struck.append(time.perf_counter())
        if fault == "crash":
            cluster.kill_tasks("dlnode2")
        else:
            cluster.cut("dlnode2")

    try:
        _ok(kernel.execute(SLURM_START, timeout=300))
        _ok(kernel.execute(f"%%dist\nMARKS = {str(marks)!r}"))
        thread = when_every_rank_is_looping(marks, strike)
        reply = kernel.execute(LOOP_CELL, timeout=200)
        ended = time.perf_counter()
        thread.join()
        if reply.error is None or "dlnode2" not in reply.traceback:
            raise RuntimeError(f"the {fault} was not reported: {reply.traceback or reply.stdout}")
        return ended - struck[0]
    finally:
        if fault == "cut":
            cluster.reconnect("dlnode2")
        kernel.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        print(f"bench_cluster: skipped, {reason}")
        return
    local = measure(LOCAL_START, args.reps)
    cluster = SlurmCluster().start()
    try:
        os.environ.update(cluster.env())
        remote = measure(SLURM_START, args.reps)
        faults = {fault: fault_to_failure(cluster, fault) for fault in ("crash", "cut")}
    finally:
        cluster.stop()
    print(f"{'4 ranks, gloo, median of %d rounds' % args.reps:<48}{'local':>10}{'2 SLURM nodes':>15}{'ratio':>8}")
    for label, key in [("cold start (load + start + first all_reduce)", "cold"),
                       ("per-cell overhead (print cell - empty cell)", "per_cell"),
                       ("all_reduce cell - empty cell", "all_reduce_cell")]:
        mine, theirs = local[key] * 1e3, remote[key] * 1e3
        print(f"{label:<48}{mine:>8.1f}ms{theirs:>13.1f}ms{theirs / mine:>7.1f}x")
    print("the nodes are network namespaces on this 2-core machine: the cluster column measures the kit's "
          "TCP path and srun's start-up, not a real network")
    print(f"a fault on one node mid-cell to the failed cell naming it: tasks killed {faults['crash']:.1f} s, "
          f"cable cut {faults['cut']:.1f} s (SLURM itself notices a dead node after SlurmdTimeout, 30 s here)")


if __name__ == "__main__":
    main()
