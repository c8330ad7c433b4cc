"""Every exception distlab raises, in one place.

Each error carries the per-rank facts a learner needs (which rank, which line, where it was stuck) and
renders itself for IPython through ``_render_traceback_``, so a failed cell shows the ranks' own
tracebacks instead of distlab's internals. All of them pickle, so a grader in another process can
receive them intact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distlab.i18n import tr
from distlab.protocol import FailureKind, RankFailure
from distlab.report import format_failures, format_stacks


class DistlabError(Exception):
    """Base class: catch this to catch anything distlab raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class RankError(DistlabError):
    """One or more ranks raised (or crashed) while running a cell or function."""

    def __init__(self, message: str, failures: Sequence[RankFailure] = (), report: str = "") -> None:
        super().__init__(message)
        self.failures = list(failures)
        self.report = report

    @classmethod
    def from_failures(cls, failures: Sequence[RankFailure], world_size: int, note: str = "") -> RankError:
        ranks = sorted({f.rank for f in failures})
        message = tr("{failed} of {n} ranks failed", failed=len(ranks), n=world_size)
        first = failures[0]
        message += f" (rank {first.rank}: {first.exc_type}: {first.message})" if first.message else (
            f" (rank {first.rank}: {first.exc_type})")
        report = format_failures(failures)
        if note:
            report += "\n" + note
        return cls(message, failures, report)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failures, self.report))

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}", "", *self.report.splitlines()]


class RankTimeout(DistlabError, TimeoutError):
    """Ranks did not finish: a deadline passed, or some ranks hung after another failed.

    ``stacks`` maps each stuck rank to its Python stack at the moment it was stopped.
    """

    def __init__(
        self,
        message: str,
        stacks: dict[int, str] | None = None,
        failures: Sequence[RankFailure] = (),
        report: str = "",
    ) -> None:
        super().__init__(message)
        self.stacks = dict(stacks or {})
        self.failures = list(failures)
        self.report = report

    @classmethod
    def hung(
        cls,
        reason: str,
        stacks: dict[int, str],
        failures: Sequence[RankFailure],
        cell_lines: dict[str, list[str]] | None = None,
        note: str = "",
    ) -> RankTimeout:
        parts = []
        if failures:
            parts.append(format_failures(failures))
        if stacks:
            parts.append(format_stacks(stacks, cell_lines or {}))
        if note:
            parts.append(note)
        return cls(reason, stacks, failures, "\n".join(parts))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.stacks, self.failures, self.report))

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}", "", *self.report.splitlines()]


class CellInterrupted(KeyboardInterrupt):
    """The user interrupted a cell; ranks were interrupted too (and restarted if they would not stop)."""

    def __init__(self, message: str = "interrupted", report: str = "") -> None:
        super().__init__(message)
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.report))

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}", "", *self.report.splitlines()]


class PoolDied(DistlabError):
    """The rank pool could not start or was lost (the launcher died, a rank failed to join)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args)


class TransferFailed(DistlabError):
    """A value could not move between the kernel and the ranks: it does not pickle (a lock, a
    generator, an open file), or its type cannot be imported where it arrives."""

    @classmethod
    def to_ranks(cls, what: str, exc: BaseException) -> TransferFailed:
        return cls(tr("{what} cannot be sent to the ranks ({error}). Send plain data (numbers, lists, tensors) "
                      "or functions.", what=what, error=_one_line(exc)))

    @classmethod
    def to_kernel(cls, what: str, exc: BaseException) -> TransferFailed:
        return cls(tr("{what} cannot be sent to the kernel ({error}). Return plain data (numbers, lists, "
                      "tensors) instead.", what=what, error=_one_line(exc)))

    @classmethod
    def not_rebuilt(cls, rank: int, exc: BaseException) -> TransferFailed:
        return cls(tr("rank {rank}'s value cannot be rebuilt in the kernel ({error}). Classes and functions defined in "
                      "%%dist cells come along; a type from a module that only the ranks can import does not: return plain "
                      "data (numbers, lists, tensors) instead.", rank=rank, error=_one_line(exc)))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args)


def _one_line(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose str() fails still deserves a name
        text = "str() failed"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class BackendUnavailable(DistlabError, ValueError):
    """The requested backend cannot run here (for instance NCCL with fewer GPUs than ranks)."""

    @classmethod
    def nccl_needs_gpus(cls, world_size: int, gpus: int) -> BackendUnavailable:
        return cls(tr("--backend nccl needs one GPU per rank: {n} ranks but {gpus} GPU(s) visible. "
                      "Use --backend gloo to run on the CPU, or fewer ranks.", n=world_size, gpus=gpus))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args)


class ReferenceFailed(DistlabError, RuntimeError):
    """The instructor's reference answer failed a graded part: the grader cannot be trusted here."""

    @classmethod
    def on_part(cls, assignment: str, part: str, message: str) -> ReferenceFailed:
        return cls(f"{assignment}: the reference solution fails part {part!r} on this machine, so no "
                   f"submission can be graded fairly: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args)


class SubmissionFailed(DistlabError):
    """Graded code failed a case on a rank; the message is the student's feedback (case, exception,
    line of their cell). The rank reports it with ``failure_kind``, so the grader never reads types
    from text."""

    failure_kind = FailureKind.FEEDBACK


class SubmissionNotLoaded(SubmissionFailed):
    """The answer cell itself failed (syntax, an error at top level, no function): every part would."""

    failure_kind = FailureKind.NOT_LOADED
