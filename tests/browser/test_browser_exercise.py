"""An exercise as a student meets it: open it, write the answer, run the visible tests, Validate.

The student works on a copy under artifacts/browser/ (git-ignored), as after an nbgrader
fetch: Validate saves the notebook first, and the released exercise in exercises/ must stay
as committed.
"""

from __future__ import annotations

import shutil

import nbformat
import pytest

from browser.labserver import REPO, SCRATCH

pytestmark = pytest.mark.browser

EXERCISE = "ex1_all_reduce_rs_ag"


def reference_answers(exercise: str) -> dict[str, str]:
    """grade_id -> the instructor's answer (solutions/, solution markers removed)."""
    nb = nbformat.read(REPO / "solutions" / exercise / f"{exercise}.ipynb", as_version=4)
    answers = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            lines = [ln for ln in cell.source.splitlines() if "### BEGIN SOLUTION" not in ln
                     and "### END SOLUTION" not in ln]
            answers[meta["grade_id"]] = "\n".join(lines)
    return answers


def student_copy(exercise: str) -> str:
    """Copy exercises/<a>/ to artifacts/browser/<a>/ and return the notebook's served path."""
    src = REPO / "exercises" / exercise
    assert (src / f"{exercise}.ipynb").exists(), f"{src} has no released notebook"
    dst = SCRATCH / exercise
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return f"artifacts/browser/{exercise}/{exercise}.ipynb"


def test_student_answers_exercise_and_visible_tests_pass(lab_ui):
    path = student_copy(EXERCISE)
    released = nbformat.read(REPO / path, as_version=4)
    grade_ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in released.cells]
    test_cells = [i for i, c in enumerate(released.cells)
                  if c.metadata.get("nbgrader", {}).get("grade")]
    assert test_cells, "the exercise has no visible test cells"

    nb = lab_ui.open(path)
    for grade_id, answer in reference_answers(EXERCISE).items():
        nb.set_source(grade_ids.index(grade_id), answer)
    nb.screenshot("exercise_answered")

    nb.run_all()
    unrun = nb.unrun_cells()
    assert not unrun, f"Run All stopped before cells {unrun}: {nb.error_outputs()}"
    assert not nb.error_outputs(), nb.error_outputs()
    nb.cells.nth(test_cells[0]).scroll_into_view_if_needed()
    nb.screenshot("exercise_visible_tests_passed")

    # nbgrader's own button: saves the student's copy and runs it on the server
    nb.page.locator(".validate-button").click()
    dialog = nb.page.locator(".jp-Dialog")
    dialog.wait_for(timeout=180_000)
    nb.screenshot("exercise_validated")
    text = dialog.inner_text()
    assert "Success" in text and "passes" in text, text
    dialog.get_by_role("button", name="Ok").click()
    lab_ui.assert_console_clean()
