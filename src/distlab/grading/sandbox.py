"""Rank side: keep a submission away from the instructor's files while it is graded.

The grading ranks run on the instructor's machine, next to the reference answers (solutions/,
grader/) and the class's other submissions and results (the nbgrader course directory). A
submission that imports or reads them would earn points it did not write. An audit hook
(PEP 578) is installed in each grading rank before the student's cell runs; it cannot be
removed from Python once added. It refuses:

- opening any file under a protected directory (``open``, ``os.open``, ``io.open_code``: so
  ``import``, ``exec(open(...))``, ``importlib`` and ``pathlib`` are covered alike);
- importing the instructor's ``grader`` package by name;
- starting other programs (``cat solutions/...`` would read around the hook) or forking
  (a fork bomb takes the instructor's machine down, not just the rank);
- ``ctypes`` loading libraries or reading raw memory (the way to unhook an audit hook);
- signalling any process but the rank itself and what it started (``os.kill`` of the grader,
  which a rank finds as its launcher's parent, or of every process with ``os.kill(-1, ...)``).

It is defence in depth, not a sandbox: grade untrusted code in a container or VM as well.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

INSTRUCTOR_PACKAGES = ("grader",)
_PROGRAMS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                       "os.startfile", "pty.spawn", "os.fork", "os.forkpty"})
_RAW_MEMORY = frozenset({"ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata",
                         "ctypes.PyObj_FromPtr", "ctypes.string_at", "ctypes.wstring_at"})
_SIGNALS = frozenset({"os.kill", "os.killpg"})
REFUSED = "the grader does not let submissions"

_installed: tuple[str, ...] | None = None


def _real(path: Any) -> str | None:
    if isinstance(path, int):  # os.open on a directory fd, or open(fd): no path to check
        return None
    try:
        return os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _own(event: str, target: Any) -> bool:
    """True for the rank itself or its own process group (the rank leads one: what it started)."""
    if not isinstance(target, int):
        return False
    me = os.getpid()
    leads = os.getpgrp() == me  # forked by distlab's launcher: yes; otherwise only itself
    if event == "os.killpg":
        return leads and target in (0, me)
    if target > 0:
        return target == me or (leads and _group_of(target) == me)
    return leads and target in (0, -me)  # 0: the rank's own group; -1 (every process) is refused


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def install(protected: Iterable[str]) -> None:
    """Install the hook once per rank process (hooks stack and cannot be removed)."""
    global _installed
    if _installed is not None:
        return
    roots = tuple(sorted({p for p in (_real(root) for root in protected) if p and p != os.sep}))
    _installed = roots

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args:
            path = _real(args[0])
            if path is not None and _inside(path, roots):
                raise PermissionError(f"{REFUSED} read the instructor's files ({path})")
        elif event == "import" and args and str(args[0]).split(".", 1)[0] in INSTRUCTOR_PACKAGES:
            raise ImportError(f"{REFUSED} import the instructor's reference code ({args[0]})")
        elif event in _PROGRAMS:
            raise PermissionError(f"{REFUSED} start other programs ({event})")
        elif event in _RAW_MEMORY:
            raise PermissionError(f"{REFUSED} use ctypes ({event})")
        elif event in _SIGNALS and args and not _own(event, args[0]):
            raise PermissionError(f"{REFUSED} signal other processes ({event} {args[0]})")

    sys.addaudithook(hook)
