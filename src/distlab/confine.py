"""Confine a grading rank, by the kernel itself: folders it may not read, memory it may not take.

Memory: a submission that allocates 30 GB would have the OOM killer pick a victim on the
instructor's machine, perhaps the grader or the desktop. A grading rank gets a data limit
(``RLIMIT_DATA``: heap and private mappings, where tensors live), so the allocation fails in the
rank with a MemoryError, and it offers itself to the OOM killer first (``oom_score_adj``).

Folders: the grading sandbox's audit hook sees what Python opens, not what C++ opens
(``torch.from_file``, ``torch.jit.load`` read files without a Python ``open``). Landlock asks the
Linux kernel (5.13 and later, unprivileged) to refuse reading files under the protected
folders to this process and everything it starts, for good. It must happen before the process
starts any thread: a thread that already runs keeps its old rights. So grading ranks confine
themselves the moment they are forked, before their first thread.

Landlock allows what its rules list and refuses the rest, so the rules list everything but the
protected folders: each entry of each folder above a protected one, except the protected folders
and the folders on the way to them. A file created later directly in a folder above a protected
one (say in ``/tmp`` when the course lives in ``/tmp/course``) cannot be read back; folders and
files anywhere else are untouched.

Writing: a grading rank could otherwise write anywhere the grader's user may, and reach later
grading runs from there: a ``.pth`` file in site-packages runs in every Python the venv starts,
a ``json.py`` in the folder the grader is started from shadows the real one, the kit's own
sources are one ``open(..., "w")`` away, and C++ (``torch.save``) writes without any audit event.
So a grading rank may create, change and remove files only in a folder of its own (its TMPDIR),
its stack file and ``/dev/null``, and only so much: at most :data:`WRITE_QUOTA` bytes to a file
(:func:`limit_file_size`) and in the folder (its launcher measures it, :func:`folder_exceeds`).
Listing folders is left to the audit hook. Where
Landlock is missing (another OS, an older kernel), :func:`confine` returns False and the audit
hook stands alone.

Programs and signals: the audit hook refuses ``subprocess``, ``os.fork`` and ``os.kill``, but
Python has routes with no audit event: ``_posixsubprocess.fork_exec`` (which multiprocessing's
spawn context uses, and whose child is a fresh Python without the hook) and
``signal.pidfd_send_signal`` (one call from killing the grader). So a rank confined to its own
files may also start no program (Landlock refuses every exec), signal no process outside its
own domain (Landlock's signal scope, Linux 6.12+) and create no process at all, only threads
(:func:`forbid_new_processes`, a seccomp filter): a fork bomb has nowhere to start.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from collections.abc import Iterable

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_WRITE_FILE, _READ_FILE, _EXECUTE = 1 << 1, 1 << 2, 1 << 0
# creating, changing and removing anything (Landlock ABI 1); truncate(2) joined in ABI 3
_WRITE = _WRITE_FILE | sum(1 << bit for bit in range(4, 13))  # REMOVE_DIR ... MAKE_SYM
_TRUNCATE = 1 << 14
_FILE_ACCESS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE
_PR_SET_NO_NEW_PRIVS = 38
# struct landlock_ruleset_attr grew a third field, "scoped": what a process may reach outside its domain
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL, _SCOPE_ABI = 1 << 0, 1 << 1, 6
# what a rank confined to its own folder may write besides it (and its stack file). Not /dev/shm:
# it is memory, outside every limit on the rank, and it outlives the rank.
SHARED_WRITABLE = (os.devnull,)
# bytes a confined rank may keep in its folder, and write to any one file: honest answers write
# nothing, and a submission must not fill the instructor's disk (or /tmp, often memory)
WRITE_QUOTA = 256 << 20
QUOTA_ENTRIES = 10_000  # files and folders: more, and the folder counts as over its quota


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _abi(libc: ctypes.CDLL | None) -> int:
    """The Landlock ABI this kernel speaks (0 or less: none)."""
    if libc is None:
        return 0
    return int(libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)))


def available() -> bool:
    """Whether this kernel enforces Landlock for unprivileged processes."""
    return _abi(_libc()) >= 1


def signals_scoped() -> bool:
    """Whether this kernel keeps a confined rank's signals inside it (Landlock ABI 6, Linux 6.12)."""
    return _abi(_libc()) >= _SCOPE_ABI


def _ancestors(path: str) -> list[str]:
    found: list[str] = []
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return found
        found.append(parent)
        path = parent


def _inside(path: str, roots: set[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


_UNREADABLE: tuple[str, ...] = ()
_LISTINGS: dict[str, list[tuple[str, str, bool]]] = {}  # folder -> its entries, taken by prepare()


def _listing(folder: str) -> list[tuple[str, str, bool]]:
    """(path, where it leads, is it a folder) for each entry of ``folder`` (a real path)."""
    try:
        with os.scandir(folder) as entries:
            return [(e.path, os.path.realpath(e.path) if e.is_symlink() else e.path, e.is_dir()) for e in entries]
    except OSError:
        return []


def prepare(protected: Iterable[str]) -> None:
    """In a parent about to fork processes that confine themselves to folders under the same
    ones: list each folder above ``protected`` once, here, for all of them. Each child then only
    adds its rules: beside a /tmp of 3,000 entries, listing it took a grading rank 160 ms."""
    _LISTINGS.clear()
    roots = {os.path.realpath(p) for p in protected}
    for folder in {a for root in roots for a in _ancestors(root)}:
        _LISTINGS[folder] = _listing(folder)


def unreadable() -> tuple[str, ...]:
    """The folders :func:`confine` was asked to shut this process out of (whether or not the kernel
    could): the grading sandbox's audit hook refuses Python's opens there too, saying why."""
    return _UNREADABLE


def confine(protected: Iterable[str], writable: Iterable[str] | None = None) -> bool:
    """From now on this process, and what it starts, cannot read files under ``protected`` and,
    given ``writable``, cannot create, change or remove anything but the folders and files listed
    there. True when the kernel enforces it; False (nothing changed) when Landlock is unavailable."""
    global _UNREADABLE
    protected = tuple(protected)
    _UNREADABLE = protected
    roots = {os.path.realpath(p) for p in protected if os.path.exists(p)}
    roots.discard(os.sep)
    # a folder that holds Python or the kit itself (the inbox's folder is the home folder, and the
    # venv lives there) stays readable: the rank still imports from it. The audit hook still
    # refuses Python's opens there once the submission runs.
    needed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(__file__)))}
    roots = {root for root in roots if not any(_inside(folder, {root}) for folder in needed)}
    libc = _libc()
    abi = _abi(libc)
    if (not roots and writable is None) or libc is None or abi < 1:
        return False
    write = (_WRITE | (_TRUNCATE if abi >= 3 else 0)) if writable is not None else 0
    # a rank confined to its own files runs no program (no rule grants _EXECUTE) and, where the
    # kernel can, signals no process outside its domain
    handled_fs = _READ_FILE | write | (_EXECUTE if writable is not None else 0)
    # (and connects to no abstract Unix socket outside it: a desktop's D-Bus or X server)
    scoped = _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET if writable is not None and abi >= _SCOPE_ABI else 0
    attr = (ctypes.c_uint64 * 3)(handled_fs, 0, scoped)  # handled_access_fs, handled_access_net, scoped
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(24 if scoped else 8),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    try:
        def allow(path: str, access: int, is_dir: bool | None = None, folder_fd: int | None = None) -> None:
            try:  # relative to its folder when that is open: half the time of a whole path's lookup
                fd = os.open(path if folder_fd is None else os.path.basename(path), os.O_PATH | os.O_CLOEXEC,
                             dir_fd=folder_fd)
            except OSError:
                return
            try:
                if not (os.path.isdir(path) if is_dir is None else is_dir):
                    access &= _FILE_ACCESS  # a rule on a file may only grant what applies to files
                rule = _PathBeneath(access, fd)
                libc.syscall(_ADD_RULE, ruleset, ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                             ctypes.c_uint32(0))
            finally:
                os.close(fd)

        if not roots:
            allow(os.sep, _READ_FILE)
        above = {a for root in roots for a in _ancestors(root)}
        for folder in sorted(above):
            try:
                folder_fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                for path, real, is_dir in _LISTINGS.get(folder) or _listing(folder):
                    # a link to a protected folder, or to one above it, is left out
                    if path in above or real in above or _inside(path, roots) or _inside(real, roots):
                        continue
                    allow(path, _READ_FILE, is_dir, folder_fd)
            finally:
                os.close(folder_fd)
        for path in writable or ():
            real = os.path.realpath(path)
            allow(real, write | (0 if _inside(real, roots) else _READ_FILE))
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return libc.syscall(_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) == 0
    finally:
        os.close(ruleset)


# seccomp: struct sock_filter instructions, and the syscalls that make processes, per architecture
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_CLONE_THREAD = 0x00010000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
# audit arch -> (clone, clone3, the others refused outright: fork, vfork, pidfd_send_signal, and
# unshare and setns, the ways out of the private network a grading run gets (distlab.private_network))
_PROCESS_CALLS = {
    "x86_64": (0xC000003E, 56, 435, (57, 58, 424, 272, 308)),
    "aarch64": (0xC00000B7, 220, 435, (424, 97, 268)),
}


class _SockFilter(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32))


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter)))


def _process_filter(arch: int, clone: int, clone3: int, refused: tuple[int, ...],
                    x32: bool) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k): threads (clone with CLONE_THREAD) pass; other clones and
    the ``refused`` calls fail with EPERM; clone3 says ENOSYS, so the C library falls back
    to clone for its threads. Another architecture's calls (or x32's) are refused."""
    program: list[tuple[int, int, str | None, str | None]] = [  # (code, k, jump if true, jump if false)
        (_LD_ABS, 4, None, None),  # seccomp_data.arch
        (_JEQ, arch, None, "eperm"),
        (_LD_ABS, 0, None, None),  # seccomp_data.nr
        *([(_JGE, 0x40000000, "eperm", None)] if x32 else []),
        *[(_JEQ, number, "eperm", None) for number in refused],
        (_JEQ, clone3, "enosys", None),
        (_JEQ, clone, None, "allow"),
        (_LD_ABS, 16, None, None),  # args[0], the clone flags (low 32 bits)
        (_JSET, _CLONE_THREAD, "allow", "eperm"),
    ]
    labels = {"allow": len(program), "eperm": len(program) + 1, "enosys": len(program) + 2}

    def offset(at: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - at - 1

    return [(code, offset(at, jt), offset(at, jf), k) for at, (code, k, jt, jf) in enumerate(program)] + [
        (_RET, 0, 0, _ALLOW), (_RET, 0, 0, _ERRNO | 1), (_RET, 0, 0, _ERRNO | 38)]  # EPERM, ENOSYS


def forbid_new_processes() -> bool:
    """From now on this process, and its threads, may start threads but no process (no fork, no
    spawn, no vfork), may not signal through a pidfd and may not change namespaces. True when the kernel enforces it
    (Linux x86_64 or aarch64); False, nothing changed, elsewhere."""
    libc = _libc()
    machine = os.uname().machine if hasattr(os, "uname") else ""
    if libc is None or machine not in _PROCESS_CALLS:
        return False
    arch, clone, clone3, refused = _PROCESS_CALLS[machine]
    program = _process_filter(arch, clone, clone3, refused, x32=machine == "x86_64")
    filters = (_SockFilter * len(program))(*(_SockFilter(*instruction) for instruction in program))
    prog = _SockFprog(len(program), filters)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0


def limit_file_size(limit: int) -> None:
    """No file this process (and what it starts) writes may grow past ``limit`` bytes: the write
    fails with EFBIG (Python ignores SIGXFSZ, so it is an OSError, not a killed process)."""
    _lower(resource.RLIMIT_FSIZE, limit)


def _lower(which: int, limit: int) -> None:
    """Lower a resource limit to ``limit`` (never above a hard limit set before; with none, for good)."""
    _, hard = resource.getrlimit(which)
    wanted = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(which, (wanted, wanted if hard == resource.RLIM_INFINITY else hard))


def folder_exceeds(folder: str, quota: int, most_entries: int = QUOTA_ENTRIES) -> bool:
    """Whether ``folder`` takes more than ``quota`` bytes of disk, or holds more than
    ``most_entries`` files and folders (many small files fill a disk's inodes, and this walk)."""
    total = entries = 0
    for root, folders, files in os.walk(folder):
        entries += len(folders) + len(files)
        if entries > most_entries:
            return True
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512  # what it takes, sparse or not
            except OSError:
                continue
            if total > quota:
                return True
    return False


def limit_memory(limit: int) -> None:
    """At most ``limit`` bytes of data for this process and what it starts; it dies first under OOM."""
    _lower(resource.RLIMIT_DATA, limit)
    try:
        with open("/proc/self/oom_score_adj", "w") as adjust:
            adjust.write("1000")
    except OSError:
        pass  # not Linux: the limit alone
