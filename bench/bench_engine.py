"""Cold start and per-cell overhead of %%dist against ipyparallel's %%px, in real kernels, in one run.

Both sides run 4 ranks with a torch.distributed gloo group, driven from a Jupyter client exactly as a
notebook would. Run: .venv/bin/python bench/bench_engine.py [--reps 60]
(ipyparallel comes with `pip install -e .[bench]`).
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
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


def _paired_overheads(kernel: KernelSession, cells: dict[str, str], reps: int) -> dict[str, float]:
    """Median over rounds of (cell - empty cell) for each named cell; every round runs the empty
    cell and each named cell once, in that order, so a busy spell of a shared machine falls on
    all of them alike instead of on whichever block of cells happened to run then."""
    diffs: dict[str, list[float]] = {name: [] for name in cells}
    empties = []
    for _ in range(reps):
        empty = _ok(kernel.execute("pass")).seconds
        empties.append(empty)
        for name, code in cells.items():
            diffs[name].append(_ok(kernel.execute(code)).seconds - empty)
    out = {name: statistics.median(d) for name, d in diffs.items()}
    out["empty"] = statistics.median(empties)
    return out


def _cold_start(kernel: KernelSession, start: list[str]) -> float:
    """Seconds from the first of the ``start`` cells to the end of the last, in a fresh kernel."""
    kernel.execute("pass")
    started = time.perf_counter()
    for cell in start:
        _ok(kernel.execute(cell))
    return time.perf_counter() - started


def _measure(kernel: KernelSession, start: list[str], magic: str, pull: str, reps: int) -> dict[str, float]:
    """Cold start (the ``start`` cells), then per-cell and collective overhead of cells under ``magic``."""
    cold = _cold_start(kernel, start)
    _ok(kernel.execute(f"{magic}\nimport time\n_inside = []"))
    figures = _paired_overheads(kernel, {
        "per_cell": f"{magic}\nprint(rank)",
        # the same four labelled lines printed by the kernel itself: what any output costs in Jupyter
        "printing": "print('\\n'.join(f'[rank {r}] {r}' for r in range(4)))",
        "collective_cell": f"{magic}\n{ALL_REDUCE}",
    }, reps)
    _ok(kernel.execute(f"import statistics\n_in = {pull}"))
    inside = kernel.value("statistics.median(max(v) for v in zip(*_in))")  # the slowest rank, per call
    return {"cold": cold, "empty": figures["empty"], "per_cell": figures["per_cell"],
            "printing": figures["printing"], "collective": figures["collective_cell"] - inside, "inside": inside}


DISTLAB_START = ["%load_ext distlab", f"%%dist -n {WORLD}\nt = torch.ones(4)\ndist.all_reduce(t)"]


def fresh_cold_start(start: list[str], stop: str | None = None) -> float:
    """One more cold start sample, in a fresh kernel (one sample is too noisy to compare)."""
    kernel = KernelSession()
    try:
        seconds = _cold_start(kernel, start)
        if stop:
            kernel.execute(stop)
        return seconds
    finally:
        kernel.shutdown()


def bench_distlab(reps: int) -> dict[str, float]:
    kernel = KernelSession()
    try:
        figures = _measure(kernel, DISTLAB_START, "%%dist", "%dist_pull _inside", reps)
        figures.update(in_kernel_stages(kernel))
        started = time.perf_counter()
        kernel.execute("%%dist --timeout 120\nt = torch.ones(1)\nif rank == 1:\n    raise ValueError('x')\n"
                       "dist.all_reduce(t)")
        figures["hang_report"] = time.perf_counter() - started
        return figures
    finally:
        kernel.shutdown()


IN_KERNEL = """
import statistics as _st, time as _time
from distlab.magic import session as _session
def _median(fn, n=300):
    times = []
    for _ in range(n):
        start = _time.perf_counter(); fn(); times.append(_time.perf_counter() - start)
    return _st.median(times)
_ip, _pool = get_ipython(), _session().pool
print({
    "k_run_pass": _median(lambda: _ip.run_cell("pass", store_history=False)),
    "k_run_dist": _median(lambda: _ip.run_cell("%%dist\\npass", store_history=False)),
    "k_magic": _median(lambda: _ip.run_cell_magic("dist", "", "pass")),
    "k_pool": _median(lambda: _pool.run_cell("pass", "<bench>")),
    "k_context": _median(_pool._kernel_context),
})
"""


def in_kernel_stages(kernel: KernelSession) -> dict[str, float]:
    """A `%%dist` cell that prints nothing, timed inside the kernel in a loop, stage by stage:
    IPython running any cell, its dispatch to a cell magic, the magic, and the pool's round trip."""
    reply = _ok(kernel.execute(IN_KERNEL))
    return dict(ast.literal_eval(reply.stdout.strip()))


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


def torch_import_seconds(times: int = 3) -> float:
    """Median time of ``import torch`` in a fresh interpreter: the floor under any cold start.

    Timed inside the child, so the interpreter's exit (which tears torch down, a few hundred ms)
    is not counted."""
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                 text=True).stdout) for _ in range(times)]
    return statistics.median(runs)


# The targets (#15) and the machine they were set on: an empty cell took 4 ms there and a
# bare torch import 0.9 s. This machine's speed differs from day to day, so each target is also
# shown in units of the same quantity measured in this run.
TARGETS = {"cold": (1.0, "import", 0.9), "per_cell": (0.001, "empty", 0.004), "collective": (0.001, "empty", 0.004)}
RATIOS = {"cold": 10.0, "per_cell": 20.0}


def stages(reps: int = 300) -> dict[str, float]:
    """Where a cell's time goes, outside Jupyter's messaging: the same %%dist cells run in an
    in-process IPython shell (no kernel, no ZMQ), and the pool alone (no magic, no printing)."""
    import contextlib
    import io

    from IPython.core.interactiveshell import InteractiveShell

    from distlab.magic import _pool_options, session

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "distlab")
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("dist_start", f"-n {WORLD} --backend gloo")

    def median(fn) -> float:  # type: ignore[no-untyped-def]
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    out = {}
    with contextlib.redirect_stdout(io.StringIO()):
        out["magic_options"] = median(lambda: _pool_options(shell.magics_manager.registry["DistMagics"].dist, ""))
        pool = session().pool
        out["pool_pass"] = median(lambda: pool.run_cell("pass", "<b>"))
        out["pool_print"] = median(lambda: pool.run_cell("print(rank)", "<b>"))
        out["shell_pass"] = median(lambda: shell.run_cell_magic("dist", "", "pass"))
        out["shell_print"] = median(lambda: shell.run_cell_magic("dist", "", "print(rank)"))
        shell.run_line_magic("dist_stop", "")
    return out


def by_rank_count(counts: tuple[int, ...], reps: int) -> dict[int, float]:
    """The per-cell overhead with 1, 2, ... ranks, one kernel per count, rounds alternating between
    them: it tells the kit's own cost from what ranks beyond the cores add (here 4 ranks share 2)."""
    kernels = {}
    try:
        for n in counts:
            kernels[n] = KernelSession()
            _ok(kernels[n].execute(f"%load_ext distlab\n%dist_start -n {n} --backend gloo"))
        diffs: dict[int, list[float]] = {n: [] for n in counts}
        for _ in range(reps):
            for n, kernel in kernels.items():
                diffs[n].append(_paired_overheads(kernel, {"print": "%%dist\nprint(rank)"}, 1)["print"])
        return {n: statistics.median(d) for n, d in diffs.items()}
    finally:
        for kernel in kernels.values():
            kernel.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--cold-reps", type=int, default=5, help="fresh kernels per side for the cold start")
    args = parser.parse_args()
    floor = torch_import_seconds()
    ours = bench_distlab(args.reps)
    try:
        theirs: dict[str, float] | None = bench_ipyparallel(args.reps)
    except ImportError:
        theirs = None
    # the cold start again in fresh kernels, alternating sides: the median of all samples counts
    cold_ours, cold_theirs = [ours["cold"]], [theirs["cold"]] if theirs else []
    for _ in range(args.cold_reps - 1):
        cold_ours.append(fresh_cold_start(DISTLAB_START))
        if theirs:
            cold_theirs.append(fresh_cold_start([IPP_START.format(world=WORLD), IPP_JOIN], "cluster.stop_cluster_sync()"))
    ours["cold"] = statistics.median(cold_ours)
    if theirs:
        theirs["cold"] = statistics.median(cold_theirs)
    rows = [("cold start (load + first all_reduce cell)", "cold"), ("per-cell overhead", "per_cell"),
            ("collective overhead (beyond the all_reduce)", "collective"), ("all_reduce inside ranks", "inside"),
            ("empty kernel cell", "empty"), ("the kernel printing those 4 lines itself", "printing")]
    print(f"cold start: median of {args.cold_reps} fresh kernels per side "
          f"(distlab {' '.join(f'{c * 1e3:.0f}' for c in cold_ours)} ms"
          + (f"; ipyparallel {' '.join(f'{c * 1e3:.0f}' for c in cold_theirs)} ms)" if theirs else ")"))
    print(f"{'4 ranks, gloo, median of %d rounds' % args.reps:<46}{'distlab':>12}{'ipyparallel':>14}{'ratio':>9}")
    for label, key in rows:
        mine = ours[key] * 1000
        other = theirs[key] * 1000 if theirs else float("nan")
        ratio = other / mine if mine > 0 else float("nan")
        print(f"{label:<46}{mine:>10.1f}ms{other:>12.1f}ms{ratio:>8.1f}x")
    print(f"{'hang report (rank fails before all_reduce)':<46}{ours['hang_report'] * 1000:>10.1f}ms")
    print(f"{'bare `import torch` (the floor of a cold start)':<46}{floor * 1000:>10.1f}ms")
    print("targets (#15): cold <= 1000 ms and >= 10x; per-cell <= 1 ms and >= 20x; collective <= 1 ms")
    if theirs:
        for key, want in RATIOS.items():
            ratio = theirs[key] / ours[key]
            print(f"  {key:<11} {ratio:6.1f}x ipyparallel (target {want:.0f}x: {'meets' if ratio >= want else 'MISSES'})")
    print("the same targets in units of this run's own machine speed (they were set where an empty cell took "
          "4 ms and `import torch` 0.9 s):")
    units = {"import": floor, "empty": ours["empty"]}
    for key, (target, unit, there) in TARGETS.items():
        mine = ours[key] / units[unit]
        verdict = "meets" if mine <= target / there else "MISSES"
        print(f"  {key:<11} {mine:6.2f} x {'empty cell' if unit == 'empty' else 'torch import':<12} "
              f"(target {target / there:.2f}: {verdict})")
    where = stages()
    print("where a print(rank) cell's time goes (median, in ms):")
    print(f"  the pool alone, `pass` / `print(rank)` on {WORLD} ranks: "
          f"{where['pool_pass'] * 1e3:.2f} / {where['pool_print'] * 1e3:.2f}")
    print(f"  the whole %%dist magic in an in-process shell (no kernel): "
          f"{where['shell_pass'] * 1e3:.2f} / {where['shell_print'] * 1e3:.2f}"
          f" (of which option parsing {where['magic_options'] * 1e3:.2f})")
    parts = [
        ("Jupyter sending 4 printed lines (the kernel printing them itself)", ours["printing"]),
        ("IPython dispatching a cell to a cell magic (in the kernel, in a loop)",
         ours["k_run_dist"] - ours["k_run_pass"] - ours["k_magic"]),
        ("the magic's own work: options, session, outcome", ours["k_magic"] - ours["k_pool"]),
        (f"the pool's round trip to {WORLD} ranks (in the kernel, in a loop)", ours["k_pool"] - ours["k_context"]),
        ("what the ranks follow of the kernel: folder, import path, changed variables", ours["k_context"]),
    ]
    rest = ours["per_cell"] - sum(seconds for _, seconds in parts)
    parts.append((f"the rest: waking the kernel and {WORLD} idle ranks on {os.cpu_count()} cores for one cell", rest))
    print(f"the per-cell overhead ({ours['per_cell'] * 1e3:.2f} ms), stage by stage:")
    for label, seconds in parts:
        print(f"  {label:<84}{seconds * 1e3:6.2f}")
    counts = by_rank_count((1, 2, WORLD), args.reps)
    print(f"the per-cell overhead by number of ranks, on {os.cpu_count()} cores (median of {args.reps} rounds, "
          "alternating): " + ", ".join(f"{n} rank{'s' if n > 1 else ''} {seconds * 1e3:.2f} ms"
                                        for n, seconds in counts.items()))


if __name__ == "__main__":
    main()
