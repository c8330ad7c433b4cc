"""One grading process's view of the class: references, protected folders, time budgets.

Both places that grade (the parallel workers of ``python -m distlab.grading`` and nbgrader's
``TrustedExecute`` in the instructor's process) grade through a ``GradingSession``, so they
time the reference the same way and protect the same folders.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from distlab.grading.catalog import entry
from distlab.grading.extract import solution_source
from distlab.grading.runner import Budgets, calibrate, grade_submission
from distlab.grading.spec import DEFAULT_PART_TIMEOUT, SubmissionResult


def reference_notebook(reference_dir: str, assignment: str) -> str:
    """solutions/<a>/<a>.ipynb: nbgrader's source notebook, whose answer cell is the reference."""
    return os.path.join(reference_dir, assignment, f"{assignment}.ipynb")


class GradingSession:
    """Grades submissions; times each exercise's reference once, on first use.

    Without a ``reference_dir`` every part simply gets ``part_timeout``.
    """

    def __init__(self, part_timeout: float = DEFAULT_PART_TIMEOUT, reference_dir: str = "",
                 protected: Sequence[str] = ()) -> None:
        self.part_timeout = part_timeout
        self.reference_dir = reference_dir
        self.protected = tuple(protected)
        self._budgets: dict[str, Budgets] = {}
        self._references: dict[str, str] = {}

    def reference_source(self, assignment: str) -> str:
        """The instructor's answer cell for ``assignment``, or "" when there is no reference here.

        Read once per process: every submission of the class is graded against the same one.
        """
        if assignment not in self._references:
            path = reference_notebook(self.reference_dir, assignment) if self.reference_dir else ""
            source = ""
            if path and os.path.isfile(path):
                with open(path, encoding="utf-8") as handle:
                    source = solution_source(json.load(handle), entry(assignment).solution_ids)
            self._references[assignment] = source
        return self._references[assignment]

    def budgets(self, assignment: str) -> Budgets:
        if assignment not in self._budgets:
            source = self.reference_source(assignment)
            if source:
                self._budgets[assignment] = calibrate(entry(assignment).load(), source, self.part_timeout)
            else:
                self._budgets[assignment] = Budgets.uniform(self.part_timeout)
        return self._budgets[assignment]

    def grade(self, assignment: str, source: str) -> SubmissionResult:
        known = entry(assignment)
        return grade_submission(known.load(), source, self.budgets(known.assignment), protected=self.protected,
                                reference_source=self.reference_source(known.assignment))
