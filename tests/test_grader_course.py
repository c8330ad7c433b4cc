"""The course directory nbgrader keeps, and what an instructor's command costs before it starts:
a new gradebook costs no child process, and no grammar is compiled that no notebook needs."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_new_gradebook_is_stamped_with_alembics_head_read_in_this_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nbgrader ran `alembic heads` in a child process for every new course (about 2 s on 2 cores,
    a fifth of grading one submission). The grader reads the same head in its own process."""
    from nbgrader.api import Gradebook
    from nbgrader.dbutil import _temp_alembic_ini

    from grader.course import read_alembic_head_in_process

    alembic = str(Path(sys.executable).with_name("alembic"))
    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'unused.db'}") as ini:
        heads = subprocess.run([alembic, "-c", ini, "heads"], capture_output=True, text=True, check=True).stdout
    read_alembic_head_in_process()
    monkeypatch.setenv("PATH", str(tmp_path))  # no `alembic` to run: a child process would fail
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}"):
        pass
    stamped = sqlite3.connect(tmp_path / "gradebook.db").execute("select version_num from alembic_version").fetchall()
    assert stamped == [(heads.split()[0],)], (stamped, heads)


IRI_CHECK = """
import sys
import grader.cli  # what `python -m grader ...` imports: nbformat, jsonschema, nbgrader
print("rfc3987_syntax.syntax_helpers" in sys.modules)
from rfc3987_syntax import is_valid_syntax  # what jsonschema does: still nothing compiled
print("rfc3987_syntax.syntax_helpers" in sys.modules)
from jsonschema import Draft7Validator, FormatChecker
check = Draft7Validator({"type": "string", "format": "iri"}, format_checker=FormatChecker())
print([e.message for e in check.iter_errors("http://例子.测试/路径")], [e.message for e in check.iter_errors("no iri ::")])
print("rfc3987_syntax.syntax_helpers" in sys.modules)
import rfc3987_syntax  # the real module from now on, every name of it
print(len(rfc3987_syntax.RFC3987_SYNTAX_TERMS) > 10, is_valid_syntax("iri", "::"))
"""


def test_the_grader_compiles_the_iri_grammar_only_when_an_iri_is_checked() -> None:
    """jsonschema imports rfc3987_syntax, which compiles a Lark grammar (0.84 s, a third of
    `python -m grader export`) that no notebook schema uses. The grader's commands load it only
    when a schema checks an IRI, and such a check answers as before."""
    done = subprocess.run([sys.executable, "-c", IRI_CHECK], capture_output=True, text=True, timeout=120,
                          encoding="utf-8")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == ["False", "False", "[] [\"'no iri ::' is not a 'iri'\"]", "True",
                                        "True False"], done.stdout


MISTAKES = {  # what an instructor may type, and what the grader must answer (one line, exit code 2)
    "export a course never graded": (["export", "--course", "{missing}"], "no gradebook in"),
    "feedback for a course never graded": (["feedback", "--course", "{missing}"], "no gradebook in"),
    "feedback for an empty folder": (["feedback", "--course", "{empty}"], "no gradebook in"),
    "release an unknown assignment": (["release", "ex9_nothing", "--check"], "no assignment 'ex9_nothing' in solutions/"),
    "autograde as an unknown assignment": (["autograde", "{empty}", "-a", "ex9_nothing"], "no exercise 'ex9_nothing'"),
    "feedback of an unknown assignment": (["feedback", "--course", "{empty}", "-a", "ex9"], "no exercise 'ex9'"),
    "feedback of ex1 (a short key) in a course never graded": (["feedback", "--course", "{missing}", "-a", "ex1"],
                                                               "no gradebook in"),
    "no workers": (["autograde", "{empty}", "--jobs", "0"], "--jobs: must be a number more than 0, not 0"),
    "half a worker": (["autograde", "{empty}", "--jobs", "1.5"], "'1.5' is not a whole number"),
    "a negative budget": (["autograde", "{empty}", "--part-timeout", "-5"], "more than 0, not -5"),
    "an endless budget": (["autograde", "{empty}", "--part-timeout", "inf"], "more than 0, not inf"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_an_instructors_mistake_is_one_clear_line_and_changes_nothing(mistake: str, tmp_path: Path) -> None:
    """A wrong option or a course folder that was never graded: one line saying what is wrong,
    exit code 2, no traceback, and no file made (nbgrader would have made an empty gradebook, or
    failed deep inside SQLAlchemy for a folder that is not there)."""
    args, said = MISTAKES[mistake]
    (tmp_path / "empty").mkdir()
    args = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty") for a in args]
    done = subprocess.run([sys.executable, "-m", "grader", *args], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(("error:", "python -m grader")), done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["empty"]
