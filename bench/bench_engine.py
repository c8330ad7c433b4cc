"""Cold start and per-cell overhead of %%dist against ipyparallel's %%px, in real kernels, in one run.

Both sides run 4 ranks with a torch.distributed gloo group, driven from a Jupyter client exactly as a
notebook would. Run: .venv/bin/python bench/bench_engine.py [--reps 30]
(ipyparallel comes with `pip install -e .[bench]`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from kernel_session import KernelSession  # noqa: E402

WORLD = 4
ALL_REDUCE = "t = torch.ones(4)\n_t0 = time.perf_counter()\ndist.all_reduce(t)\n_inside.append(time.perf_counter() - _t0)"


def _ok(reply):  # type: ignore[no-untyped-def]
    if reply.error is not None:
        raise RuntimeError(reply.traceback)
    return reply


def _median_rtt(kernel: KernelSession, code: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        times.append(_ok(kernel.execute(code)).seconds)
    return statistics.median(times)


def _measure(kernel: KernelSession, start: list[str], magic: str, pull: str, reps: int) -> dict[str, float]:
    """Cold start (the ``start`` cells), then per-cell and collective overhead of cells under ``magic``."""
    kernel.execute("pass")
    started = time.perf_counter()
    for cell in start:
        _ok(kernel.execute(cell))
    cold = time.perf_counter() - started
    empty = _median_rtt(kernel, "pass", reps)
    per_cell = _median_rtt(kernel, f"{magic}\nprint(rank)", reps) - empty
    # the same four labelled lines printed by the kernel itself: what any output costs in Jupyter
    printing = _median_rtt(kernel, "print('\\n'.join(f'[rank {r}] {r}' for r in range(4)))", reps) - empty
    _ok(kernel.execute(f"{magic}\nimport time\n_inside = []"))
    collective_rtt = _median_rtt(kernel, f"{magic}\n{ALL_REDUCE}", reps)
    _ok(kernel.execute(f"import statistics\n_in = {pull}"))
    inside = kernel.value("statistics.median(max(v) for v in zip(*_in))")  # the slowest rank, per call
    return {"cold": cold, "empty": empty, "per_cell": per_cell, "printing": printing,
            "collective": collective_rtt - empty - inside, "inside": inside}


def bench_distlab(reps: int) -> dict[str, float]:
    kernel = KernelSession()
    try:
        start = ["%load_ext distlab", f"%%dist -n {WORLD}\nt = torch.ones(4)\ndist.all_reduce(t)"]
        figures = _measure(kernel, start, "%%dist", "%dist_pull _inside", reps)
        started = time.perf_counter()
        kernel.execute("%%dist --timeout 120\nt = torch.ones(1)\nif rank == 1:\n    raise ValueError('x')\n"
                       "dist.all_reduce(t)")
        figures["hang_report"] = time.perf_counter() - started
        return figures
    finally:
        kernel.shutdown()


IPP_START = """
import ipyparallel as ipp, socket
cluster = ipp.Cluster(n={world}, log_level=40)
rc = cluster.start_and_connect_sync(activate=True)
rc.wait_for_engines({world}, timeout=120)
view = rc[:]
view.scatter("rank", list(range({world})), flatten=True)
_s = socket.socket(); _s.bind(("127.0.0.1", 0)); port = _s.getsockname()[1]; _s.close()
view.push({{"port": port}})
"""
IPP_JOIN = """%%%%px
import time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=%d)
t = torch.ones(4)
dist.all_reduce(t)
""" % WORLD


def bench_ipyparallel(reps: int) -> dict[str, float]:
    kernel = KernelSession()
    try:
        figures = _measure(kernel, [IPP_START.format(world=WORLD), IPP_JOIN], "%%px",
                           "view.pull('_inside', block=True)", reps)
        kernel.execute("cluster.stop_cluster_sync()")
        return figures
    finally:
        kernel.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    ours = bench_distlab(args.reps)
    try:
        theirs: dict[str, float] | None = bench_ipyparallel(args.reps)
    except ImportError:
        theirs = None
    rows = [("cold start (load + first all_reduce cell)", "cold"), ("per-cell overhead", "per_cell"),
            ("collective overhead (beyond the all_reduce)", "collective"), ("all_reduce inside ranks", "inside"),
            ("empty kernel cell", "empty"), ("the kernel printing those 4 lines itself", "printing")]
    print(f"{'4 ranks, gloo, median of %d' % args.reps:<46}{'distlab':>12}{'ipyparallel':>14}{'ratio':>9}")
    for label, key in rows:
        mine = ours[key] * 1000
        other = theirs[key] * 1000 if theirs else float("nan")
        ratio = other / mine if mine > 0 else float("nan")
        print(f"{label:<46}{mine:>10.1f}ms{other:>12.1f}ms{ratio:>8.1f}x")
    print(f"{'hang report (rank fails before all_reduce)':<46}{ours['hang_report'] * 1000:>10.1f}ms")
    print("targets: cold <= 1500 ms, per-cell <= 2 ms, collective <= 2 ms; cold and per-cell >= 4x better")


if __name__ == "__main__":
    main()
