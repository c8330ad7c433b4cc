"""Two versions of the kit side by side in one run: a cell's overhead and the cold start.

Why: this machine's speed changes from hour to hour, so a figure from another day cannot show
whether a change made cells slower. Here the same rounds alternate between a kernel running an
earlier revision (checked out into a temporary git worktree) and one running the working tree.

    .venv/bin/python bench/bench_versions.py e08cbd6            # 60 rounds, 5 cold starts each
    .venv/bin/python bench/bench_versions.py HEAD~3 --rounds 100 --cold 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from bench_engine import DISTLAB_START as START  # noqa: E402
from bench_engine import _cold_start, _ok  # noqa: E402
from kernel_session import KernelSession  # noqa: E402  (on the path bench_engine gives)


def kernel_on(src: Path) -> KernelSession:
    """A fresh kernel that imports distlab from ``src`` (and so do its launcher and ranks)."""
    os.environ["PYTHONPATH"] = str(src)
    try:
        return KernelSession()
    finally:
        os.environ.pop("PYTHONPATH", None)


def timed(kernel: KernelSession, code: str) -> float:
    return float(_ok(kernel.execute(code)).seconds)


def cold_start(src: Path) -> float:
    kernel = kernel_on(src)
    try:
        return _cold_start(kernel, START)
    finally:
        kernel.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revision", help="the earlier revision (anything git checkout takes)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--cold", type=int, default=5, help="fresh kernels per version for the cold start")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(worktree), args.revision],
                       check=True)
        try:
            versions = {f"{args.revision}": worktree / "src", "working tree": REPO / "src"}
            cold: dict[str, list[float]] = {name: [] for name in versions}
            for _ in range(args.cold):
                for name, src in versions.items():
                    cold[name].append(cold_start(src))
            kernels = {name: kernel_on(src) for name, src in versions.items()}
            cells = {"empty": "pass", "pass": "%%dist\npass", "print": "%%dist\nprint(rank)"}
            rounds: dict[str, dict[str, list[float]]] = {name: {c: [] for c in cells} for name in versions}
            try:
                for kernel in kernels.values():
                    for cell in START:
                        timed(kernel, cell)
                    for _ in range(10):
                        timed(kernel, cells["print"])
                for _ in range(args.rounds):
                    for name, kernel in kernels.items():
                        for cell, code in cells.items():
                            rounds[name][cell].append(timed(kernel, code))
            finally:
                for kernel in kernels.values():
                    kernel.shutdown()
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)
    print(f"4 ranks, gloo, median of {args.rounds} alternating rounds; cold start median of {args.cold} fresh kernels")
    print(f"{'version':<16}{'cold start':>12}{'empty cell':>12}{'%%dist pass':>13}{'print(rank)':>13}{'per-cell':>10}")
    for name in versions:
        m = {cell: statistics.median(times) * 1e3 for cell, times in rounds[name].items()}
        print(f"{name:<16}{statistics.median(cold[name]) * 1e3:>10.0f}ms{m['empty']:>10.2f}ms{m['pass']:>11.2f}ms"
              f"{m['print']:>11.2f}ms{m['print'] - m['empty']:>8.2f}ms")


if __name__ == "__main__":
    main()
