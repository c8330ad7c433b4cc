"""Process facts for tests, read from /proc: is a pid alive, who is its parent, what does it listen on."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: Iterable[int], within: float = 5.0) -> list[int]:
    """The pids still alive after ``within`` seconds (polling; returns early when all are gone)."""
    pids = list(pids)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def signal_pending(pid: int, signum: int, within: float = 30.0) -> bool:
    """Whether ``signum`` is waiting to be delivered to ``pid`` (a stopped process keeps it
    pending), polled until it is or ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        with open(f"/proc/{pid}/status") as status:
            masks = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd:", "ShdPnd:"))]
        if any(mask & (1 << (signum - 1)) for mask in masks):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (started from any of its threads)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found += [int(p) for p in listing.read().split()]
        except FileNotFoundError:
            pass  # the thread ended while we looked
    return sorted(found)


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as raw:
        return [part.decode() for part in raw.read().split(b"\0") if part]


def listening_addresses(pid: int) -> list[str]:
    """Local addresses ('127.0.0.1:port' or hex for IPv6) of the TCP sockets ``pid`` listens on."""
    try:
        return _listening(pid)
    except FileNotFoundError:
        return []  # the process ended while we looked: it listens on nothing


def _listening(pid: int) -> list[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as rows:
            next(rows)
            for row in rows:
                cols = row.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if inode in inodes and state == "0A":  # LISTEN
                    address, port = local.split(":")
                    if table == "tcp":
                        octets = [str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)]
                        found.append(f"{'.'.join(octets)}:{int(port, 16)}")
                    else:
                        found.append(f"[{address}]:{int(port, 16)}")
    return found
