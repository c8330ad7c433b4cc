"""nbgrader's course directory, set up and driven from code.

The instructor never arranges ``source/`` or ``submitted/<student>/<assignment>/`` by hand: this
module copies the nbgrader sources from solutions/, files each submitted notebook under the student
id grader.inbox gives it, and calls nbgrader through its Python API (``nbgrader validate`` and
friends exit 0 even when something failed; the API reports success per call). The gradebook is
only ever written from one process at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader.release import TRANSLATIONS

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"
DEFAULT_ROOT = REPO / "grader" / "course"
CONFIG = Path(__file__).resolve().with_name("nbgrader_config.py")


def put_venv_on_path() -> None:
    """Programs nbgrader starts by name (``alembic`` where the fast head below cannot be used):
    this interpreter's."""
    bindir = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if bindir not in parts:
        os.environ["PATH"] = os.pathsep.join([bindir, *parts])


def alembic_head() -> str:
    """The schema version nbgrader stamps into a new gradebook.db, read in this process.

    nbgrader asks a child process (``alembic heads``) for it: about 2 s on 2 cores for each new
    course, a fifth of grading one submission. Alembic's own API reads the same migration folder.
    """
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    config = Config()
    config.set_main_option("script_location", ALEMBIC_DIR)
    heads = ScriptDirectory.from_config(config).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"nbgrader's migrations have {len(heads)} heads: {heads}")
    return str(heads[0])


def read_alembic_head_in_process() -> None:
    """Make nbgrader take the schema version from ``alembic_head`` (same answer, no child process).

    Asked only when nbgrader makes a new gradebook, not by every command that makes a Course.
    """
    import nbgrader.api

    own_way = nbgrader.api.get_alembic_version
    if getattr(own_way, "reads_in_process", False):
        return

    def schema_version() -> str:
        try:
            return alembic_head()
        except Exception:  # noqa: BLE001 - another nbgrader or alembic: nbgrader's own way
            return str(own_way())

    schema_version.reads_in_process = True  # type: ignore[attr-defined]
    nbgrader.api.get_alembic_version = schema_version


def assignments() -> list[str]:
    """Every assignment with an nbgrader source notebook in solutions/, in course order."""
    return sorted(p.name for p in SOLUTIONS.iterdir() if (p / f"{p.name}.ipynb").is_file())


@dataclass(frozen=True)
class Job:
    student: str
    assignment: str
    notebook: Path  # the copy under submitted/


class Course:
    """One nbgrader course directory (``root``) and the API that works on it."""

    def __init__(self, root: Path = DEFAULT_ROOT, part_timeout: float | None = None,
                 results_dir: Path | None = None, inbox: Path | None = None) -> None:
        put_venv_on_path()
        read_alembic_head_in_process()
        # nbgrader 0.9 trips SQLAlchemy 2's autoflush warnings on every autograde; they are harmless
        warnings.filterwarnings("ignore", message=".*not in session.*", module=r"nbgrader\.")
        self.root = Path(root).resolve()
        self.part_timeout = part_timeout
        self.results_dir = results_dir
        self.inbox = inbox
        self._api: Any = None

    def protected(self) -> list[str]:
        """What a graded submission may not read: the answers, the grader, the class's work."""
        folders = [SOLUTIONS, REPO / "grader", self.root]
        if self.inbox is not None:
            folders.append(self.inbox if self.inbox.is_dir() else self.inbox.parent)
        return [str(Path(f).resolve()) for f in folders]

    # --- nbgrader ---------------------------------------------------------------------------------
    def config(self) -> Any:
        from traitlets.config.loader import PyFileConfigLoader

        config = PyFileConfigLoader(CONFIG.name, path=str(CONFIG.parent)).load_config()
        config.CourseDirectory.root = str(self.root)
        if self.part_timeout is not None:
            config.TrustedExecute.part_timeout = float(self.part_timeout)
        if self.results_dir is not None:
            config.TrustedExecute.results_dir = str(self.results_dir)
        config.TrustedExecute.reference_dir = str(SOLUTIONS)
        config.RestoreDeletedTests.translations = str(TRANSLATIONS)
        config.TrustedExecute.protected = self.protected()
        return config

    def api(self) -> Any:
        if self._api is None:
            from nbgrader.apps import NbGraderAPI
            from nbgrader.coursedir import CourseDirectory

            config = self.config()
            self._api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
            self._api.log_level = "WARN"
        return self._api

    def _check(self, what: str, outcome: dict[str, Any]) -> dict[str, Any]:
        if not outcome.get("success") and _was_interrupted(str(outcome.get("error") or "")):
            raise KeyboardInterrupt  # nbgrader's API reports Ctrl-C as a failure (see autograde)
        if not outcome.get("success"):
            raise RuntimeError(f"nbgrader {what} failed:\n{outcome.get('error') or outcome.get('log', '')}")
        return outcome

    # --- assignments -------------------------------------------------------------------------------
    def prepare(self, assignment: str) -> Path:
        """Copy the nbgrader source in and (re)generate the student version; returns its path.

        Only the notebook is copied: every other file in source/<assignment>/ would be released.
        """
        src = SOLUTIONS / assignment / f"{assignment}.ipynb"
        if not src.is_file():
            raise FileNotFoundError(f"no nbgrader source {src}")
        dest = self.root / "source" / assignment / src.name
        released = self.root / "release" / assignment / src.name
        self._write_local_config()
        fresh = not dest.exists() or dest.read_bytes() != src.read_bytes() or not released.exists()
        if fresh:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            self._check(f"generate_assignment {assignment}", self.api().generate_assignment(assignment))
        return released

    def _write_local_config(self) -> None:
        """Lets an instructor run plain ``nbgrader`` commands inside the course directory too."""
        self.root.mkdir(parents=True, exist_ok=True)
        text = ("# written by `python -m grader`; edit grader/nbgrader_config.py instead\n"
                "c = get_config()  # noqa: F821\n"
                f"load_subconfig({str(CONFIG)!r})  # noqa: F821\n"
                f"c.CourseDirectory.root = {str(self.root)!r}\n")
        path = self.root / "nbgrader_config.py"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)

    # --- submissions -------------------------------------------------------------------------------
    def submit(self, student: str, assignment: str, notebook: Path, repaired: dict[str, Any] | None = None) -> Job:
        """File a notebook as submitted/<student>/<assignment>/<assignment>.ipynb (``repaired``:
        the notebook's JSON to file instead of its bytes)."""
        folder = self.root / "submitted" / student / assignment
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        target = folder / f"{assignment}.ipynb"
        if repaired is None:
            shutil.copyfile(notebook, target)
        else:
            target.write_text(json.dumps(repaired, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return Job(student, assignment, target)

    def autograde(self, job: Job) -> str | None:
        """nbgrader autograde for one submission (serially: the gradebook has one writer).

        Returns None on success, else nbgrader's log, so one broken notebook never stops the class.
        Ctrl-C does stop it: nbgrader's API reports an interrupt as one more failed submission
        (``capture_log`` catches everything), so it is raised again here.
        """
        outcome = self.api().autograde(job.assignment, job.student, force=True, create=True)
        if outcome.get("success"):
            return None
        if _was_interrupted(str(outcome.get("error") or "")):
            self._forget(job)  # nbgrader left it in the gradebook, scored 0, though it was never graded
            raise KeyboardInterrupt
        return str(outcome.get("log") or outcome.get("error") or "nbgrader autograde failed")

    @property
    def gradebook_path(self) -> Path:
        return self.root / "gradebook.db"

    def gradebook(self) -> Any:
        """nbgrader's gradebook of this course, to use in a ``with``."""
        from nbgrader.api import Gradebook

        return Gradebook(f"sqlite:///{self.gradebook_path}", "distlab")

    def _forget(self, job: Job) -> None:
        from nbgrader.api import MissingEntry

        with self.gradebook() as gb:
            try:
                gb.remove_submission(job.assignment, job.student)
            except MissingEntry:
                pass
        shutil.rmtree(self.root / "autograded" / job.student / job.assignment, ignore_errors=True)
        try:
            (self.root / "autograded" / job.student).rmdir()  # if that was all the student had here
        except OSError:
            pass

    def feedback(self, assignment: str) -> Path:
        self._check(f"generate_feedback {assignment}", self.api().generate_feedback(assignment))
        return self.root / "feedback"

    def score(self, job: Job) -> tuple[float, float] | None:
        """(score, max score) of one autograded submission, or None if the gradebook has none."""
        from nbgrader.api import MissingEntry

        with self.gradebook() as gb:
            try:
                submission = gb.find_submission(job.assignment, job.student)
            except MissingEntry:
                return None
            return float(submission.score), float(submission.max_score)

    # --- scores ------------------------------------------------------------------------------------
    def scores(self) -> list[dict[str, Any]]:
        """One row per graded submission: student, assignment, every test cell's score, total."""
        rows = []
        with self.gradebook() as gb:
            for assignment in gb.assignments:
                for submission in sorted(assignment.submissions, key=lambda s: s.student.id):
                    row: dict[str, Any] = {"student": submission.student.id, "assignment": assignment.name}
                    for notebook in submission.notebooks:
                        for grade in sorted(notebook.grades, key=lambda g: g.name):
                            row[grade.name] = grade.score
                    row["score"] = submission.score
                    row["max_score"] = submission.max_score
                    row["needs_manual_grade"] = submission.needs_manual_grade
                    rows.append(row)
        return rows


def _was_interrupted(error: str) -> bool:
    """Did nbgrader's call end in Ctrl-C (a KeyboardInterrupt, or distlab's CellInterrupted while
    the trusted checks of a serial run waited for ranks)? Only this process raises them: student
    code runs on ranks, whose failures arrive here as text in a RankError."""
    lines = error.strip().splitlines()
    return bool(lines) and lines[-1].split(":", 1)[0].rsplit(".", 1)[-1] in ("KeyboardInterrupt", "CellInterrupted")
