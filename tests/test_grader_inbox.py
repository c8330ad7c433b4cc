"""Whose submission each notebook is, in the shapes instructors get them: a folder of renamed
files, a folder per student (nbgrader's exchange, JupyterHub), a learning platform's zip."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from grader.inbox import BadArchive, Inbox, unpack

NOTEBOOK = b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


def zip_of(path: Path, members: dict[str | bytes, bytes]) -> Path:
    """A zip as other tools write it. A ``bytes`` name is stored as those bytes without the
    UTF-8 flag (Windows' zip tool on a Chinese system writes GBK so), which Python's zipfile
    cannot write: an ASCII stand-in of the same length is written, then its bytes replaced."""
    stand_ins = {}
    with zipfile.ZipFile(path, "w") as archive:
        for n, (name, data) in enumerate(members.items()):
            if isinstance(name, bytes):
                stand_in = f"{n:0{len(name)}d}"[-len(name):].encode()
                stand_ins[stand_in] = name
                name = stand_in.decode()
            archive.writestr(name, data)
    raw = path.read_bytes()
    for stand_in, name in stand_ins.items():
        assert raw.count(stand_in) == 2  # the local header and the central directory
        raw = raw.replace(stand_in, name)
    path.write_bytes(raw)
    return path


def _ids(inbox: Path) -> list[str]:
    found = Inbox(inbox, released={"ex1_all_reduce_rs_ag", "ex2_ring_all_reduce"})
    taken: set[str] = set()
    return [found.student_id(path, taken) for path in found.notebooks]


def _write(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(NOTEBOOK)
    return root


def test_students_are_named_by_their_folder_or_else_their_file(tmp_path: Path) -> None:
    """Every student of a class that sends the released notebook's own name was "ex1", "ex1_2",
    "ex1_3": now the student is the folder under the folders all notebooks share."""
    exchange = _write(tmp_path / "exchange", "alice/ex1/ex1.ipynb", "bob/ex1/ex1.ipynb",
                      "bob/ex1/.ipynb_checkpoints/ex1-checkpoint.ipynb")
    assert _ids(exchange) == ["alice", "bob"]
    canvas = _write(tmp_path / "canvas", "ex1 submissions/smith_12_34_ex1.ipynb", "ex1 submissions/lee_56_78_ex1.ipynb")
    assert _ids(canvas) == ["lee_56_78_ex1", "smith_12_34_ex1"]  # one shared folder: the file names say who
    moodle = _write(tmp_path / "moodle", "Ada Lovelace_1001_assignsubmission_file_/ex1.ipynb",
                    "张三_1002_assignsubmission_file_/ex1 (2).ipynb", "__MACOSX/x/._ex1.ipynb")
    assert _ids(moodle) == ["Ada_Lovelace_1001", "张三_1002"]
    by_assignment = _write(tmp_path / "sorted", "ex1_all_reduce_rs_ag/ada.ipynb", "ex1_all_reduce_rs_ag/bo.ipynb",
                           "ex2_ring_all_reduce/ada.ipynb")  # an instructor's own sorting names no one
    assert _ids(by_assignment) == ["ada", "bo", "ada_2"]  # unique per run here; the CLI counts per assignment
    assert _ids(_write(tmp_path / "one", "Ada.ipynb")) == ["Ada"]
    assert _ids(_write(tmp_path / "late", "bob/ex1_all_reduce_rs_ag/ex1_all_reduce_rs_ag.ipynb")) == ["bob"]
    assert _ids(_write(tmp_path / "late2", "submissions/carol_ex1.ipynb")) == ["carol_ex1"]
    assert _ids(tmp_path / "one" / "Ada.ipynb") == ["Ada"]  # a single file


def test_a_platforms_zip_is_unpacked_with_the_names_its_students_wrote(tmp_path: Path) -> None:
    archive = zip_of(tmp_path / "download.zip", {
        "Ada Lovelace_1001_assignsubmission_file_/ex1.ipynb": NOTEBOOK,
        "张三_1002_assignsubmission_file_/ex1.ipynb".encode("gbk"): NOTEBOOK,  # no UTF-8 flag
        "Bob_1003_assignsubmission_file_/notes.txt": b"not a notebook",
        "__MACOSX/Ada Lovelace_1001_assignsubmission_file_/._ex1.ipynb": b"\x00\x05\x16\x07",
    })
    into = tmp_path / "course" / "inbox" / "download"
    (into / "stale").mkdir(parents=True)
    (into / "stale" / "old.ipynb").write_bytes(NOTEBOOK)  # from an earlier run of the same zip
    assert unpack(archive, into) == (into, ["Bob_1003_assignsubmission_file_/notes.txt in download.zip: not a notebook"])
    assert _ids(into) == ["Ada_Lovelace_1001", "张三_1002"]
    assert not (into / "Bob_1003_assignsubmission_file_").exists()


@pytest.mark.parametrize("member", ["../escaped.ipynb", "/tmp/escaped.ipynb", "a/../../escaped.ipynb",
                                    "..\\escaped.ipynb"])
def test_a_zip_member_that_would_land_outside_its_folder_is_refused(tmp_path: Path, member: str) -> None:
    archive = zip_of(tmp_path / "hostile.zip", {"ada/ex1.ipynb": NOTEBOOK, member: NOTEBOOK})
    with pytest.raises(BadArchive, match="refused the member"):
        unpack(archive, tmp_path / "course" / "inbox" / "hostile")
    assert not list(tmp_path.rglob("escaped.ipynb")) and not Path("/tmp/escaped.ipynb").exists()


def test_a_file_that_is_no_zip_or_holds_no_notebook_says_so(tmp_path: Path) -> None:
    (tmp_path / "fake.zip").write_text("not a zip")
    with pytest.raises(BadArchive, match="not a zip file"):
        unpack(tmp_path / "fake.zip", tmp_path / "a")
    with pytest.raises(BadArchive, match="no notebooks"):
        unpack(zip_of(tmp_path / "empty.zip", {"readme.txt": b"hi"}), tmp_path / "b")


def test_a_zip_that_unpacks_to_more_than_a_class_sends_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from grader import inbox

    monkeypatch.setattr(inbox, "MAX_UNPACKED_BYTES", 3 * len(NOTEBOOK))  # 4 GB in use: a smaller class here
    archive = zip_of(tmp_path / "bomb.zip", {f"s{n}/ex1.ipynb": NOTEBOOK for n in range(4)})
    with pytest.raises(BadArchive, match="unpacks to more than"):
        unpack(archive, tmp_path / "out")
    assert len(list((tmp_path / "out").rglob("*.ipynb"))) == 3  # stopped before the one too many


def test_a_member_this_file_system_cannot_hold_is_reported_and_the_rest_unpacked(tmp_path: Path) -> None:
    """A long Chinese file name fits a zip in GBK (2 bytes a character, Linux allows 255 bytes)
    but not this file system once read as UTF-8 (3 bytes a character)."""
    long_name = "作业" * 60 + ".ipynb"  # 240 bytes in GBK, 366 in UTF-8
    archive = zip_of(tmp_path / "class.zip", {"ada/ex1_all_reduce_rs_ag.ipynb": NOTEBOOK,
                                              f"bob/{long_name}".encode("gbk"): NOTEBOOK})
    into, skipped = unpack(archive, tmp_path / "out")
    assert _ids(into) == ["ada"]  # alone in the class, and named by the folder: the file names no one
    assert skipped == [f"bob/{long_name} in class.zip: could not be unpacked (File name too long)"], skipped
