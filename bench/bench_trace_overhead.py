"""What tracing costs: a 1 MB all_reduce with and without ``distlab.trace.recording()``.

    .venv/bin/python bench/bench_trace_overhead.py [--size 1M] [--world-size 2] [--rounds 2000]

Everything runs inside one ``recording()`` block, as in a ``%%dist --trace`` cell. Each round
makes three calls in a shuffled order (the same on every rank): torch's own all_reduce
(taken before recording began, so it is not traced), the same again (an A/A control: how far
two identical calls drift apart on this machine), and the recorded ``dist.all_reduce``. A
call's time is its slowest rank's. Pairing calls made moments apart cancels the minutes-long
swings of a shared machine, which made an earlier design (blocks of 20 calls per mode) differ
by +-10% between two untraced blocks. Reported: the median over rounds of traced/untraced
(target: at most +5%), the same ratio for the two untraced calls (the A/A control: the noise
of the method; under no difference both ratios centre on zero), and the recorder's own CPU
time per call (its wrapper around a stand-in all_reduce that does no communication).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import distlab
from distlab.bench import parse_size

MODES = ("untraced", "untraced again", "traced")


def _measure(numel: int, rounds: int) -> dict[str, list[float]]:
    """On each rank: the seconds of every call of every mode, round by round, and the recorder's cost."""
    import torch
    import torch.distributed as dist

    from distlab import trace

    x = torch.ones(numel)
    plain = dist.all_reduce  # torch's function: calls through it are never recorded
    out: dict[str, list[float]] = {m: [] for m in MODES}
    order = random.Random(0)  # same seed on every rank: all ranks make the same call
    with trace.recording() as calls:
        traced = dist.all_reduce
        assert traced is not plain
        fns = {"untraced": plain, "untraced again": plain, "traced": traced}
        for _ in range(20):  # warm-up
            plain(x), traced(x)
        dist.barrier()
        for _ in range(rounds):
            for mode in order.sample(MODES, len(MODES)):
                fn = fns[mode]
                start = time.perf_counter()
                fn(x)
                out[mode].append(time.perf_counter() - start)
    assert sum(c["op"] == "all_reduce" for c in calls) == rounds + 20  # every traced call, no other

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        """Stand-in with all_reduce's signature: the wrapper's work, no communication."""

    stand_in = trace._wrap("all_reduce", all_reduce)
    recorder = []
    for _ in range(20):
        start = time.perf_counter()
        with trace.recording():
            for _ in range(50):
                stand_in(x)
        recorder.append((time.perf_counter() - start) / 50)
    out["recorder"] = [min(recorder)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="1M")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2000)
    a = p.parse_args()
    size = parse_size(a.size)
    per_rank = distlab.run(_measure, world_size=a.world_size, timeout=900, args=(size // 4, a.rounds))
    slowest = {m: [max(r[m][i] for r in per_rank) for i in range(a.rounds)] for m in MODES}
    med = {m: statistics.median(v) for m, v in slowest.items()}

    def paired(mode: str) -> float:
        """Median over rounds of this mode's call / the untraced call of the same round."""
        return statistics.median(t / u for t, u in zip(slowest[mode], slowest["untraced"], strict=True)) - 1

    print(f"# all_reduce of {size} B float32 on {a.world_size} ranks (gloo), {a.rounds} rounds of one "
          f"call per mode in shuffled order, slowest rank per call")
    print(f"# {'mode':<16} {'median(us)':>11} {'best(us)':>10}")
    for m in MODES:
        print(f"  {m:<16} {med[m] * 1e6:>11.1f} {min(slowest[m]) * 1e6:>10.1f}")
    recorder = max(r["recorder"][0] for r in per_rank)
    print(f"  recorder alone {recorder * 1e6:>12.1f} us/call = {recorder / med['untraced'] * 100:.2f}% "
          f"of an untraced call")
    overhead = paired("traced")
    control = paired("untraced again")
    verdict = "meets" if overhead <= 0.05 else "MISSES"
    print(f"# tracing overhead: {overhead * 100:+.1f}% (median over rounds of traced / untraced; {verdict} "
          f"the 5% target); A/A control (the same for two untraced calls) {control * 100:+.1f}%")


if __name__ == "__main__":
    main()
