"""IPython syntax in a ``%%dist`` cell: what ``%time``, ``%timeit``, ``%run``, ``%matplotlib`` and
``!cmd`` mean on a rank (``RankShell``), and in a graded answer cell (``InertShell``: nothing).

Why: notebooks written for one process time a line with ``%timeit``, start with ``%matplotlib
inline``, ask ``!hostname`` or ``%run train.py``; pasted under ``%%dist`` they were a SyntaxError on
every rank. A
rank runs Python, not IPython, so a cell that is not Python is handed to IPython's own input
transformer (the one a notebook cell goes through) and runs against this small shell, which does
on each rank what the line does in a notebook. What only the kernel can do (``%pip``, ``%who``,
``?`` help) fails with a message saying so.

``%timeit`` without ``-n`` picks its loop count by timing, and each rank would pick its own. When
the statement runs a collective, ranks that disagree would call it a different number of times
and hang; so the ranks that share the collective's group agree on each timing (the slowest rank's)
before choosing. A statement without a collective is timed by each rank alone, so ``if rank == 0:
%timeit ...`` works too.
"""

from __future__ import annotations

import ast
import os
import resource
import runpy
import shlex
import statistics
import subprocess
import sys
import time
import timeit
from typing import Any

from distlab.i18n import tr

INSTALLERS = ("pip", "conda", "mamba", "micromamba", "uv")
TIMEIT_TARGET = 0.2  # seconds one timing should take at least, as in IPython


def transform(source: str) -> str | None:
    """The cell as Python, as IPython would run it; None if IPython is not here or it changes nothing."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return None
    try:
        python = TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - IPython could not read it either: the SyntaxError stands
        return None
    # IPython drops the blank lines a cell starts with; put them back, so line numbers stay the cell's
    blank = next((i for i, line in enumerate(source.splitlines()) if line.strip()), 0)
    if blank and len(python.splitlines()) == len(source.splitlines()) - blank:
        python = "\n" * blank + python
    return python if python != source else None


class RankShell:
    """``get_ipython()`` in a rank's cells: the magics that make sense on every rank."""

    def __init__(self, namespace: dict[str, Any], device: Any = None) -> None:
        self.user_ns = namespace
        self.device = device
        self._previous = ""  # the folder before the last %cd (for %cd -)

    def get_ipython(self) -> RankShell:
        return self

    # --- what IPython's transformer writes -------------------------------------------------------
    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1) -> Any:
        local_ns = _caller_locals(sys._getframe(_stack_depth), self.user_ns)
        if name == "time":
            return self._time(line, local_ns)
        if name == "timeit":
            return self._timeit(line, None, local_ns)
        if name == "matplotlib":  # a rank's figures are drawn into the notebook already (distlab.rank_backend)
            return None
        if name in _EXPANDED:  # IPython fills {expr} and $name into these lines (not into %time/%timeit)
            line = self._expand(line, sys._getframe(_stack_depth))
        if name == "run":
            return self._run(line)
        if name in ("env", "set_env"):
            return _env(line, setting=name == "set_env")
        if name == "cd":
            return self._cd(line)
        if name == "pwd":
            return os.getcwd()
        raise _usage(_not_on_ranks("%" + name, line))

    def run_cell_magic(self, name: str, line: str, cell: str) -> Any:
        filename = sys._getframe(1).f_code.co_filename
        if name == "time":
            return self._time_cell(cell, filename)
        if name == "timeit":
            return self._timeit(line, cell, None)
        raise _usage(_not_on_ranks("%%" + name, line))

    def system(self, command: str) -> None:
        """``!cmd``: run it in a shell, its output printed line by line (so labelled by rank)."""
        self.user_ns["_exit_code"] = _stream(self._expand(command, sys._getframe(1)))

    def getoutput(self, command: str, split: bool = True, depth: int = 0) -> Any:
        """``lines = !cmd``: its output as IPython gives it (an SList of lines)."""
        done = subprocess.run(self._expand(command, sys._getframe(1)), shell=True, capture_output=True, text=True,
                              errors="replace", stdin=subprocess.DEVNULL)
        text = done.stdout + done.stderr
        if not split:
            return text
        try:
            from IPython.utils.text import SList
        except ImportError:  # pragma: no cover
            return text.splitlines()
        return SList(text.splitlines())

    def _expand(self, command: str, frame: Any) -> str:
        """``{expr}`` and ``$name`` filled from the cell's names, as IPython does for ``!cmd``."""
        try:
            from IPython.utils.text import DollarFormatter
        except ImportError:  # pragma: no cover
            return command
        names = {**self.user_ns, **(_caller_locals(frame, self.user_ns) or {})}
        try:
            return DollarFormatter().vformat(command, args=[], kwargs=names)
        except Exception:  # noqa: BLE001 - IPython too runs the command as written when it cannot fill it
            return command

    # --- %cd -----------------------------------------------------------------------------------------
    def _cd(self, line: str) -> None:
        """``%cd DIR`` as in IPython (``%cd`` alone: home; ``%cd -``: the folder before; ``-q``: quietly).
        The rank's own folder from then on, until the kernel changes its own (distlab.follow)."""
        words = shlex.split(line)
        quiet = "-q" in words
        words = [w for w in words if w != "-q"]
        if len(words) > 1:
            raise _usage(tr("%cd on the ranks takes one folder, not {line!r}", line=line))
        target = words[0] if words else "~"
        if target == "-":
            target = self._previous or os.getcwd()
        before = os.getcwd()
        try:
            os.chdir(os.path.expanduser(target))
        except OSError as exc:
            raise _usage(f"{target}: {exc.strerror}") from None
        self._previous = before
        if not quiet:
            print(os.getcwd())

    # --- %run ----------------------------------------------------------------------------------------
    def _run(self, line: str) -> None:
        """``%run script.py ARGS`` (or ``-m module``): the script as ``torchrun script.py ARGS`` would
        run it on this rank, under ``__main__`` with its own ``sys.argv``; its names are then the
        cell's (with ``-i`` it runs among them from the start, as IPython's %run does)."""
        words = shlex.split(line)
        shared = bool(words) and words[0] == "-i"
        words = words[1:] if shared else words
        if not words or (words[0] == "-m" and len(words) < 2) or (words[0].startswith("-") and words[0] != "-m"):
            raise _usage(tr("%run on the ranks takes a script and its arguments (%run train.py --epochs 2), "
                            "-i to run it among the cell's names, or -m module; not {line!r}", line=line))
        argv, path = sys.argv, sys.path[:]
        found: dict[str, Any] = {}
        try:
            if words[0] == "-m":
                sys.argv = [words[1], *words[2:]]
                found = runpy.run_module(words[1], run_name="__main__", alter_sys=True)
            else:
                script = os.path.abspath(words[0])
                sys.argv = list(words)
                sys.path.insert(0, os.path.dirname(script))  # as `python script.py`: its folder imports
                with open(script, "rb") as handle:
                    code = compile(handle.read(), script, "exec")
                found = self.user_ns if shared else {"__name__": "__main__", "__file__": script,
                                                     "__builtins__": __builtins__}
                exec(code, found)  # noqa: S102 - the learner's own script
        except SystemExit as done:  # a script's sys.exit(0) ends the script, not the rank
            if done.code not in (None, 0):
                raise
        finally:
            sys.argv, sys.path[:] = argv, path
        if not shared:
            self.user_ns.update({k: v for k, v in found.items() if not k.startswith("__")})

    # --- %time ------------------------------------------------------------------------------------
    def _time(self, line: str, local_ns: dict[str, Any] | None) -> Any:
        return self._timed(_line_code(line), local_ns)

    def _time_cell(self, cell: str, filename: str) -> Any:
        tree = ast.parse("\n" + cell, filename)  # the %%time line above: line numbers stay the cell's
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not cell.rstrip().endswith(";"):
            last = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
        start = _clocks()
        exec(compile(tree, filename, "exec"), self.user_ns)  # noqa: S102 - the learner's own cell
        value = eval(compile(last, filename, "eval"), self.user_ns) if last is not None else None  # noqa: S307
        _print_times(start)
        return value

    def _timed(self, code: Any, local_ns: dict[str, Any] | None) -> Any:
        start = _clocks()
        try:
            return eval(code, self.user_ns, local_ns)  # noqa: S307 - the learner's own line
        finally:
            _print_times(start)

    # --- %timeit ----------------------------------------------------------------------------------
    def _timeit(self, line: str, cell: str | None, local_ns: dict[str, Any] | None) -> Any:
        options, statement = _timeit_options(line)
        setup = "pass"
        if cell is not None:
            setup, statement = statement or "pass", cell
        timer = timeit.Timer(statement or "pass", setup, globals={**self.user_ns, **(local_ns or {})})
        repeat = options.get("r", 7)
        number = options.get("n") or self._agreed_number(timer)  # -n 0: chosen by timing, as in IPython
        runs = [t / number for t in timer.repeat(repeat, number)]
        result = _timeit_result(number, repeat, runs, options.get("p", 3))
        if "q" not in options:
            print(result)
        return result if "o" in options else None

    def _agreed_number(self, timer: timeit.Timer) -> int:
        """IPython's choice of loops (1, 10, 100, ... until a timing takes 0.2 s), each timing
        agreed on by the ranks of the group the statement's collectives ran on."""
        moved_before = _operation_counts()
        elapsed = timer.timeit(1)
        group = _moved_group(moved_before)
        number, elapsed = 1, self._slowest(elapsed, group)
        while elapsed < TIMEIT_TARGET and number < 10 ** 9:
            number *= 10
            elapsed = self._slowest(timer.timeit(number), group)
        return number

    def _slowest(self, seconds: float, group: Any) -> float:
        if group is None:
            return seconds
        import torch
        import torch.distributed as dist

        device = self.device if dist.get_backend(group) == "nccl" else "cpu"
        value = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
        return float(value.item())


class InertShell:
    """``get_ipython()`` where a graded answer cell runs (distlab.grading.harness).

    A student's answer cell ran in IPython, and lines left in it (``%timeit f(t)``, ``!pip
    install ...``, ``%matplotlib inline``, ``%%time`` on top) made the whole cell a SyntaxError for
    the grader: every part 0. Graded, those lines do nothing, except that ``%time`` runs its
    statement, so the cell defines what it defined in the student's notebook. Nothing is timed,
    printed or started: a grading rank may start no process.
    """

    def get_ipython(self) -> InertShell:
        return self

    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1) -> Any:
        if name != "time":
            return None
        frame = sys._getframe(_stack_depth)
        return eval(_line_code(line), frame.f_globals, frame.f_locals)  # noqa: S307 - the student's own line

    def run_cell_magic(self, name: str, line: str, cell: str) -> None:
        return None

    def system(self, command: str) -> None:
        return None

    def getoutput(self, command: str, split: bool = True, depth: int = 0) -> list[str]:
        return []


def as_python(source: str) -> str | None:
    """A graded answer cell as Python when it is IPython: a cell magic on its first line (``%%time``)
    becomes a blank line, so the body is the answer and keeps its line numbers, and the rest is
    read by IPython's transformer. None when it is Python already or cannot be read either way.
    A rewrite that still does not compile is returned when it kept the cell's lines: its error is
    on the student's line (``%%time`` on line 1 is fine, the missing bracket on line 7 is not)."""
    try:
        compile(source, "<answer>", "exec")
        return None
    except SyntaxError:
        pass
    lines = source.splitlines(True)
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        lines[first] = "\n"
    python = transform("".join(lines)) or "".join(lines)
    try:
        compile(python, "<answer>", "exec")
    except SyntaxError:
        kept_lines = python != source and len(python.splitlines()) == len(source.splitlines())
        return python if kept_lines else None
    return python


_EXPANDED = frozenset({"run", "env", "set_env", "cd"})


def _env(line: str, setting: bool) -> Any:
    """``%env`` (every variable, secrets hidden), ``%env NAME`` (its value), ``%env NAME=VALUE`` or
    ``%env NAME VALUE`` and ``%set_env ...`` (set it, saying so): IPython's rules, on this rank's
    environment, which is the rank's own until the kernel changes the same name (distlab.follow)."""
    text = line.strip()
    split = "=" if "=" in text else " "
    name, _, value = text.partition(split)
    name, value = name.strip(), value.strip()
    if not text and not setting:
        return {key: "<hidden>" if any(s in key.lower() for s in ("key", "token", "secret")) else val
                for key, val in os.environ.items()}
    if split not in text:
        if setting:
            raise _usage("usage is 'set_env var=val'")
        if name not in os.environ:
            raise _usage(f"Environment does not have key: {name}")
        return os.environ[name]
    if not name or any(ch.isspace() for ch in name):
        raise _usage(f"refusing to set env var with whitespace: {value!r}")
    os.environ[name] = value
    print(f"env: {name}={value}")
    return None


def _line_code(line: str) -> Any:
    """A magic's line compiled as IPython runs it: an expression gives its value, else statements."""
    tree = ast.parse(line.strip() or "pass", "<timed>")
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
        return compile(line.strip(), "<timed>", "eval")
    return compile(tree, "<timed>", "exec")


def _usage(message: str) -> Exception:
    """IPython's UsageError, the error a notebook gives for a magic it cannot run."""
    from IPython.core.error import UsageError

    return UsageError(message)


def _caller_locals(frame: Any, namespace: dict[str, Any]) -> dict[str, Any] | None:
    """The locals of the function a magic was written in (None at the top of the cell)."""
    return None if frame.f_locals is frame.f_globals or frame.f_globals is not namespace else dict(frame.f_locals)


def _not_on_ranks(magic: str, line: str) -> str:
    what = f"{magic} {line}".strip()
    name = magic.lstrip("%")
    if name in ("pinfo", "pinfo2"):
        what = f"{line}?"
    if name in INSTALLERS:
        return tr("{what} runs in the kernel, not on the ranks: put it in a cell of its own. The ranks use the "
                  "kernel's Python, so the next %%dist cell can import what it installed.", what=what)
    return tr("{what} runs in the kernel, not on the ranks: put it in a cell of its own. On the ranks a cell may use "
              "%time, %timeit, %run, %env, %cd, %pwd, %matplotlib and !commands.", what=what)


def _stream(command: str) -> int:
    process = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    assert process.stdout is not None
    try:
        for raw in iter(process.stdout.readline, b""):
            sys.stdout.write(raw.decode(errors="replace"))
            sys.stdout.flush()
        return process.wait()
    except BaseException:  # an interrupt: the command ends with the line that started it
        process.kill()
        process.wait()
        raise
    finally:
        process.stdout.close()


def _clocks() -> tuple[float, float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, where os.times() counts 10 ms ticks
    return usage.ru_utime, usage.ru_stime, time.perf_counter()


def _print_times(start: tuple[float, float, float]) -> None:
    user, system, wall = (now - then for now, then in zip(_clocks(), start, strict=True))
    print(f"CPU times: user {_format_time(user)}, sys: {_format_time(system)}, total: {_format_time(user + system)}")
    print(f"Wall time: {_format_time(wall)}")


def _format_time(seconds: float, precision: int = 3) -> str:
    """As IPython writes a duration: 3 significant digits in s, ms, µs or ns."""
    if seconds >= 60.0:
        minutes, rest = divmod(seconds, 60.0)
        return f"{int(minutes)}min {rest:.{precision}g} s"
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("\u03bcs", 1e6), ("ns", 1e9)):
        if seconds >= 1.0 / scale or unit == "ns":
            return f"{seconds * scale:.{precision}g} {unit}"
    return f"{seconds:.{precision}g} s"  # pragma: no cover


def _timeit_options(line: str) -> tuple[dict[str, int], str]:
    """``-n N -r R -p P -q -o`` at the front of ``line``, and the statement after them."""
    options: dict[str, int] = {}
    rest = line.strip()
    while rest.startswith("-"):
        word, _, after = rest.partition(" ")
        flag, value = word[1:2], word[2:]
        if flag in ("q", "o", "t", "c") and not value:
            options[flag] = 1
            rest = after.strip()
            continue
        if flag not in ("n", "r", "p"):
            raise _usage(tr("%timeit on the ranks takes -n, -r, -p, -q and -o, not {word}", word=word))
        if not value:
            value, _, after = after.strip().partition(" ")
        if not value.isdigit() or (flag != "n" and int(value) < 1):
            raise _usage(tr("%timeit -{flag} needs a whole number, not {value!r}", flag=flag, value=value))
        options[flag] = int(value)
        rest = after.strip()
    return options, rest


def _timeit_result(number: int, repeat: int, runs: list[float], precision: int) -> Any:
    """IPython's TimeitResult, which prints as a notebook's %timeit does (and is what -o returns)."""
    try:
        from IPython.core.magics.execution import TimeitResult
    except ImportError:  # pragma: no cover
        return f"{_format_time(statistics.mean(runs))} per loop ({repeat} runs, {number} loops each)"
    return TimeitResult(number, repeat, min(runs), max(runs), [r * number for r in runs], 0.0, precision)


def _operation_counts() -> dict[Any, int]:
    """How many operations each of this rank's process groups has run (torch's own counter)."""
    try:
        from torch.distributed import distributed_c10d as c10d

        if not c10d.is_initialized():
            return {}
        return {group: group._get_sequence_number_for_group()  # type: ignore[attr-defined]
                for group in list(c10d._world.pg_names)}
    except Exception:  # noqa: BLE001 - a torch without these: each rank times alone
        return {}


def _moved_group(before: dict[Any, int]) -> Any:
    """A group whose operations ran since ``before`` (None: the statement ran none)."""
    after = _operation_counts()
    moved = [group for group, count in after.items() if count != before.get(group, count)]
    return moved[0] if moved else None

