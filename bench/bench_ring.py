"""Ring all_reduce (isend/recv) vs reduce_scatter + all_gather vs gloo's all_reduce.

    .venv/bin/python bench/bench_ring.py [--size 4M] [--world-size 4] [--iters 3] [--rounds 30] [--pieces 2,4]

One run, 4 MB of float32 on 4 ranks by default. Each variant is timed in interleaved rounds,
in a shuffled order (the same on every rank), so that a busy neighbour on a shared machine
and the slot right after a barrier hurt all three alike. A round's time is its slowest
rank's; the table shows each variant's best round, and the ratio is the median over rounds
of the paired ratio (ring and built-in timed moments apart, under the same load).
busbw uses the all_reduce factor 2(n-1)/n. Target: the ring reaches at least 0.8 of the
built-in's busbw.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the instructor's grader package

import distlab  # noqa: E402
from distlab.bench import parse_size  # noqa: E402
from distlab.costmodel import busbw  # noqa: E402
from grader import reference  # noqa: E402

cloudpickle.register_pickle_by_value(reference)  # ranks need not find the grader on their path

VARIANTS = ("ring_all_reduce", "all_reduce_rs_ag", "builtin all_reduce")


def _measure(numel: int, iters: int, rounds: int, pieces: tuple[int, ...] = ()) -> dict[str, list[float]]:
    """On each rank: per-call seconds of each variant in each round."""
    import functools

    import torch
    import torch.distributed as dist

    all_reduce_rs_ag, ring_all_reduce = reference.all_reduce_rs_ag, reference.ring_all_reduce
    fns: dict[str, Any] = dict(zip(VARIANTS, (ring_all_reduce, all_reduce_rs_ag, dist.all_reduce), strict=True))
    for p in pieces:
        fns[f"ring, {p} pieces"] = functools.partial(ring_all_reduce, pieces=p)
    x = torch.randn(numel)
    expected = x.clone()
    dist.all_reduce(expected)
    for name, fn in fns.items():  # correctness first, and warm-up
        y = x.clone()
        fn(y)
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4, msg=name)
        for _ in range(2):
            fn(y)
    times: dict[str, list[float]] = {v: [] for v in fns}
    order = random.Random(0)  # same seed on every rank: all ranks run the same variant
    for _ in range(rounds):
        for name, fn in order.sample(list(fns.items()), len(fns)):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                fn(x)
            times[name].append((time.perf_counter() - start) / iters)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="4M")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--pieces", default="", help="also time the ring with its chunks cut in pieces, e.g. 2,4,8")
    a = p.parse_args()
    pieces = tuple(int(x) for x in a.pieces.split(",") if x)
    size, n = parse_size(a.size), a.world_size
    per_rank = distlab.run(_measure, world_size=n, timeout=600,
                           args=(size // 4, a.iters, a.rounds, pieces))
    variants = list(per_rank[0])
    rounds = {v: [max(r[v][i] for r in per_rank) for i in range(a.rounds)] for v in variants}
    print(f"# all_reduce of {size} B float32 on {n} ranks (gloo), {a.iters} iters x "
          f"{a.rounds} rounds; best round, slowest rank")
    print(f"# {'variant':<20} {'time(us)':>10} {'busbw(GB/s)':>12} {'vs builtin':>11}")
    seconds = {v: min(t) for v, t in rounds.items()}
    base = busbw("all_reduce", n, size, seconds["builtin all_reduce"])
    for v in variants:
        bw = busbw("all_reduce", n, size, seconds[v])
        print(f"  {v:<20} {seconds[v] * 1e6:>10.1f} {bw:>12.3f} {bw / base:>11.2f}")
    paired = [b / r for b, r in zip(rounds["builtin all_reduce"], rounds["ring_all_reduce"],
                                    strict=True)]
    ratio = statistics.median(paired)
    verdict = "meets" if ratio >= 0.8 else "MISSES"
    print(f"# ring / builtin busbw: median of {len(paired)} paired rounds = {ratio:.2f} "
          f"(quartiles {statistics.quantiles(paired, n=4)[0]:.2f}-"
          f"{statistics.quantiles(paired, n=4)[2]:.2f}; {verdict} the 0.8 target)")


if __name__ == "__main__":
    main()
