"""One grading process's view of the class: references, protected folders, time budgets.

Both places that grade (the parallel workers of ``python -m distlab.grading`` and nbgrader's
``TrustedExecute`` in the instructor's process) grade through a ``GradingSession``, so they
time the reference the same way and protect the same folders.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

from distlab.grading.catalog import entry
from distlab.grading.extract import solution_source
from distlab.grading.runner import Budgets, calibrate, grade_submission
from distlab.grading.spec import DEFAULT_PART_TIMEOUT, SubmissionResult


def reference_notebook(reference_dir: str, assignment: str) -> str:
    """solutions/<a>/<a>.ipynb: nbgrader's source notebook, whose answer cell is the reference."""
    return os.path.join(reference_dir, assignment, f"{assignment}.ipynb")


class GradingSession:
    """Grades submissions; times each exercise's reference once, on first use.

    Without a ``reference_dir`` every part simply gets ``part_timeout``. With a ``budgets_dir``
    the processes grading one class share each timing (see ``SharedBudgets``).
    """

    def __init__(self, part_timeout: float = DEFAULT_PART_TIMEOUT, reference_dir: str = "",
                 protected: Sequence[str] = (), budgets_dir: str = "") -> None:
        self.part_timeout = part_timeout
        self.reference_dir = reference_dir
        self.protected = tuple(protected)
        self.shared = SharedBudgets(budgets_dir, part_timeout) if budgets_dir else None
        self.timed: list[str] = []  # the assignments whose reference this process timed itself, in order
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
                def measure() -> Budgets:
                    budgets = calibrate(entry(assignment).load(), source, self.part_timeout)
                    self.timed.append(assignment)
                    return budgets

                self._budgets[assignment] = self.shared.get(assignment, measure) if self.shared else measure()
            else:
                self._budgets[assignment] = Budgets.uniform(self.part_timeout)
        return self._budgets[assignment]

    def grade(self, assignment: str, source: str) -> SubmissionResult:
        known = entry(assignment)
        return grade_submission(known.load(), source, self.budgets(known.assignment), protected=self.protected,
                                reference_source=self.reference_source(known.assignment))


class SharedBudgets:
    """Time budgets one grading process measured, read by the others grading the same class.

    Every worker used to time the reference itself, at the same moment as the others: at ``-j 2``
    each assignment's reference was graded twice, about 2 s of both cores each time. Now the first
    worker to need an assignment's budgets claims them (a file created exclusively, holding its
    pid), times the reference and writes them; the others wait for that file. A claimant that
    fails (the reference fails a part) gives its claim back, so the next one times the reference
    itself and fails with the same message; one that died (its pid is gone) or takes longer than
    grading the reference may take is not waited for.
    """

    POLL = 0.05  # seconds between looks while another worker times the reference

    def __init__(self, folder: str, part_timeout: float) -> None:
        self.folder = folder
        self.part_timeout = part_timeout
        os.makedirs(folder, exist_ok=True)

    def get(self, assignment: str, measure: Callable[[], Budgets]) -> Budgets:
        path = os.path.join(self.folder, f"{assignment}.json")
        claim_path = path + ".claim"
        # the longest another worker's timing can take: every part to the part timeout
        deadline = time.monotonic() + len(entry(assignment).parts) * self.part_timeout + 30
        while True:
            found = _read_budgets(path)
            if found is not None:
                return found
            if claim(claim_path):
                found = _read_budgets(path)  # the last claimant may have written them and let go just now
                if found is None:
                    break
                os.unlink(claim_path)
                return found
            alive = _claimant_alive(claim_path)
            if alive is False or time.monotonic() > deadline:
                return measure()  # the claimant is gone (or stuck): time it here
            time.sleep(self.POLL)  # alive, or the claim was just given back: look again
        try:
            budgets = measure()
        except BaseException:
            os.unlink(claim_path)
            raise
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(asdict(budgets), handle)
        os.replace(tmp, path)
        os.unlink(claim_path)  # the budgets are there: nobody looks at the claim any more
        return budgets


def _read_budgets(path: str) -> Budgets | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return Budgets(**json.load(handle))
    except FileNotFoundError:
        return None


def claim(path: str) -> bool:
    """True for exactly one of the processes that ask (the claim file is created exclusively); the
    file then says which process it is. Claims a job or an assignment's timing alike."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(str(os.getpid()))
    return True


def _claimant_alive(claim: str) -> bool | None:
    """Is the process that holds ``claim`` running? None when no one holds it (it was given back)
    or its pid is not written yet; False when that process is gone."""
    try:
        with open(claim, encoding="utf-8") as handle:
            pid = int(handle.read())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the pid: ours is gone
        return False
    return True
