"""An instructor stops the grader: Ctrl-C ends it at once and keeps what was graded; a grader that
is killed outright takes its worker processes with it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from procs import alive, children, wait_gone

REPO = Path(__file__).resolve().parent.parent
SOLUTION = REPO / "grader" / "fixtures" / "ex7_cost_model" / "solution.ipynb"  # one rank, formulas: cheap
CLASS = 6  # a solution, then submissions whose every function loops for ever
ENDLESS = "\n\n".join(f"def {name}(*args):\n    while True:\n        pass"
                       for name in ("ring_time", "hierarchical_time", "memory_per_gpu", "bytes_per_step"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # nbgrader and the grader end to end

# SIGINT as a terminal leaves it (a test runner may ignore it in its children), then the grader
START = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
         "os.execv(sys.executable, [sys.executable, '-m', 'grader', *sys.argv[1:]])")


def _start(tmp_path: Path, jobs: int) -> subprocess.Popen[str]:
    """The grader on a class: one solution, then endless loops, each of which would take its
    parts' budgets (seconds each) to grade."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    shutil.copy(SOLUTION, inbox / "student0.ipynb")
    endless = nbformat.read(SOLUTION, as_version=4)
    next(c for c in endless.cells if c.get("id") == "cost_functions").source = ENDLESS
    for number in range(1, CLASS):
        nbformat.write(endless, inbox / f"student{number}.ipynb")
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    return subprocess.Popen([sys.executable, "-c", START, "autograde", str(inbox), "-j", str(jobs),
                             "--course", str(tmp_path / "course")],
                            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own group: the "terminal" we press Ctrl-C in


def _first_result(grader: subprocess.Popen[str]) -> str:
    """Read the grader's output up to its first graded submission (the state the test needs)."""
    assert grader.stdout is not None
    for line in grader.stdout:
        if line.startswith("[1/"):
            return line
    raise AssertionError(f"the grader ended before grading anyone: {grader.wait()} {grader.stderr.read()}")


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _gradebook(course: Path) -> list[str]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "distlab") as gb:
        return sorted(s.student.id for a in gb.assignments for s in a.submissions)


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_stops_the_grader_now_and_keeps_what_it_graded(tmp_path: Path, jobs: int) -> None:
    """Before: with -j 2 the grader waited for its workers to grade the whole class, then printed a
    KeyboardInterrupt traceback; with -j 1 nbgrader took the interrupt (which reached the ranks of
    the submission being graded) for one failed submission, scored 0 in the gradebook, and went on
    with the class."""
    grader = _start(tmp_path, jobs)
    first = _first_result(grader)
    helpers = _descendants(grader.pid)  # workers, launchers, ranks
    os.killpg(grader.pid, signal.SIGINT)
    out, err = grader.communicate(timeout=120)
    assert grader.returncode == 130, (out, err)
    graded = [first] + [line for line in out.splitlines() if line.startswith("[")]
    assert len(graded) < CLASS, out  # it stopped; it did not grade the class first
    assert err.strip().splitlines()[-1] == (f"interrupted: {len(graded)} of {CLASS} submissions graded, and kept "
                                            f"in the gradebook; the same command grades them all again"), err
    assert "Traceback" not in err, err
    assert wait_gone(helpers, within=30) == [], [p for p in helpers if alive(p)]
    # the gradebook holds the graded submissions and nothing else (not the one interrupted, as a 0)
    assert _gradebook(tmp_path / "course") == sorted(line.split()[1] for line in graded)


def test_a_killed_grader_takes_its_workers_with_it(tmp_path: Path) -> None:
    """Workers run in sessions of their own (Ctrl-C reaches the grader alone), so a grader killed
    outright, or a closed terminal, left them grading the class in the background (here, five
    endless loops: half a minute and more)."""
    grader = _start(tmp_path, 2)
    _first_result(grader)
    workers = children(grader.pid)
    helpers = _descendants(grader.pid)
    assert len(workers) == 2, workers
    grader.kill()
    grader.wait()
    assert wait_gone(helpers, within=10) == [], [p for p in helpers if alive(p)]
