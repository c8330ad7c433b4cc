"""`python -m distlab.bench` runs a tiny sweep on real gloo ranks and prints a table that parses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from distlab.bench import format_table, parse_size, parse_sizes

USER_FN = '''
import torch.distributed as dist


def my_all_reduce(tensor):
    """A learner's all_reduce, in a file the ranks cannot import."""
    dist.all_reduce(tensor)
'''


def _parse(stdout: str) -> dict[str, list[tuple[int, int, str, float, float, float]]]:
    """op -> rows (size, count, type, time_us, algbw, busbw) from the nccl-tests style table."""
    blocks: dict[str, list[tuple[int, int, str, float, float, float]]] = {}
    current = ""
    for line in stdout.splitlines():
        header = re.fullmatch(r"# (\S+) on \d+ ranks", line)
        if header:
            current = header.group(1)
            blocks[current] = []
        elif line.strip() and not line.startswith("#"):
            size, count, dtype, t, alg, bus = line.split()
            blocks[current].append((int(size), int(count), dtype, float(t), float(alg), float(bus)))
    return blocks


@pytest.mark.slow  # the whole command: a launcher, ranks and a sweep
def test_cli_runs_a_tiny_sweep_and_prints_a_parsable_table(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(USER_FN)
    plot = tmp_path / "bw.png"
    cmd = [sys.executable, "-m", "distlab.bench", "--ops", "all_reduce,all_gather",
           "--sizes", "1K:4K", "--world-sizes", "2", "--iters", "3", "--warmup", "1",
           "--fn", "mine:my_all_reduce", "--plot", str(plot)]
    proc = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    blocks = _parse(proc.stdout)
    assert list(blocks) == ["all_reduce", "all_gather", "my_all_reduce"]
    factors = {"all_reduce": 1.0, "all_gather": 0.5, "my_all_reduce": 1.0}  # n = 2
    for op, rows in blocks.items():
        assert [r[0] for r in rows] == [1024, 2048, 4096]
        for size, count, dtype, time_us, alg, bus in rows:
            assert dtype == "float32" and count * 4 == size and time_us > 0
            assert alg == pytest.approx(size / time_us / 1e3, abs=2e-3)  # GB/s, 3 decimals
            assert bus == pytest.approx(alg * factors[op], abs=2e-3)
    assert "# alpha-beta fit all_reduce on 2 ranks: alpha =" in proc.stdout
    for path in (plot, tmp_path / "bw_fit.png"):
        assert path.read_bytes().startswith(b"\x89PNG")


def test_sizes_parse_like_nccl_tests() -> None:
    assert parse_size("1K") == 1024 and parse_size("64M") == 64 << 20 and parse_size("512") == 512
    assert parse_size("4MiB") == 4 << 20 and parse_size("2KB") == 2048
    assert parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K,1M") == [1024, 1 << 20]
    assert parse_sizes([3, 5]) == [3, 5]


def test_table_layout() -> None:
    rows = [{"op": "all_reduce", "world_size": 4, "size": 4194304, "count": 1048576,
             "type": "float32", "time_us": 2000.0, "algbw": 2.097, "busbw": 3.146}]
    table = format_table(rows)
    assert table.splitlines()[0] == "# all_reduce on 4 ranks"
    assert "time(us)" in table and "busbw(GB/s)" in table
    assert table.splitlines()[2].split() == ["4194304", "1048576", "float32", "2000.00", "2.097",
                                             "3.146"]
