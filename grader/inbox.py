"""Where a class's submissions come from, and whose each one is.

An instructor gets them in one of three shapes: a folder of notebooks under any names (students
rename their files), a folder per student that all hold the released notebook's name (nbgrader's
exchange, JupyterHub homes), or the zip a learning platform downloads, which is one of the two
(Canvas: every file in one folder, the student in its name; Moodle: a folder per student,
``Ada Lovelace_123456_assignsubmission_file_``). Naming every student after the file would give a
class of ``ex1``, ``ex1_2``, ``ex1_3``: the student is the folder below the folders all notebooks
share, when there is one, else the file's name.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from collections.abc import Collection
from pathlib import Path, PurePosixPath

UNPACKED = ".unpacked"  # in the course directory: what a zip held, or a course folder set aside (emptied each time)
MAX_NOTEBOOK_BYTES = 64 * 2**20  # a notebook larger than this in a zip is no answer to grade
MAX_UNPACKED_BYTES = 4 * 2**30  # a class of 500 sending 8 MB each; more is a zip bomb
_PLATFORM_SUFFIX = re.compile(r"_(assignsubmission|onlinetext)_\w*$")  # Moodle's folder names


class BadArchive(Exception):
    """The zip cannot be read, or holds no notebook."""


def notebooks(inbox: Path) -> list[Path]:
    """The notebooks under ``inbox`` (or ``inbox`` itself, a notebook), without the copies Jupyter
    and macOS's zip tool leave beside them."""
    if not inbox.is_dir():
        return [inbox]
    return [path for path in sorted(inbox.rglob("*.ipynb")) if not _left_by_tools(path.relative_to(inbox).parts)]


def gather(given: Path, course: Path) -> tuple[Path, list[str]]:
    """The folder (or notebook) to grade for what the instructor ``given``, and a line for each
    file left out: a zip is unpacked, and a folder of the ``course`` itself (its ``submitted/``,
    where nbgrader's collect leaves a class, or ``autograded/``) is copied aside, since grading
    rewrites both and would delete each notebook before reading it."""
    if given.suffix.lower() == ".zip" and given.is_file():  # a learning platform's download
        return unpack(given, course / UNPACKED / given.stem)
    if _inside(given, course) and not _inside(given, course / UNPACKED):
        return set_aside(given, course / UNPACKED / "from-course"), []
    return given, []


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def unpack(archive: Path, into: Path) -> tuple[Path, list[str]]:
    """Extract the notebooks of a zip into the folder ``into`` (emptied first); return it and a
    line for each file left out (a student who sent ``notes.txt`` or a zip instead of a notebook,
    or a file name this file system cannot hold, must not go unnoticed). Only ``.ipynb`` members
    are written, each under its own path inside ``into``: a name that would climb out of it
    (``../``, an absolute path) is refused, as is a member too large to be a notebook, or a zip
    that unpacks to more than a class could send."""
    try:
        zipped = zipfile.ZipFile(archive)
    except (OSError, zipfile.BadZipFile) as why:
        raise BadArchive(f"{archive} is not a zip file that can be read: {why}") from None
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    written, skipped = 0, []
    with zipped:
        for member in zipped.infolist():
            name = PurePosixPath(_member_name(member).replace("\\", "/"))
            if member.is_dir() or not name.parts or _left_by_tools(name.parts):
                continue
            if name.suffix.lower() != ".ipynb":
                skipped.append(f"{name} in {archive.name}: not a notebook")
                continue
            if name.is_absolute() or ".." in name.parts or member.file_size > MAX_NOTEBOOK_BYTES:
                raise BadArchive(f"{archive}: refused the member {str(name)!r} (outside the archive's "
                                 f"folder, or larger than {MAX_NOTEBOOK_BYTES >> 20} MB)")
            with zipped.open(member) as source:
                data = source.read(MAX_NOTEBOOK_BYTES + 1)  # the header's size may lie
            if len(data) > MAX_NOTEBOOK_BYTES:
                raise BadArchive(f"{archive}: {str(name)!r} is larger than {MAX_NOTEBOOK_BYTES >> 20} MB")
            written += len(data)
            if written > MAX_UNPACKED_BYTES:
                raise BadArchive(f"{archive} unpacks to more than {MAX_UNPACKED_BYTES / 2**30:g} GB of notebooks")
            target = into.joinpath(*name.parts)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            except OSError as why:  # a name too long once read as UTF-8, a file where a folder goes
                skipped.append(f"{name} in {archive.name}: could not be unpacked ({why.strerror})")
    if not notebooks(into):
        raise BadArchive(f"no notebooks in {archive}")
    return into, skipped


def _left_by_tools(parts: tuple[str, ...]) -> bool:
    """Copies Jupyter and macOS's zip tool leave beside a notebook: no one's submission."""
    return any(part in (".ipynb_checkpoints", "__MACOSX") for part in parts) or parts[-1].startswith("._")


def set_aside(folder: Path, into: Path) -> Path:
    """Copy the notebooks of ``folder`` (a course's own ``submitted/``, which grading rewrites)
    into ``into`` (emptied first), keeping their paths, and return it."""
    shutil.rmtree(into, ignore_errors=True)
    for path in notebooks(folder):
        target = into / path.relative_to(folder) if folder.is_dir() else into / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    into.mkdir(parents=True, exist_ok=True)
    return into


def _member_name(member: zipfile.ZipInfo) -> str:
    """A member's name as its author wrote it: a zip made on a Chinese Windows stores names in GBK
    without saying so, which Python reads as code page 437 (``ÕÅ╚²``)."""
    if member.flag_bits & 0x800:  # the zip says UTF-8
        return member.filename
    raw = member.filename.encode("cp437")
    for encoding in ("utf-8", "gbk"):
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            continue
    return member.filename


class Inbox:
    """The notebooks of one folder of submissions (or one notebook), and who sent each.
    ``released``: the file names (without ``.ipynb``) the assignments are released under, which
    name no student."""

    def __init__(self, root: Path, released: Collection[str] = ()) -> None:
        self.root = root
        self.released = set(released)
        self.notebooks = notebooks(root)
        folders = [path.relative_to(root).parts[:-1] for path in self.notebooks] if root.is_dir() else []
        shared: tuple[str, ...] = folders[0] if folders else ()
        for parts in folders[1:]:  # the folders every notebook lies in (ex1-submissions/) name no one
            n = 0
            while n < min(len(shared), len(parts)) and shared[n] == parts[n]:
                n += 1
            shared = shared[:n]
        self._shared = len(shared)

    def student_id(self, path: Path, taken: set[str]) -> str:
        """The student of the notebook at ``path``: the first folder it lies in below the shared
        ones that names no assignment (an instructor may sort a class by assignment), else its file
        name (see :func:`student_id`)."""
        if not self.root.is_dir():
            return student_id(path, taken)
        parts = path.relative_to(self.root).parts
        folders = [part for part in parts[self._shared:-1] if part not in self.released]
        if folders:
            return student_id(path, taken, folder=folders[0])
        if path.stem in self.released:  # alone (one late submission): the nearest folder that names no assignment
            folder = next((part for part in reversed(parts[:-1]) if part not in self.released), None)
            return student_id(path, taken, folder=folder)
        return student_id(path, taken)


def student_id(path: Path, taken: set[str], folder: str | None = None) -> str:
    """A safe nbgrader student id, unique in ``taken``, from the student's ``folder`` (a learning
    platform's suffix dropped) or else the file's name."""
    name = _PLATFORM_SUFFIX.sub("", folder) if folder else path.stem
    base = re.sub(r"[^\w.-]+", "_", name).strip("._-") or "student"  # \w: 张三 stays 张三
    unique, n = base, 1
    while unique in taken:
        n += 1
        unique = f"{base}_{n}"
    taken.add(unique)
    return unique
