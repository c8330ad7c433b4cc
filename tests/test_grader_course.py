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
from jsonschema import Draft7Validator, FormatChecker
check = Draft7Validator({"type": "string", "format": "iri"}, format_checker=FormatChecker())
print([e.message for e in check.iter_errors("http://例子.测试/路径")], [e.message for e in check.iter_errors("no iri ::")])
print("rfc3987_syntax.syntax_helpers" in sys.modules)
"""


def test_the_grader_compiles_the_iri_grammar_only_when_an_iri_is_checked() -> None:
    """jsonschema imports rfc3987_syntax, which compiles a Lark grammar (0.84 s, a third of
    `python -m grader export`) that no notebook schema uses. The grader's commands load it only
    when a schema checks an IRI, and such a check answers as before."""
    done = subprocess.run([sys.executable, "-c", IRI_CHECK], capture_output=True, text=True, timeout=120,
                          encoding="utf-8")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == ["False", "[] [\"'no iri ::' is not a 'iri'\"]", "True"], done.stdout
