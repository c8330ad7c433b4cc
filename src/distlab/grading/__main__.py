"""``python -m distlab.grading JOBS.json``: grade submitted notebooks in this (trusted) process.

The instructor CLI starts one of these per parallel worker. JOBS.json is a list of
``{"student", "assignment", "notebook", "out"}``; each result is written to ``out`` as JSON
(``SubmissionResult``). The process shares one distlab launcher between its submissions; every
part still runs on freshly forked ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import nbformat

from distlab.grading import exercise
from distlab.grading.extract import solution_source
from distlab.grading.runner import DEFAULT_PART_TIMEOUT, grade_submission


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distlab.grading", description=__doc__)
    parser.add_argument("jobs", help="JSON file listing the submissions to grade")
    parser.add_argument("--part-timeout", type=float, default=DEFAULT_PART_TIMEOUT)
    args = parser.parse_args(argv)
    with open(args.jobs) as handle:
        jobs = json.load(handle)
    for job in jobs:
        ex = exercise(job["assignment"])
        try:
            nb = nbformat.read(job["notebook"], as_version=4)
        except (OSError, ValueError) as exc:  # unreadable notebooks are graded as empty answers
            print(f"{job['student']}: cannot read {job['notebook']}: {exc}", file=sys.stderr)
            nb = nbformat.v4.new_notebook()
        result = grade_submission(ex, solution_source(nb, ex), args.part_timeout)
        os.makedirs(os.path.dirname(job["out"]) or ".", exist_ok=True)
        tmp = job["out"] + ".tmp"
        with open(tmp, "w") as handle:
            handle.write(result.to_json())
        os.replace(tmp, job["out"])
        passed = sum(p.passed for p in result.parts)
        print(f"{job['student']}: {passed}/{len(result.parts)} parts in {result.seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
