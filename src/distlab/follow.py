"""The ranks follow the kernel's working folder, import path and environment variables.

A ``%%dist`` cell reads as a cell of the notebook, so ``%cd data``, ``%env SEED=1``,
``os.chdir`` or ``sys.path.append("src")`` in the kernel should hold on the ranks too. But the
ranks are forked once, from a launcher started when the extension loaded, and a process's folder
and environment are its own: without this, a file a later cell wrote beside the notebook did not
import on the ranks, and ``%env`` never reached them.

Each cell carries what the kernel has now (its folder, its import path, and the variables it
changed since the launcher started). A rank applies only what changed since the cell before, so
what a rank's own cell set (``os.chdir`` or ``os.environ[...]`` on the ranks) stays until the
kernel changes the same thing again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from distlab.protocol import KernelContext

# the variables each rank has its own value of (distlab's rendezvous, torchrun's names, the GPU it
# binds, its private TMPDIR when graded, its figure backend): the kernel's value would be wrong there
_RANKS_OWN = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "CUDA_VISIBLE_DEVICES", "TMPDIR", "MPLBACKEND",
    "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "PYTHONUNBUFFERED",
})


def _followed(name: str) -> bool:
    return name not in _RANKS_OWN and not name.startswith(("TORCHELASTIC_", "DISTLAB_", "SLURM_"))


def capture(baseline: Mapping[str, str]) -> KernelContext:
    """The kernel's context now; ``baseline`` is the environment the launcher (and so every rank)
    started with."""
    cwd = _cwd_or_empty()  # "" when the kernel's folder was removed: the ranks stay where they are
    return KernelContext(cwd, import_path(), _changed_since(baseline))


# Reading os.environ decodes every name and value, about 1 ms a cell for a hundred variables, and
# the environment seldom changes between cells: the last answer is kept with a copy of the raw
# table it came from (CPython's os.environ._data; without it, every cell reads os.environ).
_last: tuple[dict[object, object], Mapping[str, str], tuple[tuple[str, str | None], ...]] | None = None


def _changed_since(baseline: Mapping[str, str]) -> tuple[tuple[str, str | None], ...]:
    global _last
    raw = getattr(os.environ, "_data", None)
    if isinstance(raw, dict):
        if _last is not None and _last[1] is baseline and _last[0] == raw:
            return _last[2]
        raw = dict(raw)
    now = os.environ
    changed: list[tuple[str, str | None]] = [(name, value) for name, value in now.items() if baseline.get(name) != value and _followed(name)]
    changed += [(name, None) for name in baseline if name not in now and _followed(name)]
    answer = tuple(sorted(changed, key=lambda item: item[0]))
    if isinstance(raw, dict):
        _last = (raw, baseline, answer)
    return answer


def import_path() -> tuple[str, ...]:
    """The kernel's ``sys.path`` as text: ``sys.path.append(Path("src"))`` is common, and a message
    may carry nothing but plain values (a Path would be refused on the rank's side)."""
    entries = (os.fspath(entry) if isinstance(entry, os.PathLike) else entry for entry in sys.path)
    return tuple(entry for entry in entries if isinstance(entry, str))


class Follower:
    """A rank's side: applies what the kernel changed since the cell before."""

    def __init__(self) -> None:
        self._born = dict(os.environ)
        self._cwd = _cwd_or_empty()
        self._environ: dict[str, str | None] = {}

    def apply(self, context: KernelContext) -> str:
        """Follow the kernel; returns a note when its folder does not exist here (another host)."""
        note = ""
        if context.cwd and context.cwd != self._cwd:
            self._cwd = context.cwd
            try:
                os.chdir(context.cwd)
            except OSError as exc:
                note = f"{context.cwd}: {exc.strerror}"
        sys.path.extend(entry for entry in context.sys_path if entry not in sys.path)  # after the rank's own
        environ = dict(context.environ)
        for name in environ.keys() | self._environ.keys():
            if environ.get(name, _BORN) == self._environ.get(name, _BORN):
                continue  # the kernel did not change it since the last cell: a rank's own value stays
            value = environ[name] if name in environ else self._born.get(name)
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._environ = environ
        return note


_BORN = object()  # "as at the launcher's start": a name the kernel has not changed


def _cwd_or_empty() -> str:
    try:
        return os.getcwd()
    except OSError:
        return ""
