"""How long the instructor waits: autograde N submissions of exercise 1, serially and in parallel.

    .venv/bin/python bench/bench_grading.py            # 20 submissions, --jobs 1 then --jobs 2
    .venv/bin/python bench/bench_grading.py -n 8 --jobs 1 2 4 --json out.json

Each run is the real command an instructor types (``python -m grader autograde FOLDER``) on a
fresh course directory: nbgrader's setup, the trusted checks on fresh ranks for every part, and
nbgrader's autograde of every submission into the gradebook. The submissions cycle through the
contract-test fixtures (right, wrong and gaming answers), leaving out the deadlocking one, whose
time is its budget, not the grader's speed. Reported: wall time, CPU time of everything the run
started, and seconds per submission. Target: at most 10 s per submission serially on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "grader" / "fixtures" / "submissions" / "ex1_all_reduce_rs_ag"
TARGET_SERIAL = 10.0  # seconds per submission, serially


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def make_submissions(folder: Path, count: int) -> list[str]:
    """``count`` notebooks named like a real hand-in folder, cycling through the fixtures."""
    pool = sorted(p for p in FIXTURES.glob("*.ipynb") if p.stem != "deadlock")
    names = []
    for i in range(count):
        source = pool[i % len(pool)]
        name = f"student{i + 1:02d} - {source.stem}.ipynb"
        shutil.copyfile(source, folder / name)
        names.append(name)
    return names


def run(folder: Path, jobs: int, part_timeout: float) -> dict[str, float]:
    course = Path(tempfile.mkdtemp(prefix="distlab-bench-course-"))
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    try:
        cpu0, t0 = _children_cpu(), time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "grader", "autograde", str(folder), "--course", str(course),
             "--jobs", str(jobs), "--part-timeout", str(part_timeout)],
            cwd=REPO, env=env, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        if done.returncode != 0:
            raise SystemExit(f"autograde failed:\n{done.stdout}\n{done.stderr}")
        export = subprocess.run([sys.executable, "-m", "grader", "export", "--course", str(course)],
                                cwd=REPO, env=env, capture_output=True, text=True, check=True)
        graded = len(list(csv.DictReader(io.StringIO(export.stdout))))
    finally:
        shutil.rmtree(course, ignore_errors=True)
    return {"jobs": jobs, "wall_s": wall, "cpu_s": cpu, "graded": graded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--submissions", type=int, default=20)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--part-timeout", type=float, default=30.0)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="distlab-bench-inbox-") as tmp:
        folder = Path(tmp)
        make_submissions(folder, args.submissions)
        print(f"autograde {args.submissions} submissions of ex1_all_reduce_rs_ag on {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f} at start")
        print(f"{'jobs':>4}  {'wall s':>7}  {'s/submission':>12}  {'CPU s':>7}  {'CPU s/submission':>16}  graded")
        rows = []
        for jobs in args.jobs:
            row = run(folder, jobs, args.part_timeout)
            n = args.submissions
            row.update(per_submission_s=row["wall_s"] / n, cpu_per_submission_s=row["cpu_s"] / n)
            rows.append(row)
            print(f"{jobs:>4}  {row['wall_s']:7.1f}  {row['per_submission_s']:12.2f}  {row['cpu_s']:7.1f}  "
                  f"{row['cpu_per_submission_s']:16.2f}  {row['graded']}/{n}", flush=True)
    serial = next((r for r in rows if r["jobs"] == 1), None)
    if serial is not None:
        verdict = "meets" if serial["per_submission_s"] <= TARGET_SERIAL else "MISSES"
        print(f"serial: {serial['per_submission_s']:.2f} s per submission ({verdict} the {TARGET_SERIAL:g} s target)")
    if args.json:
        Path(args.json).write_text(json.dumps({"submissions": args.submissions, "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
