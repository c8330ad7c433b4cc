"""Rank side: keep a submission away from the instructor's files while it is graded.

The grading ranks run on the instructor's machine, next to the reference answers (solutions/,
grader/) and the class's other submissions and results (the nbgrader course directory). A
submission that imports or reads them would earn points it did not write. An audit hook
(PEP 578) is installed in each grading rank before the student's cell runs; it cannot be
removed from Python once added. It refuses:

- writing, creating, moving or removing files anywhere but the rank's own temporary folder
  and /dev/null (a ``.pth`` file in site-packages, or a ``json.py`` where the grader
  starts, would run in every later grading run);
- opening any file under a protected directory (``open``, ``os.open``, ``io.open_code``: so
  ``import``, ``exec(open(...))``, ``importlib`` and ``pathlib`` are covered alike). The audit
  event does not say which directory a relative path is relative to (``os.open(name,
  dir_fd=fd)``, an ``opener``), so a relative path is checked against the working directory and
  against every directory the rank holds open;
- moving, linking, removing or listing a protected directory, its files or a directory above
  it (``os.rename`` the answers out, ``os.link`` them elsewhere, then read the copy);
- importing the instructor's ``grader`` package by name;
- starting other programs (``cat solutions/...`` would read around the hook) or forking
  (a fork bomb takes the instructor's machine down, not just the rank);
- ``ctypes`` loading libraries or reading raw memory (the way to unhook an audit hook);
- opening sockets, and reading the other ranks' temporary folders: ranks that swap their data
  through a socket or a file communicate where no recorder looks, and an exercise that allows
  only some collectives would be passed by ranks that sum each other's tensors themselves;
- changing resource limits (a grader run as root could lift the rank's memory and file limits);
- signalling any process but the rank itself and what it started (``os.kill`` of the grader,
  which a rank finds as its launcher's parent, or of every process with ``os.kill(-1, ...)``).

The hook sees Python's opens only; files C++ opens (``torch.from_file``) are kept out of reach by
the kernel, where it can (:mod:`distlab.confine`, applied when the grading ranks are forked).
Two routes raise no audit event at all, ``_posixsubprocess.fork_exec`` (multiprocessing's spawn
context uses it) and ``signal.pidfd_send_signal``: they are replaced by refusals here, and the
kernel refuses them again for code that finds the originals (no exec, no new process, no signal
out of the rank).

It is defence in depth, not a sandbox: grade untrusted code in a container or VM as well.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from typing import Any

INSTRUCTOR_PACKAGES = ("grader",)
_PROGRAMS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                       "os.startfile", "pty.spawn", "os.fork", "os.forkpty"})
_RAW_MEMORY = frozenset({"ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata",
                         "ctypes.PyObj_FromPtr", "ctypes.string_at", "ctypes.wstring_at"})
_SIGNALS = frozenset({"os.kill", "os.killpg"})
# a socket of its own (to another rank, through the loopback they share): communication no recorder
# sees. torch.distributed's own connections are made in C++, before the submission runs
_SOCKETS = frozenset({"socket.__new__"})
# the rank's memory and file-size limits (distlab.confine): root could raise them again
_LIMITS = frozenset({"resource.setrlimit", "resource.prlimit"})
# Events whose path arguments reach a protected file without opening it there: looking (inside
# a protected directory) and changing (inside, or a directory above it: renaming /work moves
# /work/solutions out of the hook's sight).
_LOOK_EVENTS = frozenset({"os.listdir", "os.scandir", "os.link", "shutil.copyfile", "shutil.copymode",
                          "shutil.copystat", "shutil.copytree"})
_CHANGE_EVENTS = frozenset({"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod", "os.chown",
                            "os.utime", "os.chflags", "os.setxattr", "os.removexattr", "shutil.move", "shutil.rmtree"})
_PATH_EVENTS = _LOOK_EVENTS | _CHANGE_EVENTS | {"open"}
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


def _above(path: str, roots: tuple[str, ...]) -> bool:
    return any(root.startswith(path.rstrip(os.sep) + os.sep) for root in roots)


def _open_directories() -> list[str]:
    """The directories this process holds open (Linux): a relative path may be relative to any."""
    found: list[str] = []
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(os.sep) and os.path.isdir(target):
            found.append(target)
    return found


def _resolutions(path: Any) -> list[str]:
    """Where ``path`` may lead: itself if absolute, else from the working directory or any open directory."""
    if isinstance(path, int):
        return []
    try:
        text = os.fsdecode(path)
    except (TypeError, ValueError):
        return []
    if os.path.isabs(text):
        bases = [""]
    else:
        try:
            bases = [os.getcwd()]
        except OSError:
            bases = []
        bases += _open_directories()
    return [os.path.realpath(os.path.join(base, text)) for base in bases]


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _writes(args: tuple[Any, ...]) -> bool:
    """Whether an ``open`` audit event (path, mode, flags) opens for writing."""
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 else 0
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


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


def install(protected: Iterable[str], writable: Iterable[str] | None = None) -> None:
    """Install the hook once per rank process (hooks stack and cannot be removed). Given
    ``writable``, Python may create, change or remove files only there (see distlab.confine)."""
    global _installed
    if _installed is not None:
        return
    roots = tuple(sorted({p for p in (_real(root) for root in protected) if p and p != os.sep}))
    _installed = roots
    own = None if writable is None else tuple(sorted({p for p in (_real(w) for w in writable) if p}))

    busy = threading.local()  # the checks list /proc/self/fd: an event of their own, not to be checked

    def hook(event: str, args: tuple[Any, ...]) -> None:  # runs for every audit event: cheap tests first
        if event in _PATH_EVENTS:
            if getattr(busy, "on", False):
                return
            busy.on = True
            try:
                check_paths(event, args)
            finally:
                busy.on = False
        elif event == "import" and args and str(args[0]).split(".", 1)[0] in INSTRUCTOR_PACKAGES:
            raise ImportError(f"{REFUSED} import the instructor's reference code ({args[0]})")
        elif event in _PROGRAMS:
            raise PermissionError(f"{REFUSED} start other programs ({event})")
        elif event in _RAW_MEMORY:
            raise PermissionError(f"{REFUSED} use ctypes ({event})")
        elif event in _SOCKETS:
            raise PermissionError(f"{REFUSED} open sockets: ranks communicate through torch.distributed ({event})")
        elif event in _LIMITS and not (event == "resource.prlimit" and len(args) > 2 and args[2] is None):
            raise PermissionError(f"{REFUSED} change their resource limits ({event})")
        elif event in _SIGNALS and args and not _own(event, args[0]):
            raise PermissionError(f"{REFUSED} signal other processes ({event} {args[0]})")

    def check_paths(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            for path in _resolutions(args[0]) if args else ():
                if _inside(path, roots):
                    raise PermissionError(f"{REFUSED} read the instructor's files or another rank's ({path})")
                if own is not None and _writes(args) and not _inside(path, own):
                    raise PermissionError(f"{REFUSED} write outside their temporary folder ({path})")
            return
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)):
                for path in _resolutions(arg):
                    if _inside(path, roots) or (event in _CHANGE_EVENTS and _above(path, roots)):
                        raise PermissionError(f"{REFUSED} touch the instructor's files ({event} {path})")
                    if own is not None and event in _CHANGE_EVENTS and not _inside(path, own):
                        raise PermissionError(f"{REFUSED} write outside their temporary folder ({event} {path})")

    sys.addaudithook(hook)
    _refuse_unaudited_routes()


def _refuse_unaudited_routes() -> None:
    """Two routes Python raises no audit event for: ``_posixsubprocess.fork_exec`` (subprocess and
    multiprocessing's spawn start programs through it) and ``signal.pidfd_send_signal``. A
    submission that finds the real functions again meets the kernel instead (distlab.confine:
    no exec, no process, no signal out); this only says why in words."""
    try:
        import _posixsubprocess
    except ImportError:  # not POSIX
        return
    import signal

    def fork_exec(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(f"{REFUSED} start other programs (_posixsubprocess.fork_exec)")

    def pidfd_send_signal(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(f"{REFUSED} signal other processes (signal.pidfd_send_signal)")

    _posixsubprocess.fork_exec = fork_exec
    if hasattr(signal, "pidfd_send_signal"):
        signal.pidfd_send_signal = pidfd_send_signal
