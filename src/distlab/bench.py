"""Bandwidth benchmark of collectives, nccl-tests style, from the command line or a notebook.

    python -m distlab.bench --ops all_reduce,all_gather --sizes 1K:64M --world-sizes 2,4
    python -m distlab.bench --fn mymodule:my_all_reduce --sizes 1K:4M

    rows = distlab.bench.sweep(["all_reduce"], "1K:1M", [2], fns=[my_all_reduce])
    distlab.bench.plot_bandwidth(rows); distlab.bench.plot_fit(rows)

Each size is warmed up, the ranks meet at a barrier, then each rank times ``iters`` calls;
the reported time is the slowest rank's time per call, because a collective is done only when
every rank is (nccl-tests averages over ranks by default and reports the maximum with
``-a 3``). algbw is
size / time; busbw rescales it by the nccl-tests factor (``distlab.costmodel``). A user
function (``--fn`` / ``fns``) takes one tensor and all-reduces it in place, so it is
measured and scaled like ``all_reduce``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from distlab.costmodel import AlphaBeta, algbw, bus_factor, fit_alpha_beta

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
Row = dict[str, Any]

if TYPE_CHECKING:  # matplotlib is imported only to plot: the ranks never need it
    from matplotlib.figure import Figure


def parse_size(text: str) -> int:
    """'64M' -> 67108864 (K, M, G are powers of 1024)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B") or "0"
    unit = t[-1] if t[-1] in _UNITS else ""
    return int(float(t[: len(t) - len(unit)]) * _UNITS[unit])


def parse_sizes(spec: str | Sequence[int]) -> list[int]:
    """'1K:64M' -> 1K, 2K, ..., 64M (doubling); '1K,1M' -> those two; ints pass through."""
    if not isinstance(spec, str):
        return [int(s) for s in spec]
    if ":" in spec:
        lo, hi = (parse_size(p) for p in spec.split(":", 1))
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= 2
        return out
    return [parse_size(p) for p in spec.split(",") if p.strip()]


def _iters_for(size: int, iters: int, min_iters: int) -> int:
    return max(min_iters, min(iters, (64 << 20) // (4 * max(size, 1))))


def _make_call(label: str, fn: Any, x: Any) -> Callable[[], Any]:
    """One timed call on buffer ``x`` (count elements, divisible by the world size)."""
    import torch
    import torch.distributed as dist

    from distlab.compat import all_gather_single, reduce_scatter_single

    if fn is not None:
        return lambda: fn(x)
    shard, out = x[: x.numel() // dist.get_world_size()].clone(), torch.empty_like(x)
    calls: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: dist.all_reduce(x),
        "all_gather": lambda: all_gather_single(x, shard),  # nccl-tests size: the output
        "reduce_scatter": lambda: reduce_scatter_single(shard, x),  # size: the input
        "all_to_all": lambda: dist.all_to_all_single(out, x),
        "broadcast": lambda: dist.broadcast(x, src=0),
        "reduce": lambda: dist.reduce(x, dst=0),
    }
    return calls[label]


def _rank_sweep(jobs: list[tuple[str, Any]], sizes: list[int], dtype_name: str, warmup: int,
                iters: int, min_iters: int) -> list[Row]:
    """Runs on every rank: time each (op or function) at each size."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    n, elem = dist.get_world_size(), torch.empty(0, dtype=dtype).element_size()
    # NCCL moves GPU memory and runs on a CUDA stream: allocate there, and synchronise before
    # each clock reading (work.wait() makes the stream wait, not the host)
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

    def settle() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    rows = []
    for label, fn in jobs:
        for size in sizes:
            count = max(size // elem // n, 1) * n  # divisible by n for the sharded ops
            call = _make_call(label, fn, torch.ones(count, dtype=dtype, device=device))
            k = _iters_for(size, iters, min_iters)
            for _ in range(warmup):
                call()
            settle()
            dist.barrier()
            settle()
            start = time.perf_counter()
            for _ in range(k):
                call()
            settle()
            seconds = (time.perf_counter() - start) / k
            rows.append({"op": label, "world_size": n, "size": count * elem, "count": count,
                         "type": dtype_name, "iters": k, "time_us": seconds * 1e6})
    return rows


class _Progress:
    """A bar for long sweeps: ipywidgets in a Jupyter kernel, '#'-prefixed lines elsewhere."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.bar, self.started = total, 0, None, time.perf_counter()
        self.enabled = enabled and total > 1
        if self.enabled:
            from distlab.viz import in_kernel

            if in_kernel():
                import ipywidgets
                from IPython.display import display

                self.bar = ipywidgets.IntProgress(value=0, max=total, description="bench")
                display(self.bar)

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.value = self.done
            self.bar.description = f"{self.done}/{self.total}"
        else:
            spent = time.perf_counter() - self.started
            print(f"# [{self.done}/{self.total}] {what} ({spent:.1f} s)", flush=True)


def sweep(ops: Iterable[str] = ("all_reduce",), sizes: str | Sequence[int] = "1K:64M",
          world_sizes: Iterable[int] = (2,), fns: Iterable[Callable[..., Any]] | None = None,
          *, backend: str = "gloo", dtype: str = "float32", warmup: int = 2, iters: int = 20,
          min_iters: int = 3, timeout: float = 900.0, progress: bool = True,
          runner: Callable[..., Any] | None = None) -> list[Row]:
    """Measure each op (and each function in ``fns``) at each size on each world size.

    Returns one row per (op, world_size, size): size, count, type, iters, time_us (slowest
    rank), algbw and busbw (GB/s). ``runner`` defaults to ``distlab.run``.
    """
    if runner is None:
        from distlab import run

        runner = run
    jobs: list[tuple[str, Any]] = [(op, None) for op in ops]
    for op, _ in jobs:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    jobs += [(getattr(fn, "__name__", "fn"), fn) for fn in fns or ()]
    size_list, n_list = parse_sizes(sizes), [int(n) for n in world_sizes]
    bar = _Progress(len(jobs) * len(n_list), progress)
    rows: list[Row] = []
    for n in n_list:
        for job in jobs:
            per_rank = runner(_rank_sweep, world_size=n, backend=backend, timeout=timeout,
                              args=([job], size_list, dtype, warmup, iters, min_iters))
            for i, row in enumerate(per_rank[0]):
                seconds = max(r[i]["time_us"] for r in per_rank) / 1e6
                kind = row["op"] if job[1] is None else "all_reduce"
                row = {**row, "time_us": seconds * 1e6, "algbw": algbw(row["size"], seconds)}
                row["busbw"] = row["algbw"] * bus_factor(kind, n)
                rows.append(row)
            bar.step(f"{job[0]} on {n} ranks")
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """The rows as nccl-tests prints them, one block per (op, world size)."""
    lines: list[str] = []
    head = f"#{'size':>11} {'count':>13} {'type':>9} {'time(us)':>12} {'algbw(GB/s)':>12} " \
           f"{'busbw(GB/s)':>12}"
    for key in dict.fromkeys((r["op"], r["world_size"]) for r in rows):
        lines += [f"# {key[0]} on {key[1]} ranks", head]
        for r in rows:
            if (r["op"], r["world_size"]) == key:
                lines.append(f" {r['size']:>11} {r['count']:>13} {r['type']:>9} "
                             f"{r['time_us']:>12.2f} {r['algbw']:>12.3f} {r['busbw']:>12.3f}")
    return "\n".join(lines)


def fits(rows: Sequence[Row]) -> dict[tuple[str, int], AlphaBeta]:
    """An alpha-beta model per (op, world size): time per call = alpha + beta * size."""
    out = {}
    for key in dict.fromkeys((r["op"], r["world_size"]) for r in rows):
        series = [r for r in rows if (r["op"], r["world_size"]) == key]
        if len({r["size"] for r in series}) >= 2:
            out[key] = fit_alpha_beta([r["size"] for r in series],
                                      [r["time_us"] / 1e6 for r in series])
    return out


def plot_bandwidth(rows: Sequence[Row]) -> Figure:
    """busbw against message size, one line per (op, world size)."""
    from matplotlib.figure import Figure

    from distlab.figure_text import figure_tr, fit_fonts
    from distlab.viz import enable_figure_display

    enable_figure_display()
    fig = Figure(figsize=(9.5, 4), dpi=90)
    ax = fig.add_subplot()
    for key in dict.fromkeys((r["op"], r["world_size"]) for r in rows):
        series = [r for r in rows if (r["op"], r["world_size"]) == key]
        ax.plot([r["size"] for r in series], [r["busbw"] for r in series], "o-",
                label=f"{key[0]} (n={key[1]})")
    ax.set(xscale="log", xlabel=figure_tr("message size (bytes)"), ylabel="busbw (GB/s)",
           title=figure_tr("bus bandwidth"))
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fit_fonts(fig)
    fig.tight_layout()
    return fig


def plot_fit(rows: Sequence[Row]) -> Figure:
    """Measured time per call and the fitted alpha + beta * size model over it (log-log)."""
    from matplotlib.figure import Figure

    from distlab.figure_text import figure_tr, fit_fonts
    from distlab.viz import enable_figure_display

    enable_figure_display()
    fig = Figure(figsize=(9.5, 4), dpi=90)
    ax = fig.add_subplot()
    for key, model in fits(rows).items():
        series = [r for r in rows if (r["op"], r["world_size"]) == key]
        sizes = [r["size"] for r in series]
        line = ax.plot(sizes, [r["time_us"] for r in series], "o", label=f"{key[0]} (n={key[1]})")
        ax.plot(sizes, model.predict(sizes) * 1e6, "-", color=line[0].get_color(),
                label=figure_tr("model: {model}", model=model))
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel=figure_tr("message size (bytes)"), ylabel=figure_tr("time per call (us)"),
           title=figure_tr("alpha-beta model: t = alpha + beta * bytes"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fit_fonts(fig)
    fig.tight_layout()
    return fig


def _load_fn(spec: str) -> Callable[..., Any]:
    import cloudpickle

    module_name, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"--fn wants module:function, got {spec!r}")
    sys.path.insert(0, ".")
    module = importlib.import_module(module_name)
    if not module_name.startswith("distlab"):  # ranks may not find the user's module: send it
        cloudpickle.register_pickle_by_value(module)
    fn: Callable[..., Any] = getattr(module, name)
    return fn


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m distlab.bench", description=__doc__.split("\n")[0])
    p.add_argument("--ops", default="all_reduce", help=f"comma list from {','.join(OPS)}; "
                   "'none' to time only --fn")
    p.add_argument("--sizes", default="1K:64M", help="lo:hi (doubling) or a comma list")
    p.add_argument("--world-sizes", default="2", help="comma list, e.g. 2,4")
    p.add_argument("--fn", action="append", default=[], metavar="MODULE:FUNC",
                   help="also time FUNC(tensor), an in-place all_reduce (repeatable)")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--plot", metavar="PNG", help="save bandwidth and alpha-beta plots here")
    a = p.parse_args(argv)
    ops = [] if a.ops == "none" else [o.strip() for o in a.ops.split(",") if o.strip()]
    rows = sweep(ops, a.sizes, [int(w) for w in a.world_sizes.split(",")],
                 [_load_fn(s) for s in a.fn], backend=a.backend, dtype=a.dtype,
                 warmup=a.warmup, iters=a.iters)
    print(format_table(rows))
    for (op, n), model in fits(rows).items():
        print(f"# alpha-beta fit {op} on {n} ranks: {model}")
    if a.plot:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        for fig, suffix in ((plot_bandwidth(rows), ""), (plot_fit(rows), "_fit")):
            path = a.plot.removesuffix(".png") + suffix + ".png"
            FigureCanvasAgg(fig).print_png(path)
            print(f"# wrote {path}")


if __name__ == "__main__":
    main()
