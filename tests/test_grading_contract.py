"""The grading contract, end to end: real nbgrader, the real CLI, real submissions.

Every fixture in grader/fixtures/submissions/<assignment>/ is graded once by ``python -m grader
autograde`` into one course (exercise 1, then exercises 2 to 6 together from one folder of
oddly named files), with two parallel workers; a separate test grades serially in nbgrader's
own process and the score of every part is pinned below: the solution gets full marks, the untouched notebook none, each
wrong answer exactly what it earns, and each gaming attempt nothing for the part it cheats on.
"""

from __future__ import annotations

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

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "grader" / "fixtures" / "submissions"
ASSIGNMENT = "ex1_all_reduce_rs_ag"
RING = "ex2_ring_all_reduce"
TREE = "ex3_tree_broadcast"
SHUFFLE = "ex4_all_to_all"
BUCKETS = "ex5_bucketed_allreduce"
ZERO = "ex6_zero1"
PART_TIMEOUT = 20.0

pytestmark = pytest.mark.slow

PARTS = ("divisible", "indivisible", "shapes", "dtypes", "ops", "subgroup", "communication")
FULL = dict(zip(PARTS, (2, 2, 1, 1, 2, 1, 1), strict=True))
NONE = dict.fromkeys(PARTS, 0)


def _but(base: dict[str, int], **changes: int) -> dict[str, int]:
    return {**base, **changes}


# what each submission earns, part by part (max 10)
PINNED: dict[str, dict[str, int]] = {
    "solution": FULL,
    "noisy_correct": FULL,  # prints and warnings on the ranks cost nothing
    "untouched": NONE,
    # wrong answers
    "off_by_one": _but(NONE, divisible=2, communication=1),  # ceil with world - 2: wrong if numel % world == 1
    "divisible_only": _but(NONE, divisible=2),
    "forgot_subgroup": _but(FULL, subgroup=0),
    "direct_all_reduce": _but(FULL, communication=0),
    "bypass_process_group": _but(FULL, communication=0),  # all_reduce via the ProcessGroup object
    "deadlock": _but(FULL, indivisible=0, shapes=0),  # hangs when numel < world size
    "kernel_dies": _but(FULL, divisible=0, indivisible=0, subgroup=0, communication=0),  # exits on 4 ranks
    # gaming attempts
    "gaming_check_helper": NONE,  # replaced distlab.grading.check, ex1.try_case and distlab.run
    "gaming_patch_torch": NONE,  # torch.equal, allclose, Tensor.__eq__ always true
    "gaming_always_equal": NONE,  # the tensor becomes a subclass whose __eq__ is always true
    "gaming_stderr": _but(FULL, subgroup=0),  # stderr silenced: earns what the answer earns
    "gaming_trailing_nan": NONE,  # every test cell ends in NaN and claims 100 points
    "gaming_edit_tests": _but(FULL, subgroup=0),  # test cells replaced by an assert that passes
    "gaming_delete_tests": _but(FULL, subgroup=0),  # the subgroup test cell deleted
}

RING_PARTS = ("divisible", "any_size", "steps", "bytes")
RING_FULL = dict.fromkeys(RING_PARTS, 2)
RING_PINNED: dict[str, dict[str, int]] = {
    "solution": RING_FULL,
    "untouched": dict.fromkeys(RING_PARTS, 0),
    "direct_all_reduce": _but(RING_FULL, steps=0, bytes=0),
    "whole_tensor_ring": _but(RING_FULL, steps=0, bytes=0),  # n - 1 messages, each the whole tensor
    "mirrored_ring": _but(RING_FULL, steps=0),  # right results, but sends to the left neighbour
    "reduce_scatter_only": dict.fromkeys(RING_PARTS, 0),
}

TREE_PARTS = ("from_zero", "any_source", "any_world_size", "rounds")
TREE_FULL = dict.fromkeys(TREE_PARTS, 2)
TREE_PINNED: dict[str, dict[str, int]] = {
    "solution": TREE_FULL,
    "untouched": dict.fromkeys(TREE_PARTS, 0),
    "direct_broadcast": _but(TREE_FULL, rounds=0),
    "chain": _but(TREE_FULL, rounds=0),  # n - 1 rounds
    "star": _but(TREE_FULL, rounds=0),  # n - 1 rounds, all from the source
    "source_zero_only": _but(dict.fromkeys(TREE_PARTS, 0), from_zero=2),
}

SHUFFLE_PARTS = ("equal_chunks", "uneven_chunks", "messages")
SHUFFLE_FULL = dict.fromkeys(SHUFFLE_PARTS, 2)
SHUFFLE_PINNED: dict[str, dict[str, int]] = {
    "solution": SHUFFLE_FULL,
    "batched": SHUFFLE_FULL,  # batch_isend_irecv is point-to-point too
    "untouched": dict.fromkeys(SHUFFLE_PARTS, 0),
    "direct_all_to_all": _but(dict.fromkeys(SHUFFLE_PARTS, 0), equal_chunks=2),  # gloo: equal sizes only
    "forgot_own_chunk": dict.fromkeys(SHUFFLE_PARTS, 0),
    "split_messages": _but(SHUFFLE_FULL, messages=0),  # two messages per pair
}
BUCKETS_PARTS = ("averages", "buckets", "frozen")
BUCKETS_FULL = {"averages": 3, "buckets": 3, "frozen": 2}
BUCKETS_PINNED: dict[str, dict[str, int]] = {
    "solution": BUCKETS_FULL,
    "untouched": dict.fromkeys(BUCKETS_PARTS, 0),
    "per_parameter": _but(BUCKETS_FULL, buckets=0, frozen=0),  # one all_reduce per gradient
    "one_bucket": _but(BUCKETS_FULL, buckets=0, frozen=0),  # ignores bucket_bytes
    "sum_not_average": dict.fromkeys(BUCKETS_PARTS, 0),
    "no_none_check": _but(BUCKETS_FULL, frozen=0),  # crashes on a gradient that is None
}
ZERO_PARTS = ("matches", "communication", "state")
ZERO_FULL = {"matches": 3, "communication": 3, "state": 2}
ZERO_PINNED: dict[str, dict[str, int]] = {
    "solution": ZERO_FULL,
    "untouched": dict.fromkeys(ZERO_PARTS, 0),
    "all_reduce_update": _but(ZERO_FULL, communication=0, state=0),  # plain DDP + full momentum
    "replicated_state": _but(ZERO_FULL, state=0),  # right collectives, momentum kept whole
    "forgot_average": dict.fromkeys(ZERO_PARTS, 0),
}
# assignment -> (file-name mark, parts, pins, max score), for the exercises graded from one inbox
INBOX = {RING: (2, RING_PARTS, RING_PINNED, 8), TREE: (3, TREE_PARTS, TREE_PINNED, 8),
         SHUFFLE: (4, SHUFFLE_PARTS, SHUFFLE_PINNED, 6), BUCKETS: (5, BUCKETS_PARTS, BUCKETS_PINNED, 8),
         ZERO: (6, ZERO_PARTS, ZERO_PINNED, 8)}


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
    for folder in (FIXTURES / ASSIGNMENT, inbox):
        done = _grader("autograde", str(folder), "--course", str(course), "--jobs", "2",
                       "--part-timeout", str(PART_TIMEOUT))
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stderr == ""
        stdout += done.stdout
    export = _grader("export", "--course", str(course))
    assert export.returncode == 0, export.stderr
    rows = {(row["student"], row["assignment"]): row for row in csv.DictReader(io.StringIO(export.stdout))}
    return {"course": course, "rows": rows, "stdout": stdout}


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
def test_every_part_of_exercises_2_to_6_scores_what_it_earns(
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


def test_a_deadlock_costs_only_its_parts_budget(graded: dict[str, Any]) -> None:
    result = json.loads((graded["course"] / "trusted" / "deadlock" / f"{ASSIGNMENT}.json").read_text())
    hung = {p["part"]: p for p in result["parts"] if not p["passed"]}
    assert sorted(hung) == ["indivisible", "shapes"]
    for part in hung.values():
        assert "did not finish" in part["message"]
        assert "stuck at line" in part["message"]
        assert part["seconds"] < PART_TIMEOUT + 10


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


# --- release ------------------------------------------------------------------------------------------
def test_exercises_equal_a_fresh_release() -> None:
    done = _grader("release", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("assignment", [ASSIGNMENT, RING, TREE, SHUFFLE, BUCKETS, ZERO])
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
    sys.path.insert(0, str(REPO / "grader" / "fixtures"))
    try:
        import make_fixtures
    finally:
        sys.path.pop(0)
    for name, nb in make_fixtures.fixtures().items():
        assert (FIXTURES / name).read_text() == nbformat.writes(nb) + "\n", f"{name}: run make_fixtures.py"


# --- the learner's kernel -------------------------------------------------------------------------------
def _validate(path: Path) -> dict[str, Any]:
    from nbgrader.validator import Validator
    from traitlets.config import Config

    config = Config()
    config.Validator.validate_all = True  # any error or stderr in any cell fails, not only in tests
    config.Execute.timeout = 300
    return Validator(config=config).validate(str(path))  # type: ignore[no-any-return]


@pytest.mark.parametrize("assignment", [ASSIGNMENT, RING, TREE, SHUFFLE, BUCKETS, ZERO])
def test_the_solution_passes_every_visible_and_hidden_test_in_a_kernel(assignment: str) -> None:
    assert _validate(REPO / "solutions" / assignment / f"{assignment}.ipynb") == {}


def test_the_untouched_exercise_fails_in_a_kernel() -> None:
    failed = _validate(FIXTURES / ASSIGNMENT / "untouched.ipynb")["failed"]
    assert len(failed) >= len(PARTS)
    assert all("NotImplementedError" in cell["raw_error"] for cell in failed)
