"""nbgrader glue: grade cells get their outputs from trusted checks, not from the student's kernel.

``TrustedExecute`` takes the place of nbgrader's ``Execute`` in ``Autograde.autograde_preprocessors``.
It runs after nbgrader's sanitising steps (which restore edited, locked and deleted test cells from
the instructor's copy), grades the answer cells on fresh ranks (or takes the result a parallel
grading process already computed for the same source), and writes each grade cell's outputs:
nothing but a line on stdout when the part passed, an error carrying the feedback when it did not.
nbgrader's own ``SaveAutoGrades`` then records the scores as usual, and ``generate_feedback``
shows the messages. The student's kernel never runs, so nothing in it (a patched helper, a
trailing NaN, redirected stderr, a crash) can change a grade.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_output
from nbgrader.api import MissingEntry
from nbgrader.preprocessors import ClearHiddenTests, DeduplicateIds, NbGraderPreprocessor, OverwriteCells
from nbgrader.utils import compute_checksum
from traitlets import Float, List, Unicode

from distlab.edition import Catalogue, language_of, translate_code
from distlab.grading.catalog import entry
from distlab.grading.extract import solution_source
from distlab.grading.spec import DEFAULT_PART_TIMEOUT, SubmissionResult, source_digest
from distlab.i18n import tr

_SESSIONS: dict[tuple[Any, ...], Any] = {}


def results_path(results_dir: str, student: str, assignment: str) -> str:
    return os.path.join(results_dir, student, f"{assignment}.json")


class TrustedExecute(NbGraderPreprocessor):
    """Fill every grade cell's outputs from checks run in fresh processes."""

    results_dir = Unicode(
        "", help="Folder of results computed ahead (one <student>/<assignment>.json each)."
    ).tag(config=True)
    part_timeout = Float(DEFAULT_PART_TIMEOUT, help="Seconds any graded part may run at most.").tag(config=True)
    reference_dir = Unicode(
        "", help="Folder of nbgrader source notebooks (<a>/<a>.ipynb): their answers set the time budgets."
    ).tag(config=True)
    protected = List(Unicode(), help="Folders that submissions may not read while graded.").tag(config=True)

    def preprocess(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        info = resources["nbgrader"]
        try:
            known = entry(info["assignment"])
        except KeyError:  # no trusted checks: every test cell fails, nothing passes by default
            known = None
        result = None
        if known is not None:
            source = solution_source(nb, known.solution_ids)
            result = self._computed(info["student"], known.assignment, source)
            if result is None:
                self.log.info("Grading %s in fresh rank processes", info["student"])
                result = self._session().grade(known.assignment, source)
        parts = result.by_grade_id() if result else {}
        lang = language_of(nb)  # feedback in the language the student was given the exercise in
        count = 0
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            cell.outputs = []
            cell.execution_count = None
            grade = cell.metadata.get("nbgrader", {})
            if not grade.get("grade"):
                continue
            count += 1
            cell.execution_count = count
            part = parts.get(grade.get("grade_id"))
            if part is None:
                cell.outputs = [_error("NoTrustedCheck", tr("the grader has no check for this cell", lang))]
            elif part.passed:
                cell.outputs = [new_output("stream", name="stdout",
                                           text=tr("passed ({cases} cases, checked by the grader)", lang,
                                                   cases=part.cases) + "\n")]
            else:
                message = part.message if lang == "en" else tr(
                    "not passed; the grader says: {reason}", lang, reason=part.message)
                cell.outputs = [_error("PartFailed", message)]
        return nb, resources

    def _session(self) -> Any:
        from distlab.grading.session import GradingSession  # imports torch

        key = (self.part_timeout, self.reference_dir, tuple(self.protected))
        if key not in _SESSIONS:  # one per process: the reference is timed once, not per submission
            _SESSIONS[key] = GradingSession(self.part_timeout, self.reference_dir, self.protected)
        return _SESSIONS[key]

    def _computed(self, student: str, assignment: str, source: str) -> SubmissionResult | None:
        """A result from the parallel pass, if there is one for exactly this source."""
        if not self.results_dir:
            return None
        try:
            with open(results_path(self.results_dir, student, assignment)) as handle:
                result = SubmissionResult.from_json(handle.read())
        except (OSError, ValueError, TypeError, KeyError):
            return None
        if result.assignment != assignment or result.source_sha256 != source_digest(source):
            return None
        return result


def _error(name: str, message: str) -> Any:
    lines = message.splitlines() or [""]
    return new_output("error", ename=name, evalue=lines[0], traceback=[f"{name}: {lines[0]}", *lines[1:]])


class DropDuplicateIds(DeduplicateIds):
    """nbgrader's DeduplicateIds, leaving the earlier copies plain cells.

    JupyterLab copies a cell with its metadata, so a student who pasted the answer cell (or a
    test) to try something hands in two cells with one grade id. nbgrader keeps the last copy and
    empties the others' ``nbgrader`` metadata, which its OverwriteCells then reads a grade id from
    (nbgrader 0.9: KeyError, the whole submission not graded). Here the emptied metadata goes.
    """

    def preprocess_cell(self, cell: Any, resources: Any, index: int) -> tuple[Any, Any]:
        cell, resources = super().preprocess_cell(cell, resources, index)
        if cell.metadata.get("nbgrader") == {}:
            del cell.metadata["nbgrader"]
        return cell, resources


class RestoreDeletedTests(OverwriteCells):
    """nbgrader's OverwriteCells, with a sturdier way of putting deleted test cells back.

    nbgrader 0.9 inserts a deleted grade cell after the source cell that preceded it and fails
    with a KeyError (leaving the whole submission ungraded) when that cell is a locked markdown
    cell or was deleted too. Here it goes after the nearest earlier source cell still present,
    or first if there is none.
    """

    translations = Unicode(
        "", help="Folder of the editions' catalogues (LANG/ASSIGNMENT.md); empty: English only."
    ).tag(config=True)

    def preprocess(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        self._edition = language_of(nb)
        self._catalogue: Catalogue | None = None
        if self._edition != "en" and self.translations:
            path = Path(self.translations) / self._edition / f"{resources['nbgrader']['assignment']}.md"
            self._catalogue = Catalogue.load(path) if path.is_file() else None
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell: Any, resources: Any, index: int) -> tuple[Any, Any]:
        """A translated edition keeps its own prose: locked markdown carries no grade, and putting
        the English back would hand a Chinese student English feedback. A locked code cell keeps
        its translated comments and captions when it is exactly the release's translation of the
        instructor's cell; any other change puts the instructor's cell back, as in English."""
        info = cell.metadata.get("nbgrader", {})
        if (getattr(self, "_edition", "en") != "en" and cell.cell_type == "markdown"
                and info.get("locked") and not info.get("grade")):
            return cell, resources
        as_released = info.get("locked") or info.get("solution")
        english = self._english_of(cell) if cell.cell_type == "code" and as_released else None
        if english is not None and info.get("locked"):
            cell.source = english  # nbgrader checks (and keeps) the instructor's text, hidden tests included
            cell, resources = super().preprocess_cell(cell, resources, index)
            cell.source = translate_code(english, self._catalogue)[0]  # type: ignore[arg-type]
            return cell, resources
        cell, resources = super().preprocess_cell(cell, resources, index)
        if english is not None:  # an answer cell as released, in translation: nbgrader's "No response."
            cell.metadata.nbgrader["checksum"] = compute_checksum(cell)
        return cell, resources

    def _english_of(self, cell: Any) -> str | None:
        """The instructor's source of a cell whose text is the release's translation of it (its
        hidden tests cleared, as in the release), else None."""
        catalogue = getattr(self, "_catalogue", None)
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if catalogue is None or grade_id is None:
            return None
        try:
            english = str(self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id).source)
        except MissingEntry:
            return None
        released = nbformat.from_dict({"cell_type": "code", "source": english,
                                       "metadata": {"nbgrader": {"grade": True, "grade_id": grade_id}}})
        released, _ = ClearHiddenTests(config=self.config).preprocess_cell(released, {}, 0)
        if cell.source == released.source or cell.source != translate_code(released.source, catalogue)[0]:
            return None
        return english

    def add_missing_grade_cells(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        source_nb = self.gradebook.find_notebook(self.notebook_id, self.assignment_id)
        order = [cell.name for cell in source_nb.source_cells]
        solutions = {cell.name for cell in source_nb.solution_cells}
        for grade_cell in source_nb.grade_cells:
            present = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}
            if grade_cell.name in present:
                continue
            self.log.warning("Missing grade cell %s: putting it back", grade_cell.name)
            source = source_nb.source_cells[order.index(grade_cell.name)]
            cell = self.missing_cell_transform(source, grade_cell.max_score,
                                               is_solution=grade_cell.name in solutions)
            cell["id"] = f"{grade_cell.name}-restored"[:64]
            earlier = order[: order.index(grade_cell.name)]
            position = 0
            for index, existing in enumerate(nb.cells):
                if existing.metadata.get("nbgrader", {}).get("grade_id") in earlier:
                    position = index + 1
            nb.cells.insert(position, cell)
        return nb, resources
