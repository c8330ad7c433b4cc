"""The ranks follow the kernel's working folder, import path and environment variables.

A ``%%dist`` cell reads as a cell of the notebook, so ``%cd data``, ``%env SEED=1``,
``os.chdir`` or ``sys.path.append("src")`` in the kernel should hold on the ranks too, and so
should ``%autoreload 2``: the ranks are persistent, so a module the learner edits beside the
notebook would otherwise run in its old version on the ranks until they restart. But the
ranks are forked once, from a launcher started when the extension loaded, and a process's folder
and environment are its own: without this, a file a later cell wrote beside the notebook did not
import on the ranks, and ``%env`` never reached them.

Each cell carries what the kernel has now (its folder, its import path, and the variables it
changed since the launcher started). A rank applies only what changed since the cell before, so
what a rank's own cell set (``os.chdir`` or ``os.environ[...]`` on the ranks) stays until the
kernel changes the same thing again.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from typing import Any

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
    mode, aimported = autoreload_mode()
    return KernelContext(cwd, import_path(), _changed_since(baseline), mode, aimported)


def autoreload_mode() -> tuple[int, tuple[str, ...]]:
    """The kernel's ``%autoreload`` mode (0 when off or not loaded) and the modules ``%aimport``
    marked, read from IPython's autoreload extension (its state has no public reader)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    try:
        reloader = shell.magics_manager.registry["AutoreloadMagics"]._reloader  # type: ignore[union-attr]
    except (AttributeError, KeyError):
        return 0, ()
    if not reloader.enabled:
        return 0, ()
    return (3 if reloader.autoload_obj else 2 if reloader.check_all else 1), tuple(reloader.modules)


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
        self._reloader: Any = None  # IPython's ModuleReloader, from the first cell under %autoreload
        self._loaded: set[str] = set()  # the modules imported when the last task began

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
        if context.autoreload:
            self._reload_changed_modules(context)
        elif self._reloader is not None:
            self._reloader.enabled = False  # %autoreload 0 in the kernel
        return note

    def _reload_changed_modules(self, context: KernelContext) -> None:
        """What IPython's autoreload does before each cell of the kernel, here before each task: reload
        the modules whose files changed (all in modes 2 and 3, the %aimport-ed ones in mode 1), and
        update the functions and classes already imported from them. Errors print as in IPython."""
        if self._reloader is None:
            try:
                from IPython.extensions.autoreload import ModuleReloader
            except ImportError:  # pragma: no cover - IPython is a dependency
                return
            self._reloader = ModuleReloader()  # notes every module's time now: later edits reload
        self._skip_libraries(set(sys.modules) - self._loaded)  # all at first; then what came while it was off
        reloader = self._reloader
        reloader.enabled = True
        reloader.check_all = context.autoreload >= 2
        for name in context.aimported:
            reloader.mark_module_reloadable(name)
        reloader.check()
        self._loaded = set(sys.modules)

    def after_task(self) -> None:
        """As IPython does after each cell: note the file times of the modules the cell imported,
        so an edit made before the next cell is seen as one."""
        reloader = self._reloader
        if reloader is None or not reloader.enabled:
            return
        new = set(sys.modules) - self._loaded
        for name in new:
            _, mtime = reloader.filename_and_mtime(sys.modules[name])
            if mtime is not None:
                reloader.modules_mtimes[name] = mtime
        self._skip_libraries(new)
        self._loaded = set(sys.modules)

    def _skip_libraries(self, names: set[str]) -> None:
        """Leave out of the checks what lives in the standard library or site-packages (torch alone
        is over a thousand modules: stat-ing each before every cell cost 4 ranks 20 ms). What a
        learner edits lies beside the notebook, or in a package installed from its source."""
        for name in names:
            module = sys.modules.get(name)
            where = getattr(module, "__file__", None)
            if not isinstance(where, str) or os.path.abspath(where).startswith(_libraries()):
                self._reloader.skip_modules[name] = True


_BORN = object()  # "as at the launcher's start": a name the kernel has not changed


@functools.cache
def _libraries() -> tuple[str, ...]:
    """The standard library's and site-packages' folders (read when autoreload is first on, not at
    every rank's start: sysconfig costs about 2 ms to import and ask)."""
    import sysconfig

    return tuple(sorted({os.path.join(os.path.abspath(path), "") for key, path in sysconfig.get_paths().items()
                         if key in ("stdlib", "platstdlib", "purelib", "platlib")}))


def _cwd_or_empty() -> str:
    try:
        return os.getcwd()
    except OSError:
        return ""
