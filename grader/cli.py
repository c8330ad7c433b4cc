"""``python -m grader {release,autograde,feedback,export}``: the instructor's commands.

autograde grades in two passes: the trusted checks run in parallel worker processes (each
writes one JSON result per submission), then nbgrader autogrades every submission serially in
this process, taking the grade cells' outputs from those results, so the gradebook has a single
writer. A result that is missing (a worker died) is recomputed during the serial pass.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import nbformat
from tqdm import tqdm

from distlab.edition import LANGUAGES
from grader.course import DEFAULT_ROOT, EXERCISES, SOLUTIONS, Course, Job, assignments
from grader.inbox import BadArchive, Inbox, gather
from grader.release import normalise, translate


def pad(text: str, width: int) -> str:
    """``text`` padded to ``width`` terminal columns: 张三 takes four, so ``:<28`` would misalign."""
    columns = sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)
    return text + " " * max(0, width - columns)


class NotANotebook(Exception):
    """A submitted file that is no notebook at all: an empty or cut-off upload, another file
    renamed .ipynb. Said in a line, instead of nbgrader's traceback."""


class NoGradebook(Exception):
    """feedback or export asked of a course folder that autograde never wrote."""


def _read_submission(path: Path) -> dict[str, object]:
    """The submitted notebook's JSON, or NotANotebook saying why there is none."""
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise NotANotebook("not a notebook: not text") from None
    except ValueError as exc:
        raise NotANotebook(f"not a notebook: not JSON ({exc})" if path.stat().st_size
                           else "not a notebook: the file is empty") from None
    except OSError as exc:
        raise NotANotebook(f"cannot be read ({exc.strerror})") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells", notebook.get("worksheets")), list):
        raise NotANotebook("not a notebook: JSON without a list of cells")
    return notebook


def _assignment_of(notebook: dict[str, object], wanted: str | None) -> str | None:
    """The assignment a submitted notebook belongs to: by its answer cells' ids, whatever its name."""
    from distlab.grading.catalog import ENTRIES, entry
    from distlab.grading.extract import cell_grade_id, defines

    if wanted:
        return entry(wanted).assignment
    cells = notebook.get("cells", [])
    if not isinstance(cells, list):  # not a notebook's cells: no answer cell to find
        return None
    ids = {cell_grade_id(c) for c in cells}
    for known in ENTRIES:
        if ids & set(known.solution_ids):
            return known.assignment
    # no answer id at all (a tool dropped the cells' metadata): the function the cells define
    defined = [known.assignment for known in ENTRIES
               if any(isinstance(c, dict) and defines(c, known.function) for c in cells)]
    return defined[0] if len(defined) == 1 else None


# --- release --------------------------------------------------------------------------------------
def cmd_release(args: argparse.Namespace) -> int:
    """Regenerate exercises/<a>/<a>.ipynb (and exercises/<lang>/<a>/ for each translation) from
    solutions/ with nbgrader, or --check that they are current."""
    names = args.assignments or assignments()
    langs = list(LANGUAGES) if args.lang == "all" else [args.lang]
    stale = []
    with tempfile.TemporaryDirectory(prefix="distlab-release-") as tmp:
        course = Course(Path(tmp))
        for name in names:
            english = normalise(nbformat.read(course.prepare(name), as_version=4))
            for lang in langs:
                folder = EXERCISES if lang == "en" else EXERCISES / lang
                fresh = english
                if lang != "en":
                    fresh, problem = translate(english, name, lang)
                    if problem:
                        stale.append(f"{lang}/{name}")
                        print(f"{name} ({lang}): the translation is incomplete\n{problem}")
                        continue
                target = folder / name / f"{name}.ipynb"
                shown = target.relative_to(EXERCISES.parent)
                text = nbformat.writes(fresh) + "\n"
                if target.exists() and target.read_text(encoding="utf-8") == text:
                    print(f"{shown}: up to date")
                    continue
                if args.check:
                    stale.append(f"{lang}/{name}")
                    print(f"{shown}: differs from a fresh release")
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
                print(f"{shown}: written")
    return 1 if stale else 0


# --- autograde ------------------------------------------------------------------------------------
def cmd_autograde(args: argparse.Namespace) -> int:
    from distlab.grading.catalog import entry
    from distlab.grading.extract import drop_unreadable_nbgrader_metadata, recover_answer_cell

    given = Path(args.submissions)
    try:
        folder, skipped = gather(given, Path(args.course))
    except BadArchive as bad:
        print(bad, file=sys.stderr)
        return 2
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    inbox = Inbox(folder, released=assignments())
    if not inbox.notebooks:
        print(f"no notebooks in {folder}", file=sys.stderr)
        return 2
    # what no submission may read: the folder given (the zip's folder too: the class's work is in it)
    course = Course(Path(args.course), args.part_timeout, Path(args.course) / "trusted", inbox=given.resolve())
    taken: dict[str | None, set[str]] = {}  # assignment -> its students (one student may send several)
    jobs: list[Job] = []
    unreadable: dict[str, str] = {}  # student -> why their file is no notebook
    for path in inbox.notebooks:
        try:
            notebook = _read_submission(path)
        except NotANotebook as why:
            unreadable[inbox.student_id(path, taken.setdefault(None, set()))] = str(why)
            continue
        dropped = drop_unreadable_nbgrader_metadata(notebook)
        name = _assignment_of(notebook, args.assignment)
        if name is None:
            print(f"skipped {path}: it has no answer cell of any known assignment (a notebook of something "
                  f"else, or its answer cell was deleted: grade it with -a ASSIGNMENT)", file=sys.stderr)
            continue
        student = inbox.student_id(path, taken.setdefault(name, set()))
        known = entry(name)
        recovered = recover_answer_cell(notebook, known.solution_ids, known.function)
        if dropped:
            cells = "1 cell" if dropped == 1 else f"{dropped} cells"
            print(f"{student}: the nbgrader metadata of {cells} could not be read and was dropped "
                  f"(the tests come from the released notebook)", file=sys.stderr)
        if recovered is not None:
            print(f"{student}: no cell carries the answer's nbgrader id (a tool dropped the cells' metadata): "
                  f"graded from cell {recovered + 1}, which defines {known.function}", file=sys.stderr)
        repaired = recovered is not None or dropped > 0
        jobs.append(course.submit(student, name, path, notebook if repaired else None))
    started = time.monotonic()
    # the trusted checks start first; nbgrader sets up and then autogrades each submission as
    # soon as its result is there, one at a time (the gradebook has one writer)
    workers = Workers(course, jobs, args.jobs, args.part_timeout) if args.jobs > 1 else None
    progress = Progress(len(jobs) + len(unreadable))
    for student, reason in unreadable.items():
        progress.not_a_notebook(student, reason)
    try:
        for name in sorted({j.assignment for j in jobs}):
            course.prepare(name)
        for job in jobs:
            if workers is not None:
                workers.wait_for(job)
            began = time.monotonic()
            problem = course.autograde(job)
            if problem is not None:
                print(f"{job.student}: nbgrader could not autograde {job.notebook}:\n{problem}", file=sys.stderr)
            seconds = _trusted_seconds(course, job) or time.monotonic() - began
            progress.done(job, course.score(job) if problem is None else None, seconds)
    except KeyboardInterrupt:  # Ctrl-C: stop now, not after the workers have graded the class
        if workers is not None:
            workers.kill()
        progress.close()
        graded = progress.finished - len(progress.failed)
        print(f"interrupted: {graded} of {progress.total} submissions graded, and kept in the gradebook; "
              f"the same command grades them all again", file=sys.stderr)
        return 130
    finally:
        progress.close()
        if workers is not None:
            workers.stop()
    _print_scores(course, {(j.student, j.assignment) for j in jobs})
    progress.summary(time.monotonic() - started)
    return 1 if progress.failed else 0


def _trusted_seconds(course: Course, job: Job) -> float | None:
    """How long the trusted checks took for this submission (from its result), if known."""
    from distlab.grading.nbgrader_hooks import results_path

    try:
        with open(results_path(str(course.root / "trusted"), job.student, job.assignment)) as handle:
            return float(json.load(handle)["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Progress:
    """One line per finished submission, then a summary: what an instructor watches for a class.

    At a terminal a tqdm bar below the lines counts down the class; written to a file or a pipe
    (a log, a test) the output is the same lines and nothing else.
    """

    def __init__(self, total: int, out: TextIO | None = None) -> None:
        self.total = total
        self.out = out or sys.stdout
        self.times: dict[Job, float] = {}
        self.failed: list[str] = []  # students
        self.finished = 0
        self.bar = tqdm(total=total, unit="submission", file=self.out, disable=None,  # None: off unless a terminal
                        leave=False, dynamic_ncols=True)

    def done(self, job: Job, score: tuple[float, float] | None, seconds: float) -> None:
        self.times[job] = seconds
        shown = "not graded" if score is None else f"{score[0]:g}/{score[1]:g}"
        self._line(job.student, score is None, f"{job.assignment:<24} {shown:>10}  {seconds:5.1f} s")

    def not_a_notebook(self, student: str, why: str) -> None:
        """A file nbgrader could not even open: named with the reason, and counted as not graded."""
        self._line(student, True, f"not graded: {why}")

    def _line(self, student: str, failed: bool, text: str) -> None:
        self.finished += 1
        if failed:
            self.failed.append(student)
        width = len(str(self.total))
        self.bar.write(f"[{self.finished:>{width}}/{self.total}] {pad(student, 28)} {text}", file=self.out)
        self.bar.update(1)
        self.out.flush()

    def close(self) -> None:
        """Take the bar off the terminal (the lines stay)."""
        self.bar.close()

    def summary(self, wall: float) -> None:
        graded = self.finished - len(self.failed)
        print(f"graded {graded} of {self.total} submissions in {wall:.1f} s; failed to grade: "
              + (", ".join(self.failed) or "none"), file=self.out)
        slowest = sorted(self.times.items(), key=lambda item: -item[1])[:3]
        if slowest:
            print("slowest: " + ", ".join(f"{j.student} {t:.1f} s" for j, t in slowest), file=self.out)


class Workers:
    """Parallel trusted-grading processes (``python -m distlab.grading``), one JSON result per job.

    Every worker gets the whole list and claims jobs one at a time, so a submission that spends
    its budget hanging holds up one worker, not a fixed share of the class. A missing result (a
    worker that died or ran past the budget) is not fatal: nbgrader's pass then grades that
    submission in this process.
    """

    def __init__(self, course: Course, jobs: Sequence[Job], count: int, part_timeout: float) -> None:
        from distlab.grading.catalog import entry
        from distlab.grading.nbgrader_hooks import results_path

        folder = course.root / "trusted"
        folder.mkdir(parents=True, exist_ok=True)
        self.out = {j: Path(results_path(str(folder), j.student, j.assignment)) for j in jobs}
        for path in self.out.values():  # a stale result must never be taken for a fresh one
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".claim").unlink(missing_ok=True)
        spec = [{"student": j.student, "assignment": j.assignment, "notebook": str(j.notebook),
                 "out": str(self.out[j])} for j in jobs]
        protect = [arg for folder in course.protected() for arg in ("--protect", folder)]
        budgets = folder / "budgets"  # timed afresh for each run: the load of the day sets them
        shutil.rmtree(budgets, ignore_errors=True)
        job_file = folder / "jobs.json"
        job_file.write_text(json.dumps(spec))
        count = max(1, min(count, len(jobs)))
        parts = max((len(entry(j.assignment).parts) for j in jobs), default=1)
        rounds = -(-len(jobs) // count)
        self.deadline = time.monotonic() + rounds * (parts * part_timeout + 30) + 60
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = []
        for index in range(count):
            log = open(folder / f"worker-{index}.log", "wb")  # noqa: SIM115 - closed in stop()
            self.logs.append(log)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "distlab.grading", str(job_file), "--part-timeout", str(part_timeout),
                 "--references", str(SOLUTIONS), "--budgets", str(budgets), "--end-with-stdin", *protect],
                # stdin: a pipe only this process writes to, so a worker ends when this process
                # does, however (a kill, a closed terminal); its own session: Ctrl-C reaches us alone
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def wait_for(self, job: Job) -> None:
        """Until the job's result is written, every worker has ended, or the budget is spent."""
        while not self.out[job].exists() and time.monotonic() < self.deadline:
            if all(p.poll() is not None for p in self.procs):
                return
            time.sleep(0.05)
        if time.monotonic() >= self.deadline:
            self.kill()

    def kill(self) -> None:
        """End every worker now (its launcher and ranks follow their parent)."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker's own session: nothing else
                proc.wait()

    def stop(self) -> None:
        for proc in self.procs:
            try:
                proc.wait(timeout=max(self.deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.kill()
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for log in self.logs:
            log.close()


def _print_scores(course: Course, only: set[tuple[str, str]]) -> None:
    for row in course.scores():
        if (row["student"], row["assignment"]) not in only:
            continue
        parts = " ".join(f"{k.removeprefix('test_')}={v:g}" for k, v in row.items() if k.startswith("test_"))
        print(f"{pad(row['student'], 28)} {row['assignment']:<24} {row['score']:g}/{row['max_score']:g}  {parts}")


# --- feedback and export --------------------------------------------------------------------------
def _graded_course(path: str) -> Course:
    """The course at ``path``, which must already hold a gradebook (else nbgrader would make an
    empty one, or fail deep in SQLAlchemy when the folder is missing)."""
    course = Course(Path(path))
    if not course.gradebook_path.is_file():
        raise NoGradebook(f"no gradebook in {course.root}: nothing was graded there yet "
                          f"(python -m grader autograde SUBMISSIONS --course {path})")
    return course


def cmd_feedback(args: argparse.Namespace) -> int:
    course = _graded_course(args.course)
    graded = sorted({r["assignment"] for r in course.scores()})
    if not graded or (args.assignment and args.assignment not in graded):
        raise NoGradebook(f"no submission of {args.assignment or 'any assignment'} was graded in {course.root} "
                          f"(graded there: {', '.join(graded) or 'none'})")
    for name in [args.assignment] if args.assignment else graded:
        course.feedback(name)
    print(f"feedback: {course.root / 'feedback'}/<student>/<assignment>/<assignment>.html")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    rows = _graded_course(args.course).scores()
    columns = ["student", "assignment"]
    for row in rows:
        columns += [k for k in row if k not in columns and k.startswith("test_")]
    columns += ["score", "max_score", "needs_manual_grade"]
    out = open(args.output, "w", newline="") if args.output != "-" else sys.stdout  # noqa: SIM115
    try:
        writer = csv.DictWriter(out, columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _more_than_zero(kind: type[int] | type[float]) -> Any:
    """An argparse type: a number above 0 (0 workers or a negative budget would grade nothing)."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be a number more than 0, not {text}")
        return value
    return parse


def _released(name: str) -> str:
    """An argparse type (not ``choices``, which Python 3.11 also checks against an empty list)."""
    if name not in assignments():
        raise argparse.ArgumentTypeError(f"no assignment {name!r} in solutions/ (there are: {', '.join(assignments())})")
    return name


def _exercise(name: str) -> str:
    """An argparse type: a graded exercise by its assignment name or short key (ex1), as the
    catalog's ``entry`` knows them; its assignment name."""
    from distlab.grading.catalog import entry

    try:
        return entry(name).assignment
    except KeyError as unknown:
        raise argparse.ArgumentTypeError(str(unknown.args[0])) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    release = sub.add_parser("release", help="regenerate exercises/ from solutions/ with nbgrader")
    release.add_argument("assignments", nargs="*", metavar="ASSIGNMENT", type=_released,
                         help="a folder of solutions/, e.g. ex1_all_reduce_rs_ag (default: all)")
    release.add_argument("--check", action="store_true", help="only report (exit 1) if exercises/ is stale")
    release.add_argument("--lang", choices=[*LANGUAGES, "all"], default="all",
                         help="which edition: en (exercises/), zh (exercises/zh/), or all (default)")
    release.set_defaults(run=cmd_release)

    def course_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--course", default=str(DEFAULT_ROOT), help="nbgrader course directory (created)")

    auto = sub.add_parser("autograde", help="grade a folder or zip of submitted notebooks (any file names)")
    auto.add_argument("submissions", help="a folder of .ipynb files (any names, or a folder per student), "
                                          "a learning platform's .zip of them, or one notebook")
    auto.add_argument("-a", "--assignment", type=_exercise, metavar="ASSIGNMENT",
                      help="e.g. ex1_all_reduce_rs_ag or ex1 (default: recognised from each notebook's cells)")
    auto.add_argument("-j", "--jobs", type=_more_than_zero(int), default=os.cpu_count() or 1,
                      help="parallel grading processes (default: CPU count)")
    auto.add_argument("--part-timeout", type=_more_than_zero(float), default=30.0,
                      help="seconds any graded part may run at most (default 30); each part's own budget "
                           "comes from the reference solution's time on this machine")
    course_option(auto)
    auto.set_defaults(run=cmd_autograde)

    feedback = sub.add_parser("feedback", help="write HTML feedback for every autograded submission")
    feedback.add_argument("-a", "--assignment", type=_exercise, metavar="ASSIGNMENT",
                          help="default: every assignment graded in the course")
    course_option(feedback)
    feedback.set_defaults(run=cmd_feedback)

    record = sub.add_parser("record", help="rewrite the recorded runs the notebooks replay (from the references)")
    record.set_defaults(run=lambda args: __import__("grader.record", fromlist=["main"]).main())

    export = sub.add_parser("export", help="write every submission's per-part scores as CSV")
    export.add_argument("-o", "--output", default="-", help="CSV file (default: stdout)")
    course_option(export)
    export.set_defaults(run=cmd_export)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from distlab.errors import ReferenceFailed

    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ReferenceFailed, NoGradebook) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C anywhere else (autograde says what it kept itself)
        print("interrupted", file=sys.stderr)
        return 130
