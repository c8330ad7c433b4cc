"""Rank side: turn a submission into a function, call it, and report plain data.

Everything here runs in a fresh grading rank. The guard is installed before the submission's
source is executed; results leave the rank as dicts of str/int/bytes (never as objects the
submission made), and a failure leaves as a ``SubmissionFailed`` whose message is written for
the student: the case, the exception and the line of their cell.
"""

from __future__ import annotations

import builtins
import linecache
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from distlab import confine, rank_shell
from distlab.errors import SubmissionFailed, SubmissionNotLoaded
from distlab.grading import sandbox
from distlab.grading.guard import CommGuard
from distlab.grading.spec import Submission

SUBMISSION_FILE = "<solution cell>"
CASE_MARK = "@distlab-grading-case@ "  # printed before each case so a hang can be placed
INPUTS = "__distlab_grading_inputs__"  # the name the runner pushes each rank's own inputs under


def own_inputs() -> list[Any]:
    """This rank's inputs, one per case, which the grading process pushed to this rank alone just
    before the batch (``Exercise.rank_inputs``); taken before the submission's source runs."""
    namespace = sys.modules["__main__"].__dict__
    if INPUTS not in namespace:
        raise RuntimeError("no inputs were sent to this grading rank: an exercise whose rank side uses "
                           "run_cases declares rank_inputs (see spec.Exercise)")
    return namespace.pop(INPUTS)  # type: ignore[no-any-return]


def load_function(submission: Submission, guard: CommGuard) -> Callable[..., Any]:
    """Execute the trusted setup, then the student's cell, in a fresh namespace; return the function."""
    if submission.fn is not None:
        return submission.fn
    fn = load_namespace(submission, guard).get(submission.function)
    if not callable(fn):
        raise SubmissionNotLoaded(f"{submission.function} is not defined by your solution cell")
    return fn  # type: ignore[no-any-return]


def load_namespace(submission: Submission, guard: CommGuard) -> dict[str, Any]:
    """Execute the trusted setup, then the student's cell, in a fresh namespace; return it.

    For exercises whose answer cell defines several functions; a function shipped by value (an
    in-kernel check) comes back as ``{submission.function: fn}``.
    """
    if submission.fn is not None:
        return {submission.function: submission.fn}
    namespace: dict[str, Any] = {"__name__": "__submission__", "__builtins__": builtins}
    exec(compile(submission.setup_source, "<setup cell>", "exec"), namespace)
    source = submission.source or ""
    linecache.cache[SUBMISSION_FILE] = (len(source), None, source.splitlines(True), SUBMISSION_FILE)
    python = rank_shell.as_python(source)  # %timeit or !pip left in the cell: read before the sandbox
    if python is not None:
        namespace["get_ipython"] = rank_shell.InertShell().get_ipython
    # after the trusted setup, before the student's code; the rank's TMPDIR is its own (launcher)
    # the instructor's folders, and the other ranks' (which the launcher shut this rank out of)
    sandbox.install((*submission.protected, *confine.unreadable()), (tempfile.gettempdir(), *confine.SHARED_WRITABLE))
    try:
        code = compile(source if python is None else python, SUBMISSION_FILE, "exec")
    except SyntaxError as exc:
        raise SubmissionNotLoaded(f"your solution cell does not compile: line {exc.lineno}: {exc.msg}") from None
    raised: BaseException | None = None
    with guard.watch() as log:
        try:
            exec(code, namespace)
        except BaseException as exc:  # noqa: BLE001 - anything the cell raises is feedback
            raised = exc
    if log["ops"]:
        raise SubmissionNotLoaded("your solution cell communicates when it is run; "
                                  "do all communication inside the function")
    # a cell that raised after defining the function (a demo at its end that starts ranks, which
    # a grading rank may not) is graded as nbgrader grades it: by what it defined
    if raised is not None and not callable(namespace.get(submission.function)):
        raise SubmissionNotLoaded(f"running your solution cell raised {_describe(raised)}")
    return namespace


def call(fn: Callable[..., Any], case_text: str, *args: Any, **kwargs: Any) -> Any:
    """Call the student's function; any exception becomes a SubmissionFailed naming the case."""
    print(f"{CASE_MARK}{case_text}", flush=True)
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
        raise SubmissionFailed(f"{case_text}: raised {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    try:
        said = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises is still the student's failure
        said = "<exception str() failed>"
    text = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == SUBMISSION_FILE]
    if frames:
        last = frames[-1]
        text += f" (line {last.lineno} of your solution cell: {(last.line or '').strip()})"
    return text


def tensor_record(value: Any) -> dict[str, Any]:
    """A tensor as plain data; anything that is not exactly a torch.Tensor is recorded as such."""
    if type(value) is not torch.Tensor:
        return {"type": f"{type(value).__module__}.{type(value).__qualname__}"}
    t = value.detach().to("cpu").contiguous()
    return {
        "type": "torch.Tensor",
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "data": t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"",
    }


def flush() -> None:
    sys.stdout.flush()


@dataclass
class RankContext:
    """What one case's run on a rank needs: the student's function, the recorder, who we are."""

    fn: Callable[..., Any]
    watcher: CommGuard
    rank: int
    world_size: int


def run_cases(submission: Submission, cases: tuple[Any, ...],
              one_case: Callable[[RankContext, Any, Any], dict[str, Any]]) -> list[dict[str, Any]]:
    """The rank side of every exercise but ex7: take this rank's inputs, install the guard before
    the student's source runs, load the function, then one plain record per case from
    ``one_case(context, case, this rank's input for the case)``."""
    import torch.distributed as dist

    from distlab.grading import guard

    inputs = own_inputs()
    watcher = guard.install()  # before the student's source runs
    context = RankContext(load_function(submission, watcher), watcher, dist.get_rank(), dist.get_world_size())
    return [one_case(context, case, data) for case, data in zip(cases, inputs, strict=True)]


def run_in_place_cases(
    submission: Submission,
    cases: tuple[Any, ...],
    extra_kwargs: Callable[[Any], dict[str, Any]] = lambda case: {},
) -> list[dict[str, Any]]:
    """On every rank: call the student's function on each case's tensor (which it must change in
    place) and return plain records of the tensor and the communication.

    ``extra_kwargs`` runs on every rank, in case order (it may create process groups, which every
    rank must do in the same order).
    """
    def one_case(ctx: RankContext, case: Any, tensor: torch.Tensor) -> dict[str, Any]:
        kwargs = extra_kwargs(case)
        with ctx.watcher.watch() as log:
            call(ctx.fn, case.describe(ctx.world_size), tensor, **kwargs)
        return {"tensor": tensor_record(tensor), **log}

    return run_cases(submission, cases, one_case)

