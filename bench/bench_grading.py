"""How long the instructor waits for a class: 16 submissions of exercise 1, serially and at -j 2.

    .venv/bin/python bench/bench_grading.py                 # --jobs 1 then --jobs 2, one run
    .venv/bin/python bench/bench_grading.py --jobs 2 --json out.json

The class is a folder of 16 fixture submissions, named as students hand them in: 2 correct,
2 partially correct, 3 that use forbidden communication and 9 that game the grader, hang or
crash (a deadlock, an endless loop, a rank that exits, one that is killed, a patched torch, an
always-equal tensor, a trailing NaN, an import of the instructor's reference, a read of the
solution notebook). Each run is the real command (``python -m grader autograde FOLDER``) on a
fresh course directory: nbgrader's setup, timing the reference, the trusted checks and
nbgrader's autograde of every submission. Every score is checked against the contract's pins
(grader/fixtures/ex1_all_reduce_rs_ag/fixture.py): a fast grader that grades wrongly fails the benchmark.

Target (issue 11): at most 80 s in all at -j 2 on a 2-core machine; before the change the same
kind of class took 250 s, because every hanging part waited out a fixed 30 s.
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
FIXTURES = REPO / "grader" / "fixtures"
ASSIGNMENT = "ex1_all_reduce_rs_ag"
TARGET_J2 = 80.0  # seconds for the class at -j 2

CLASS = {
    "correct": ("solution", "noisy_correct"),
    "partially correct": ("off_by_one", "divisible_only"),
    "forbidden communication": ("direct_all_reduce", "bypass_process_group", "reduce_then_broadcast"),
    "gaming, hanging or crashing": ("deadlock", "infinite_loop", "kernel_dies", "killed_rank",
                                    "gaming_patch_torch", "gaming_always_equal", "gaming_trailing_nan",
                                    "gaming_import_reference", "gaming_read_solution"),
}


def _pins() -> dict[str, dict[str, int]]:
    sys.path.insert(0, str(FIXTURES))
    try:
        import make_fixtures
    finally:
        sys.path.pop(0)
    pins: dict[str, dict[str, int]] = make_fixtures.exercises()[ASSIGNMENT].PINNED
    return pins


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def make_class(folder: Path) -> dict[str, str]:
    """Student id -> fixture, one notebook per student in ``folder``."""
    students = {}
    for i, fixture in enumerate(f for group in CLASS.values() for f in group):
        shutil.copyfile(FIXTURES / ASSIGNMENT / f"{fixture}.ipynb",
                        folder / f"student{i + 1:02d}.ipynb")
        students[f"student{i + 1:02d}"] = fixture
    return students


def run(folder: Path, jobs: int, students: dict[str, str], pins: dict[str, dict[str, int]]) -> dict[str, object]:
    course = Path(tempfile.mkdtemp(prefix="distlab-bench-course-"))
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    try:
        cpu0, t0 = _children_cpu(), time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "grader", "autograde", str(folder), "--course", str(course),
                               "--jobs", str(jobs)], cwd=REPO, env=env, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        if done.returncode != 0:
            raise SystemExit(f"autograde failed:\n{done.stdout}\n{done.stderr}")
        export = subprocess.run([sys.executable, "-m", "grader", "export", "--course", str(course)],
                                cwd=REPO, env=env, capture_output=True, text=True, check=True)
        rows = {r["student"]: r for r in csv.DictReader(io.StringIO(export.stdout))}
    finally:
        shutil.rmtree(course, ignore_errors=True)
    wrong = []
    for student, fixture in students.items():
        got = {k.removeprefix("test_"): round(float(v)) for k, v in rows.get(student, {}).items()
               if k.startswith("test_")}
        if got != pins[fixture]:
            wrong.append(f"{student} ({fixture}): got {got}, expected {pins[fixture]}")
    slowest = [line for line in done.stdout.splitlines() if line.startswith("slowest:")]
    return {"jobs": jobs, "wall_s": wall, "cpu_s": cpu, "graded": len(rows), "wrong": wrong,
            "slowest": slowest[0] if slowest else ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    pins = _pins()
    with tempfile.TemporaryDirectory(prefix="distlab-bench-inbox-") as tmp:
        folder = Path(tmp)
        students = make_class(folder)
        print(f"autograde {len(students)} submissions of {ASSIGNMENT} on {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f} at start")
        for kind, group in CLASS.items():
            print(f"  {len(group):>2} {kind}: {', '.join(group)}")
        print(f"{'jobs':>4}  {'wall s':>7}  {'CPU s':>7}  {'s/submission':>12}  scores")
        rows = []
        for jobs in args.jobs:
            row = run(folder, jobs, students, pins)
            rows.append(row)
            verdict = "all as pinned" if not row["wrong"] else f"{len(row['wrong'])} WRONG"  # type: ignore[arg-type]
            print(f"{jobs:>4}  {row['wall_s']:7.1f}  {row['cpu_s']:7.1f}  "
                  f"{row['wall_s'] / len(students):12.2f}  {row['graded']}/{len(students)} graded, {verdict}",
                  flush=True)
            for line in row["wrong"]:  # type: ignore[attr-defined]
                print("      " + line)
            print(f"      {row['slowest']}")
    by_jobs = {r["jobs"]: r for r in rows}
    if 1 in by_jobs and 2 in by_jobs:
        print(f"-j 2 is {by_jobs[1]['wall_s'] / by_jobs[2]['wall_s']:.2f}x faster than serial")  # type: ignore[operator]
    ok = all(not r["wrong"] for r in rows)
    if 2 in by_jobs:
        met = by_jobs[2]["wall_s"] <= TARGET_J2  # type: ignore[operator]
        print(f"-j 2: {by_jobs[2]['wall_s']:.1f} s ({'meets' if met else 'MISSES'} the {TARGET_J2:g} s target)")
    if args.json:
        Path(args.json).write_text(json.dumps({"students": students, "runs": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
