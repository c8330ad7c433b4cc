"""The course directory nbgrader keeps: a new gradebook costs no child process."""

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
