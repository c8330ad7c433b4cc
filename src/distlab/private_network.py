"""A network of their own for the ranks of one grading run: loopback, and nothing else.

Why: Landlock and the audit hook keep a submission away from files and processes, but not from
sockets, and gloo needs TCP between the ranks, so sockets cannot simply be refused. A submission
could then reach whatever listens on the instructor's machine (a Jupyter server on 127.0.0.1, a
database, the grader's own rank store) or send what it found anywhere on the internet. In a
network namespace of their own the ranks still reach each other on 127.0.0.1, and nothing else
exists: every other address is unreachable, every port on the host's loopback is out of sight.

The first rank of a run makes the namespace (a user namespace around it when not root, so no
privilege is needed) and brings its loopback up; the others join it through ``/proc/<pid>/ns``.
Without root the ranks keep no capability inside; as root, the seccomp filter of
:func:`distlab.confine.forbid_new_processes` refuses ``setns`` and ``unshare``, so no rank steps
back out. Where namespaces are missing (another OS, a kernel or sandbox that forbids them)
:func:`works_here` says so and the ranks share the host's network as before.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

from distlab.confine import _libc

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH14x"  # struct ifreq: the name, then the flags
_CAPABILITY_VERSION_3 = 0x20080522
# the namespace is new and private, so these ports are free: every rank knows them in advance
STORE_PORT = 29500
SCRIPTS_PORT = 29501


def works_here() -> bool:
    """Whether this machine lets a process make a private network (tried in a short-lived child)."""
    if _libc() is None or not hasattr(os, "fork"):
        return False
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            isolate()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def isolate() -> None:
    """Move this (single-threaded) process into a new network namespace with loopback up."""
    libc = _libc()
    if libc is None:
        raise OSError("network namespaces need Linux")
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(_CLONE_NEWNET if uid == 0 else _CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    if uid != 0:  # the same ids inside, so files keep their owner
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as entry:
                entry.write(text)
    _bring_up_loopback()
    if uid != 0:
        _drop_capabilities()


def join(pid: int) -> None:
    """Move this (single-threaded) process into the private network that ``pid`` made."""
    libc = _libc()
    if libc is None:
        raise OSError("network namespaces need Linux")
    kinds = [("net", _CLONE_NEWNET)] if os.geteuid() == 0 else [("user", _CLONE_NEWUSER), ("net", _CLONE_NEWNET)]
    for kind, flag in kinds:
        fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(fd, flag) != 0:
                raise OSError(ctypes.get_errno(), f"setns {kind}")
        finally:
            os.close(fd)
    if os.geteuid() != 0:
        _drop_capabilities()


def store_socket() -> socket.socket:
    """The listening socket of rank 0's store, on the private loopback."""
    store = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    store.bind(("127.0.0.1", STORE_PORT))
    store.listen(128)
    return store


def _bring_up_loopback() -> None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        flags = struct.unpack(_IFREQ, fcntl.ioctl(probe, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(probe, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))
    finally:
        probe.close()


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32))


def _drop_capabilities() -> None:
    """Entering a user namespace grants every capability inside it; a rank needs none."""
    libc = _libc()
    assert libc is not None
    if libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), (_CapData * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset")
