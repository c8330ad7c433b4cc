"""Grading that a submission cannot influence.

Grades are decided by checks that run the student's code on fresh rank processes started by
trusted code, and compare the results with a reference computed here (see ``runner``). The
learner's kernel is never trusted: nbgrader's in-kernel run is replaced by ``nbgrader_hooks``.

In a notebook::

    distlab.grading.check("ex1", "divisible", all_reduce_rs_ag)   # raises AssertionError if wrong
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distlab.grading.catalog import ENTRIES, entry
from distlab.grading.spec import Exercise, PartResult, Submission, SubmissionResult

__all__ = ["Exercise", "PartResult", "SubmissionResult", "check", "exercise", "exercises"]


def exercises() -> list[Exercise]:
    """Every gradable exercise, in course order (imports torch)."""
    return [e.load() for e in ENTRIES]


def exercise(name: str) -> Exercise:
    """An exercise by its short key ("ex1") or its assignment name ("ex1_all_reduce_rs_ag")."""
    return entry(name).load()


def check(name: str, part: str, fn: Callable[..., Any], timeout: float = 30.0) -> None:
    """Run one graded part on ``fn`` in fresh rank processes; raise AssertionError if it fails.

    This is the same check the grader runs, but from your kernel: it tells you what the grade
    will be, it does not set it.
    """
    from distlab.grading.runner import grade_part

    ex = exercise(name)
    result = grade_part(ex, Submission(ex.function, fn=fn), ex.part(part), timeout)
    if not result.passed:
        raise AssertionError(f"{ex.key} part {result.part!r}: {result.message}")
