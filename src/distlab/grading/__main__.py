"""``python -m distlab.grading JOBS.json``: grade submitted notebooks in this (trusted) process.

The instructor CLI starts several of these on the same JOBS.json, a list of
``{"student", "assignment", "notebook", "out"}``. Each worker claims the next unclaimed job
(``out + ".claim"``, created exclusively), so a slow submission holds up one worker only; each
result is written to ``out`` as JSON (``SubmissionResult``), atomically, as soon as it is ready.
The process shares one distlab launcher between its submissions; every part still runs on
freshly forked ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from distlab.grading.spec import DEFAULT_PART_TIMEOUT


def _read_notebook(path: str) -> dict:  # type: ignore[type-arg]
    """Plain JSON (nbformat's validation is not needed to find two cells); {} if unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            nb = json.load(handle)
    except (OSError, ValueError) as exc:
        print(f"cannot read {path}: {exc}; graded as an empty answer", file=sys.stderr)
        return {}
    return nb if isinstance(nb, dict) else {}


def _end_when_stdin_closes() -> None:
    """The grader that started this worker holds the only write end of its stdin: when the grader
    ends, however (Ctrl-C, a kill, a closed terminal), this worker ends too, mid-submission if need
    be; its launcher sees its parent go and ends the ranks. Results are written atomically, so none
    is left half written."""
    def watch() -> None:
        while os.read(sys.stdin.fileno(), 65536):
            pass
        os._exit(1)

    threading.Thread(target=watch, name="end-with-grader", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distlab.grading", description=__doc__)
    parser.add_argument("jobs", help="JSON file listing the submissions to grade")
    parser.add_argument("--part-timeout", type=float, default=DEFAULT_PART_TIMEOUT)
    parser.add_argument("--references", default="",
                        help="folder of nbgrader source notebooks (<a>/<a>.ipynb) whose answers set the time budgets")
    parser.add_argument("--protect", action="append", default=[],
                        help="a folder submissions may not read (repeatable)")
    parser.add_argument("--budgets", default="",
                        help="folder where the workers of one class share the reference's timing")
    parser.add_argument("--end-with-stdin", action="store_true",
                        help="end when stdin closes (the grader starts its workers so)")
    args = parser.parse_args(argv)
    if args.end_with_stdin:
        _end_when_stdin_closes()

    from distlab.hub import Hub

    Hub.get()  # the launcher imports torch while this process does the same below

    from distlab.grading.catalog import entry
    from distlab.grading.extract import solution_source
    from distlab.grading.runner import warm_up
    from distlab.grading.session import GradingSession, claim

    warm_up()  # a grading rank first, even for a worker that then waits for another's timing (see preload_grading)
    session = GradingSession(args.part_timeout, args.references, args.protect, args.budgets)
    with open(args.jobs) as handle:
        jobs = json.load(handle)
    for job in jobs:
        known = entry(job["assignment"])
        timed = len(session.timed)
        budgets = session.budgets(known.assignment)  # time the reference before claiming: a claim is a promise
        if len(session.timed) > timed:
            print(f"timed the reference of {known.assignment}: {budgets.describe()}", flush=True)
        if not claim(job["out"] + ".claim"):
            continue
        source = solution_source(_read_notebook(job["notebook"]), known.solution_ids)
        result = session.grade(known.assignment, source)
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
