"""The instructor's view of an autograde run: a line per submission, and a bar only at a terminal.

A log file or a pipe (CI, a test, `| tee`) must get the same plain lines with no bar redraws in
them; a terminal gets tqdm's bar below the lines while the class is graded.
"""

from __future__ import annotations

import io
from pathlib import Path

from grader.cli import Progress
from grader.course import Job


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _grade_two(out: io.StringIO) -> None:
    progress = Progress(2, out)
    progress.done(Job("ada", "ex1_all_reduce_rs_ag", Path("a.ipynb")), (10.0, 10.0), 2.5)
    progress.done(Job("bob", "ex1_all_reduce_rs_ag", Path("b.ipynb")), None, 1.0)
    progress.close()
    progress.summary(4.0)


def test_a_log_gets_one_plain_line_per_submission_and_the_summary() -> None:
    log = io.StringIO()
    _grade_two(log)
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("[1/2] ada ") and lines[0].endswith("10/10    2.5 s")
    assert lines[1].startswith("[2/2] bob ") and "not graded" in lines[1]
    assert lines[2] == "graded 1 of 2 submissions in 4.0 s; failed to grade: bob"
    assert lines[3] == "slowest: ada 2.5 s, bob 1.0 s"
    assert "\r" not in log.getvalue() and len(lines) == 4


def test_a_terminal_also_gets_a_progress_bar() -> None:
    terminal = Terminal()
    _grade_two(terminal)
    shown = terminal.getvalue()
    assert "\r" in shown and "1/2" in shown and "submission" in shown  # tqdm's bar, redrawn in place
    assert "[2/2] bob " in shown and "failed to grade: bob" in shown


def test_students_keep_their_names_in_any_script_and_the_columns_line_up() -> None:
    """A class that names its files 张三.ipynb and 李四.ipynb must not come out as student and
    student_2; wide characters take two columns, so the scores still line up."""
    from grader.inbox import student_id

    taken: set[str] = set()
    assert [student_id(Path(f"{name}.ipynb"), taken) for name in ("张三", "李四", "Ada Lovelace", "../x", "张三")] == [
        "张三", "李四", "Ada_Lovelace", "x", "张三_2"]
    log = io.StringIO()
    progress = Progress(2, log)
    progress.done(Job("张三", "ex1_all_reduce_rs_ag", Path("a.ipynb")), (10.0, 10.0), 2.5)
    progress.done(Job("Ada", "ex1_all_reduce_rs_ag", Path("b.ipynb")), (3.0, 10.0), 2.5)
    first, second = log.getvalue().splitlines()[:2]
    assert first.index("ex1") + 2 == second.index("ex1")  # 张三 is 4 columns wide, 2 characters
