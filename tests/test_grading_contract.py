"""The grading contract, end to end: real nbgrader, the real CLI, real submissions.

Every fixture in grader/fixtures/<assignment>/ is graded once by ``python -m grader
autograde`` into one course (exercise 1, then exercises 2 to 7 together from one folder of
oddly named files), with two parallel workers; a separate test grades serially in nbgrader's
own process. The score of every part is pinned in the fixture.py beside the notebooks: the
solution gets full marks, the untouched notebook none, each wrong answer exactly what it earns,
and each gaming attempt nothing for the part it cheats on.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from kernel_session import AsyncUnixSocketKernelManager

from distlab.grading.catalog import ENTRIES

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "grader" / "fixtures"
ASSIGNMENT = "ex1_all_reduce_rs_ag"
RING = "ex2_ring_all_reduce"
TREE = "ex3_tree_broadcast"
SHUFFLE = "ex4_all_to_all"
BUCKETS = "ex5_bucketed_allreduce"
ZERO = "ex6_zero1"
COST = "ex7_cost_model"
PART_TIMEOUT = 20.0

# grading every fixture of every exercise is one fixture: on a slow, loaded day it takes longer than
# the suite's 300 s per test; the grader's own deadline (900 s, in _grader) is the one that counts
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

sys.path.insert(0, str(FIXTURES))
try:
    import make_fixtures  # each exercise's pins live beside its fixtures; bench/bench_grading.py reads them too
finally:
    sys.path.pop(0)
FIXTURE = make_fixtures.exercises()
PARTS, PINNED = FIXTURE[ASSIGNMENT].PARTS, FIXTURE[ASSIGNMENT].PINNED
# assignment -> (file-name mark, parts, pins, max score), for the exercises graded from one inbox
MAX_SCORE = {RING: 8, TREE: 8, SHUFFLE: 8, BUCKETS: 8, ZERO: 8, COST: 10}
INBOX = {a: (int(a.split("_")[0].removeprefix("ex")), FIXTURE[a].PARTS, FIXTURE[a].PINNED, top)
         for a, top in MAX_SCORE.items()}


def _grader(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Autograde every fixture once, with two parallel grading processes."""
    course = tmp_path_factory.mktemp("course")
    inbox = tmp_path_factory.mktemp("inbox")  # two assignments, file names as students send them
    for assignment, (mark, *_) in INBOX.items():
        for fixture in (FIXTURES / assignment).glob("*.ipynb"):
            name = f"{fixture.stem.replace('_', ' ').title()} ({mark}).ipynb"
            (inbox / name).write_bytes(fixture.read_bytes())
    stdout = ""
    timed: list[list[str]] = []  # per run: the references each worker timed (their logs say so)
    for folder in (FIXTURES / ASSIGNMENT, inbox):
        done = _grader("autograde", str(folder), "--course", str(course), "--jobs", "2",
                       "--part-timeout", str(PART_TIMEOUT))
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stderr == ""
        stdout += done.stdout
        logs = "".join(log.read_text() for log in (course / "trusted").glob("worker-*.log"))
        timed.append(sorted(line.split()[4].rstrip(":") for line in logs.splitlines()
                            if line.startswith("timed the reference of ")))
    export = _grader("export", "--course", str(course))
    assert export.returncode == 0, export.stderr
    rows = {(row["student"], row["assignment"]): row for row in csv.DictReader(io.StringIO(export.stdout))}
    return {"course": course, "rows": rows, "stdout": stdout, "timed": timed}


def _scores(row: dict[str, str], parts: tuple[str, ...] = PARTS) -> dict[str, int]:
    return {part: round(float(row[f"test_{part}"])) for part in parts}


@pytest.mark.parametrize("student", sorted(PINNED))
def test_every_part_scores_what_it_earns(graded: dict[str, Any], student: str) -> None:
    row = graded["rows"][student, ASSIGNMENT]
    assert _scores(row) == PINNED[student]
    assert float(row["max_score"]) == 10  # a test cell that claims 100 points is put back to its own
    assert row["needs_manual_grade"] == "False"


def _student(fixture: str, mark: int = 2) -> str:
    """The id `python -m grader` makes of "Whole Tensor Ring (2).ipynb"."""
    return fixture.replace("_", " ").title().replace(" ", "_") + f"_{mark}"


@pytest.mark.parametrize(("assignment", "student"),
                         [(a, s) for a, (_, _, pins, _) in INBOX.items() for s in sorted(pins)])
def test_every_part_of_exercises_2_to_7_scores_what_it_earns(
        graded: dict[str, Any], assignment: str, student: str) -> None:
    mark, parts, pins, top = INBOX[assignment]
    row = graded["rows"][_student(student, mark), assignment]
    assert _scores(row, parts) == pins[student]
    assert float(row["max_score"]) == top
    assert row["needs_manual_grade"] == "False"


def test_every_submission_is_graded(graded: dict[str, Any]) -> None:
    expected = {(s, ASSIGNMENT) for s in PINNED}
    assert sorted(p.stem for p in (FIXTURES / ASSIGNMENT).glob("*.ipynb")) == sorted(PINNED)
    for assignment, (mark, _, pins, _) in INBOX.items():
        expected |= {(_student(s, mark), assignment) for s in pins}
        assert sorted(p.stem for p in (FIXTURES / assignment).glob("*.ipynb")) == sorted(pins)
    assert set(graded["rows"]) == expected
    assert f"graded {len(PINNED)} of {len(PINNED)} submissions" in graded["stdout"]
    inbox = sum(len(pins) for _, _, pins, _ in INBOX.values())
    assert f"graded {inbox} of {inbox} submissions" in graded["stdout"]


def _trusted(graded: dict[str, Any], student: str) -> dict[str, Any]:
    return json.loads((graded["course"] / "trusted" / student / f"{ASSIGNMENT}.json").read_text())


def test_a_deadlock_costs_only_its_parts_budget(graded: dict[str, Any]) -> None:
    result = _trusted(graded, "deadlock")
    hung = {p["part"]: p for p in result["parts"] if not p["passed"]}
    assert sorted(hung) == ["indivisible", "shapes"]
    for part in hung.values():
        assert "did not finish" in part["message"]
        assert "stuck at line" in part["message"]
        assert part["seconds"] < PART_TIMEOUT + 10


def test_a_submission_that_hangs_everywhere_pays_about_one_timeout(graded: dict[str, Any]) -> None:
    """Seven parts hang; each has its own verdict. The first spends the submission's one grace;
    the others get only a few times the reference's time, so the whole submission costs a small
    fraction of one timeout per part (the old design: 7 x PART_TIMEOUT)."""
    looping = _trusted(graded, "infinite_loop")
    parts = looping["parts"]
    assert [p["passed"] for p in parts] == [False] * len(PARTS)
    assert all("did not finish" in p["message"] for p in parts)
    first, later = parts[0]["seconds"], [p["seconds"] for p in parts[1:]]
    assert max(later) < first, (first, later)  # the grace is spent once
    # each later part stops at its own small budget, never at the part timeout the old design paid
    # seven times (a bound in budgets, not in wall-clock seconds: this machine may be loaded)
    assert all(seconds < PART_TIMEOUT for seconds in later), later


def test_two_workers_time_each_reference_once_per_run(graded: dict[str, Any]) -> None:
    """Both workers need every assignment's budgets; one times the reference, the other reads it."""
    assert graded["timed"] == [[ASSIGNMENT], sorted(INBOX)]


def test_autograde_shows_progress_and_a_summary(graded: dict[str, Any]) -> None:
    lines = graded["stdout"].splitlines()
    progress = [line for line in lines if line.startswith("[")]
    assert len(progress) == len(PINNED) + sum(len(pins) for _, _, pins, _ in INBOX.values())
    first = next(line for line in progress if " solution " in line and ASSIGNMENT in line)
    assert "10/10" in first and first.rstrip().endswith(" s")
    assert any(line.startswith("slowest: ") for line in lines)
    assert "failed to grade: none" in graded["stdout"]


def test_feedback_says_why_without_revealing_hidden_tests(graded: dict[str, Any]) -> None:
    done = _grader("feedback", "--course", str(graded["course"]))
    assert done.returncode == 0, done.stdout + done.stderr
    feedback = graded["course"] / "feedback"
    wrong = (feedback / "forgot_subgroup" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "groups=[[0, 2], [1, 3]]: rank 0 got [" in wrong
    assert "expected [" in wrong
    hung = (feedback / "deadlock" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "did not finish" in hung
    for page in feedback.rglob("*.html"):
        text = page.read_text()
        assert "HIDDEN TESTS" not in text and "distlab.grading.check(" not in text, page


def test_serial_grading_in_the_nbgrader_process(tmp_path: Path) -> None:
    """--jobs 1: no worker processes, TrustedExecute grades inside nbgrader's own process."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "Bob Smith - ex1 (final).ipynb").write_bytes(
        (FIXTURES / ASSIGNMENT / "forgot_subgroup.ipynb").read_bytes())
    course = tmp_path / "course"
    done = _grader("autograde", str(inbox), "--course", str(course), "--jobs", "1",
                   "--part-timeout", str(PART_TIMEOUT))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (course / "trusted").exists()  # nothing was computed ahead
    export = _grader("export", "--course", str(course))
    rows = list(csv.DictReader(io.StringIO(export.stdout)))
    assert [(r["student"], r["assignment"]) for r in rows] == [("Bob_Smith_-_ex1_final", ASSIGNMENT)]
    assert _scores(rows[0]) == PINNED["forgot_subgroup"]


def test_a_platforms_zip_is_graded_with_each_student_named_by_their_folder(tmp_path: Path) -> None:
    """A learning platform's download: one folder per student, each holding the released
    notebook's own name (a Chinese name stored in GBK, as Windows' zip tool does). Every student
    was named after the file ("ex1_all_reduce_rs_ag", then "..._2"); the zip had to be unpacked by hand."""
    from test_grader_inbox import zip_of

    notebook = f"{ASSIGNMENT}.ipynb"
    archive = zip_of(tmp_path / "ex1 download.zip", {
        f"Bob Smith_1002_assignsubmission_file_/{notebook}": (FIXTURES / ASSIGNMENT / "forgot_subgroup.ipynb").read_bytes(),
        f"张三_1001_assignsubmission_file_/{notebook}".encode("gbk"): (FIXTURES / ASSIGNMENT / "solution.ipynb").read_bytes(),
        "Bob Smith_1002_assignsubmission_file_/notes.txt": b"I also tried a tree.",
    })
    course = tmp_path / "course"
    done = _grader("autograde", str(archive), "--course", str(course), "--part-timeout", str(PART_TIMEOUT))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "skipped Bob Smith_1002_assignsubmission_file_/notes.txt in ex1 download.zip: not a notebook\n"
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(_grader("export", "--course", str(course)).stdout))}
    assert sorted(rows) == ["Bob_Smith_1002", "张三_1001"], rows
    assert _scores(rows["张三_1001"]) == PINNED["solution"]
    assert _scores(rows["Bob_Smith_1002"]) == PINNED["forgot_subgroup"]
    # graded again from the course's own submitted/ (where nbgrader's collect puts them): filing a
    # submission there first removed its folder, so the notebook being graded was deleted
    submitted = course / "submitted"
    done = _grader("autograde", str(submitted), "--course", str(course), "--jobs", "1",
                   "--part-timeout", str(PART_TIMEOUT))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.relative_to(submitted).as_posix() for p in submitted.rglob("*.ipynb")) == [
        f"Bob_Smith_1002/{ASSIGNMENT}/{notebook}", f"张三_1001/{ASSIGNMENT}/{notebook}"]
    again = {r["student"]: r for r in csv.DictReader(io.StringIO(_grader("export", "--course", str(course)).stdout))}
    assert {s: _scores(r) for s, r in again.items()} == {s: _scores(r) for s, r in rows.items()}


# --- release ------------------------------------------------------------------------------------------
def test_exercises_equal_a_fresh_release() -> None:
    done = _grader("release", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("assignment", [ASSIGNMENT, RING, TREE, SHUFFLE, BUCKETS, ZERO, COST])
def test_released_notebooks_hold_no_solution_or_hidden_test(assignment: str) -> None:
    source = nbformat.read(REPO / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    secret, public = set(), set()
    for cell in source.cells:
        inside = False
        for line in cell.source.splitlines():
            if "### BEGIN SOLUTION" in line or "### BEGIN HIDDEN TESTS" in line:
                inside = True
            elif "### END SOLUTION" in line or "### END HIDDEN TESTS" in line:
                inside = False
            elif line.strip():
                (secret if inside else public).add(line.strip())
    secret -= public  # a line the students see elsewhere in the notebook gives nothing away
    assert len(secret) > 3
    released = (REPO / "exercises" / assignment / f"{assignment}.ipynb").read_text()
    for line in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", *sorted(secret)):
        assert json.dumps(line)[1:-1] not in released, line


def test_fixtures_follow_the_released_notebook() -> None:
    assert sorted(FIXTURE) == sorted(e.assignment for e in ENTRIES)  # every exercise has its fixtures
    for name, nb in make_fixtures.fixtures().items():
        assert (FIXTURES / name).read_text() == nbformat.writes(nb) + "\n", f"{name}: run make_fixtures.py"


# --- the learner's kernel -------------------------------------------------------------------------------
def _validate(path: Path) -> dict[str, Any]:
    from nbgrader.validator import Validator
    from traitlets.config import Config

    config = Config()
    config.Validator.validate_all = True  # any error or stderr in any cell fails, not only in tests
    config.Execute.timeout = 300
    # Unix sockets, not TCP ports another worker's process may take first (see kernel_session)
    config.Execute.kernel_manager_class = AsyncUnixSocketKernelManager
    return Validator(config=config).validate(str(path))  # type: ignore[no-any-return]


@pytest.mark.parametrize("assignment", [ASSIGNMENT, RING, TREE, SHUFFLE, BUCKETS, ZERO, COST])
def test_the_solution_passes_every_visible_and_hidden_test_in_a_kernel(assignment: str) -> None:
    assert _validate(REPO / "solutions" / assignment / f"{assignment}.ipynb") == {}


@pytest.mark.parametrize("assignment", [ASSIGNMENT, RING, TREE, SHUFFLE, BUCKETS, ZERO, COST])
def test_every_visible_check_fails_on_the_starter_code(assignment: str) -> None:
    """With the solution (test above) every visible check passes; with the starter, each one fails."""
    from distlab.grading.catalog import entry

    untouched = FIXTURES / assignment / "untouched.ipynb"
    failed = {cell["source"].strip(): cell["raw_error"] for cell in _validate(untouched)["failed"]}
    nb = nbformat.read(untouched, as_version=4)
    checks = {c.metadata["nbgrader"]["grade_id"]: c.source.strip() for c in nb.cells
              if c.metadata.get("nbgrader", {}).get("grade")}
    assert sorted(checks) == sorted(f"test_{part}" for part in entry(assignment).parts)
    for grade_id, source in checks.items():
        assert source in failed, f"{grade_id} passes on the starter code"
        assert "NotImplementedError" in failed[source], (grade_id, failed[source])


def test_a_file_that_is_no_notebook_is_named_not_graded_and_fails_the_run(tmp_path: Path) -> None:
    """An empty or cut-off upload, or a photo renamed .ipynb: one line saying why, no nbgrader
    traceback, the rest of the class graded, and a non-zero exit so a script notices."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "ada.ipynb").write_bytes((FIXTURES / ASSIGNMENT / "solution.ipynb").read_bytes())
    (inbox / "bob.ipynb").write_text("")
    (inbox / "cy.ipynb").write_text((FIXTURES / ASSIGNMENT / "solution.ipynb").read_text()[:500])
    (inbox / "dee.ipynb").write_bytes(bytes(range(256)) * 4)
    done = _grader("autograde", str(inbox), "--course", str(tmp_path / "course"), "--jobs", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "Traceback" not in said and "[ERROR]" not in said, said
    assert "bob                          not graded: not a notebook: the file is empty" in said
    assert "cy                           not graded: not a notebook: not JSON (" in said
    assert "dee                          not graded: not a notebook: not text" in said
    assert "ada                          ex1_all_reduce_rs_ag          10/10" in said
    assert "graded 1 of 4 submissions" in said and "failed to grade: bob, cy, dee" in said


# --- one class of unusual submissions, graded in one run ------------------------------------------------
def _solution() -> nbformat.NotebookNode:
    """A fresh copy of exercise 1's solved fixture, for a writer below to edit."""
    return nbformat.read(FIXTURES / ASSIGNMENT / "solution.ipynb", as_version=4)


def _answer_at(nb: nbformat.NotebookNode) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution"))


def _visible_test_at(nb: nbformat.NotebookNode) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade")
                and c.metadata["nbgrader"].get("locked"))


def _copied_cells(inbox: Path) -> None:
    """JupyterLab copies a cell with its nbgrader metadata: a student who pasted the answer cell
    (and a visible test) to try things leaves two cells with one grade id."""
    for student, first_source in (("copied_ada", None), ("copied_bob", "def all_reduce_rs_ag(*args):\n    pass\n")):
        nb = _solution()
        answer, visible = _answer_at(nb), _visible_test_at(nb)
        pasted = [copy.deepcopy(nb.cells[visible]), copy.deepcopy(nb.cells[answer])]
        for cell, new_id in zip(pasted, ("pasted-test", "pasted-answer"), strict=True):
            cell.id = new_id  # a paste gets a fresh id and keeps the metadata
        if first_source is not None:  # bob's first try stayed above; his working copy is the last
            nb.cells[answer].source = first_source
        nb.cells.insert(visible + 1, pasted[0])
        nb.cells.insert(answer + 1, pasted[1])
        nbformat.write(nb, inbox / f"{student}.ipynb")


def _lost_ids(inbox: Path) -> None:
    """A notebook saved by a tool that drops cell metadata (lost_ada), and one whose answer cell
    was deleted and typed again as a new cell (retyped_bob)."""
    stripped = _solution()
    for cell in stripped.cells:
        cell.metadata = nbformat.NotebookNode()
    nbformat.write(stripped, inbox / "lost_ada.ipynb")
    retyped = _solution()
    answer = retyped.cells.pop(_answer_at(retyped))
    retyped.cells.append(nbformat.v4.new_code_cell(answer.source))
    nbformat.write(retyped, inbox / "retyped_bob.ipynb")


LEFT_AROUND = {
    "timed_ada": lambda source: "%%time\n" + source,
    "pip_bob": lambda source: "!pip install --quiet numpy\n%matplotlib inline\n" + source
                              + "\nt = torch.ones(3)\n%timeit -n 1 -r 1 all_reduce_rs_ag(t)\nx = %time 1 + 1\n",
    "inner_cy": lambda source: source.replace('    """All-reduce', '    %time pass\n    """All-reduce', 1),
    "demo_dee": lambda source: source + "\n\ndef demo():\n    t = torch.arange(5.0)\n    all_reduce_rs_ag(t)\n"
                                        "    return t\n\n\nprint(distlab.run(demo, world_size=3))\n",
}


def _left_around(inbox: Path) -> None:
    """IPython lines a student leaves in the answer cell, and a demo that starts ranks."""
    for student, edit in LEFT_AROUND.items():
        nb = _solution()
        answer = nb.cells[_answer_at(nb)]
        before = answer.source
        answer.source = edit(answer.source)
        assert answer.source != before, student
        nbformat.write(nb, inbox / f"{student}.ipynb")


def _chinese(inbox: Path) -> None:
    """The Chinese release with the English fixtures' answers: solved, wrong (with a visible test
    edited under Chinese comments) and untouched."""
    chinese = nbformat.read(REPO / "exercises" / "zh" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    for name in ("solution", "forgot_subgroup", "untouched"):
        english = nbformat.read(FIXTURES / ASSIGNMENT / f"{name}.ipynb", as_version=4) if name != "untouched" else chinese
        answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in english.cells
                   if c.metadata.get("nbgrader", {}).get("solution")}
        nb = nbformat.from_dict(chinese)
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id in answers:
                cell.source = answers[grade_id]
            if name == "forgot_subgroup" and grade_id == "test_divisible":  # Chinese comments, edited code
                cell.source = cell.source.replace("assert torch.equal", "assert True or torch.equal")
        nbformat.write(nb, inbox / f"zh_{name}.ipynb")


def _unreadable_metadata(inbox: Path) -> None:
    """Hand-edited nbgrader metadata (broken_eve): a string where nbgrader expects a mapping, a list
    as a test cell's grade id, a list as the answer cell's metadata. nbgrader fails on such a
    notebook, and the grader skipped it as having no answer cell."""
    nb = _solution()
    answer, test = nb.cells[_answer_at(nb)], nb.cells[_visible_test_at(nb)]
    nb.cells[0].metadata["nbgrader"] = "oops"
    test.metadata["nbgrader"]["grade_id"] = ["test", "ops"]
    answer.metadata["nbgrader"] = []
    (inbox / "broken_eve.ipynb").write_text(json.dumps(nb), encoding="utf-8")  # nbformat would refuse to write it


@pytest.fixture(scope="module")
def unusual_class(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One class's inbox of exercise 1 as an instructor gets it: copied cells, lost metadata,
    IPython lines around the answer, Chinese notebooks, unreadable metadata. Graded in one run, as the instructor would,
    with the default workers."""
    inbox = tmp_path_factory.mktemp("unusual")
    for write in (_copied_cells, _lost_ids, _left_around, _chinese, _unreadable_metadata):
        write(inbox)
    course = tmp_path_factory.mktemp("unusual_course")
    done = _grader("autograde", str(inbox), "--course", str(course), "--part-timeout", str(PART_TIMEOUT))
    export = _grader("export", "--course", str(course))
    assert export.returncode == 0, export.stderr
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(export.stdout))}
    return {"done": done, "said": done.stdout + done.stderr, "course": course, "rows": rows}


def test_an_unusual_class_is_graded_in_full(unusual_class: dict[str, Any]) -> None:
    done = unusual_class["done"]
    assert done.returncode == 0, unusual_class["said"]
    assert "Traceback" not in unusual_class["said"], unusual_class["said"]
    assert "graded 12 of 12 submissions" in done.stdout and "failed to grade: none" in done.stdout, done.stdout


def _full_marks(said: str, student: str) -> bool:
    return f"{student:<28} {ASSIGNMENT:<24}      10/10" in said


def test_a_submission_with_copied_cells_is_graded_from_the_last_copy(unusual_class: dict[str, Any]) -> None:
    """Two cells with one grade id: nbgrader 0.9 failed the whole submission (KeyError 'grade_id',
    not graded). As nbgrader intends, the last copy is graded and the earlier ones are plain cells."""
    from distlab.grading.catalog import entry
    from distlab.grading.extract import solution_source
    from distlab.grading.nbgrader_hooks import source_digest

    solution_ids = entry(ASSIGNMENT).solution_ids
    for student in ("copied_ada", "copied_bob"):
        assert _full_marks(unusual_class["said"], student), unusual_class["said"]
        # graded once: the parallel pass graded the copy nbgrader keeps, so nbgrader took its result
        graded = nbformat.read(unusual_class["course"] / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", 4)
        computed = json.loads((unusual_class["course"] / "trusted" / student / f"{ASSIGNMENT}.json").read_text())
        assert computed["source_sha256"] == source_digest(solution_source(graded, solution_ids)), student


def test_an_answer_cell_that_lost_its_nbgrader_id_is_found_by_the_function_it_defines(
        unusual_class: dict[str, Any]) -> None:
    """lost_ada's was skipped as "no answer cell of any known assignment", retyped_bob got 0. The
    cell that defines the graded function is the answer, and the instructor is told so."""
    said = unusual_class["said"]
    for student in ("lost_ada", "retyped_bob"):
        assert _full_marks(said, student), said
        assert f"{student}: no cell carries the answer's nbgrader id (a tool dropped the cells' metadata): graded " \
               f"from cell " in said, said
    others = [line for line in said.splitlines() if "no cell carries the answer's nbgrader id" in line]
    assert len(others) == 3, others  # and broken_eve's (below): no other submission is said to have lost it


def test_nbgrader_metadata_that_cannot_be_read_is_dropped_and_the_answer_graded(unusual_class: dict[str, Any]) -> None:
    said = unusual_class["said"]
    assert _full_marks(said, "broken_eve"), said
    assert "broken_eve: the nbgrader metadata of 3 cells could not be read and was dropped" in said, said
    assert "broken_eve: no cell carries the answer's nbgrader id" in said, said
    graded = nbformat.read(unusual_class["course"] / "autograded" / "broken_eve" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", 4)
    grade_ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in graded.cells]
    assert "test_divisible" in grade_ids and all(isinstance(g, (str, type(None))) for g in grade_ids), grade_ids  # put back


def test_what_a_student_leaves_around_the_function_does_not_cost_the_answer(unusual_class: dict[str, Any]) -> None:
    """The answer cell ran in IPython, so a student may leave `%%time` on top, a `!pip install`
    line or a `%timeit` of their function in it: the grader read the cell as Python and every part
    scored 0 (a SyntaxError). Those lines do nothing when graded; the function is what counts. So
    with a demo at the end that starts ranks (demo_dee), which a grading rank may not: the cell
    raises after defining the function, and nbgrader grades what a cell defined before it raised."""
    for student in LEFT_AROUND:
        assert _full_marks(unusual_class["said"], student), unusual_class["said"]


def test_a_chinese_submission_is_graded_the_same_with_feedback_in_chinese(unusual_class: dict[str, Any]) -> None:
    """The Chinese release has the same grade ids and points: one gradebook, the same scores,
    and the student reads the notebook and the grader's verdicts in Chinese."""
    chinese = nbformat.read(REPO / "exercises" / "zh" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    course, rows = unusual_class["course"], unusual_class["rows"]
    assert "has changed" not in unusual_class["done"].stderr, unusual_class["done"].stderr  # Chinese prose is no "tampering"
    assert _scores(rows["zh_solution"]) == PINNED["solution"]
    assert _scores(rows["zh_forgot_subgroup"]) == PINNED["forgot_subgroup"]
    assert not any(_scores(rows["zh_untouched"]).values())
    from nbgrader.api import Gradebook

    answer = next(c.metadata["nbgrader"]["grade_id"] for c in chinese.cells if c.metadata.get("nbgrader", {}).get("solution"))
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:  # as for an untouched English answer
        comments = {student: gradebook.find_comment(answer, ASSIGNMENT, ASSIGNMENT, student).auto_comment
                    for student in ("zh_untouched", "zh_solution")}
    assert comments == {"zh_untouched": "No response.", "zh_solution": None}, comments

    graded = nbformat.read(course / "autograded" / "zh_solution" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", 4)
    assert graded.cells[0].source == chinese.cells[0].source, "the Chinese prose stays"
    locked = [(c.source, g.source) for c, g in zip(chinese.cells, graded.cells, strict=True)
              if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("locked")]
    assert any("持有" in released for released, _ in locked)  # a comment of the try cell, in Chinese
    for released, kept in locked:  # a test cell gets its hidden tests back, in between
        assert set(released.splitlines()) <= set(kept.splitlines()), "the Chinese comments and captions stay"
    edited = nbformat.read(course / "autograded" / "zh_forgot_subgroup" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", 4)
    restored = next(c.source for c in edited.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_divisible")
    assert "assert True or" not in restored and "rank r holds" in restored, restored  # the instructor's cell
    shown = [o.get("text", "") for c in graded.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any(t.startswith("通过（") for t in shown), shown
    assert _grader("feedback", "--course", str(course)).returncode == 0
    page = (course / "feedback" / "zh_forgot_subgroup" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "练习 1" in page and "通过（" in page and "未通过" in page and "HIDDEN TESTS" not in page
