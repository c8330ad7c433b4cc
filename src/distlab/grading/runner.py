"""Trusted side: run each part on fresh ranks within its time budget and judge what comes back.

Each batch gets a brand-new set of rank processes (forked by distlab's preloaded launcher, which
never runs student code), so a submission that patched torch in one part cannot touch the next.
Each rank is then sent its own inputs, made here with a key no rank has (``Exercise.rank_inputs``):
a rank that wants another rank's data must communicate for it.
Rank results are unpickled with an unpickler that refuses every class: the ranks send only
plain data (see ``harness.tensor_record``), and a submission that tries to smuggle an object
back gets an error, not code execution here. A hang ends at the part's deadline; the part scores
zero and the remaining parts are graded normally. How long a part may run comes from the
instructor's reference answer, timed on the same machine (``Budgets``, ``calibrate``).
"""

from __future__ import annotations

import io
import pickle
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from distlab.errors import PoolDied, RankError, RankTimeout, ReferenceFailed
from distlab.grading import compare
from distlab.grading.harness import CASE_MARK, INPUTS, SUBMISSION_FILE
from distlab.grading.spec import (
    DEFAULT_PART_TIMEOUT,
    Batch,
    Check,
    Exercise,
    Part,
    PartResult,
    Submission,
    SubmissionResult,
    source_digest,
)
from distlab.hub import Hub
from distlab.pool import Pool
from distlab.protocol import FailureKind, RankFailure

MAX_MESSAGE = 900
RANK_MEMORY = 2 << 30  # bytes of data a grading rank may hold: torch takes 0.26 GB, the exercises' tensors far less


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds only what pickle encodes natively (dict, list, str, bytes, numbers, None)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"grading results may hold plain data only, not {module}.{name}")


def plain_loads(data: bytes | None) -> Any:
    return _PlainDataUnpickler(io.BytesIO(data or pickle.dumps(None))).load()


class _CaseSink:
    """Keeps only each rank's latest case mark (to say where a hang happened); drops other output."""

    def __init__(self) -> None:
        self.case: dict[int, str] = {}

    def output(self, rank: int, stream: str, text: str) -> None:
        for line in text.split("\n"):
            if line.startswith(CASE_MARK):
                self.case[rank] = line[len(CASE_MARK):]

    def display(self, rank: int, data: dict[str, object], metadata: dict[str, object],
                display_id: str | None = None, update: bool = False) -> None:
        pass


def run_batch(exercise: Exercise, submission: Submission, part: Part, batch: Batch,
              timeout: float) -> str | None:
    """Run one batch on fresh ranks; None when every case is right, else feedback text."""
    return _run_batch(exercise, submission, part, batch, timeout)[0]


def try_batch(exercise: Exercise, fn: Any, batch: Batch, checks: Iterable[Check] = (),
              timeout: float = DEFAULT_PART_TIMEOUT, function: str | None = None) -> None:
    """A learner's own check, from their kernel: run ``fn`` on one batch of fresh ranks and raise
    AssertionError with the feedback when it is wrong. The grade is decided by the grader."""
    part = Part("try", "one case", (batch,), frozenset(checks))
    message = run_batch(exercise, Submission(function or exercise.function, fn=fn), part, batch, timeout)
    if message:
        raise AssertionError(message)


def reference_namespace(exercise: Exercise, source: str) -> dict[str, Any]:
    """The instructor's answer cell, executed here (trusted code) after the exercise's setup."""
    namespace: dict[str, Any] = {"__name__": "__reference__"}
    exec(compile(exercise.setup_source, "<setup cell>", "exec"), namespace)
    exec(compile(source, "<reference>", "exec"), namespace)
    return namespace


def _run_batch(exercise: Exercise, submission: Submission, part: Part, batch: Batch,
               timeout: float, reference: dict[str, Any] | None = None) -> tuple[str | None, bool]:
    """(feedback or None, False when the answer cell itself failed, so every part would)."""
    sink = _CaseSink()
    pool = Pool(batch.world_size, "gloo", sink=sink, unreadable=submission.protected, memory_limit=RANK_MEMORY,
                confine_writes=True)
    try:
        deadline = time.monotonic() + timeout  # the pushes and the call share the batch's time

        def left() -> float:
            return max(deadline - time.monotonic(), 0.1)

        if exercise.rank_inputs is not None:  # each rank is sent its own data alone
            for rank in range(batch.world_size):
                pool.push(INPUTS, exercise.rank_inputs(batch, rank), ranks=[rank], timeout=left())
        dones = pool.call(exercise.rank_main, (submission, batch.cases), timeout=left())
    except RankTimeout as exc:
        if exc.failures:
            return _failures_text(exc.failures, sink, batch), _got_past_loading(exc.failures)
        # every rank stuck while executing the answer cell (a loop at top level)?
        stuck_loading = bool(exc.stacks) and all("in load_function" in s for s in exc.stacks.values())
        return _hang_text(exc, sink, submission, timeout), not stuck_loading
    except RankError as exc:
        return _failures_text(exc.failures, sink, batch), _got_past_loading(exc.failures)
    except PoolDied as exc:
        return f"world_size={batch.world_size}: the ranks could not run ({exc})", True
    finally:
        pool.stop()
    try:
        records = [plain_loads(dones[r].value) for r in sorted(dones)]
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        return f"world_size={batch.world_size}: a rank sent back something other than data ({exc})", True
    forbidden = _forbidden(exercise, batch, records)
    if forbidden:  # judged first: the judge (for ex7, the reference) need not run
        return forbidden, True
    if exercise.needs_reference:
        return exercise.judge(part, batch, records, reference=reference), True  # type: ignore[call-arg]
    return exercise.judge(part, batch, records), True


def _forbidden(exercise: Exercise, batch: Batch, records: list[Any]) -> str | None:
    """Feedback for the first case in which a rank used communication the exercise does not allow."""
    if exercise.communication is None:
        return None
    for index, case in enumerate(batch.cases):
        for rank in range(batch.world_size):
            record = compare.record(records, rank, index)
            problem = exercise.communication(record) if record is not None else None
            if problem:
                describe = getattr(case, "describe", None)
                where = describe(batch.world_size) if describe else f"world_size={batch.world_size}"
                return f"{where}: rank {rank} {problem}"
    return None


def _got_past_loading(failures: list[RankFailure]) -> bool:
    return not failures or any(f.kind is not FailureKind.NOT_LOADED for f in failures)


def grade_part(exercise: Exercise, submission: Submission, part: Part,
               budget: float = DEFAULT_PART_TIMEOUT) -> PartResult:
    """All batches of one part share one time budget; the first failing case decides."""
    return _grade_part(exercise, submission, part, budget)[0]


def _grade_part(exercise: Exercise, submission: Submission, part: Part,
                budget: float, reference: dict[str, Any] | None = None) -> tuple[PartResult, bool]:
    started = time.monotonic()
    deadline = started + budget
    cases = sum(len(b.cases) for b in part.batches)
    for batch in part.batches:
        left = deadline - time.monotonic()
        if left <= 0:
            return PartResult(part.name, False, f"not run: the part's {budget:.3g} s budget was used up",
                              time.monotonic() - started, cases), True
        message, reached = _run_batch(exercise, submission, part, batch, left, reference)
        if message:
            return PartResult(part.name, False, _cut(message), time.monotonic() - started, cases), reached
    return PartResult(part.name, True, "", time.monotonic() - started, cases), True


@dataclass(frozen=True)
class Budgets:
    """How long each part of one submission may run.

    A part may take what the reference took on this machine, times ``SLACK`` (at least
    ``MIN_EXPECTED``), plus whatever is left of one ``grace`` shared by the whole submission. A
    submission that hangs everywhere therefore costs about one grace plus a few times the honest
    grading time, not one long timeout per part, and each part still gets its own verdict. A
    slow but honest answer spends a little of the grace on each part and still passes.
    """

    expected: dict[str, float]
    grace: float
    cap: float = DEFAULT_PART_TIMEOUT  # no part ever runs longer than this

    SLACK: ClassVar[float] = 3.0
    MIN_EXPECTED: ClassVar[float] = 2.0  # a fresh set of ranks and a few cases, even on a loaded machine
    GRACE_FACTOR: ClassVar[float] = 10.0
    MIN_GRACE: ClassVar[float] = 4.0

    @classmethod
    def uniform(cls, part_timeout: float) -> Budgets:
        """No reference to go by: every part gets ``part_timeout`` (the in-kernel checks)."""
        return cls({}, 0.0, part_timeout)

    @classmethod
    def from_reference(cls, reference: SubmissionResult, cap: float) -> Budgets:
        times = {p.part: p.seconds for p in reference.parts}
        expected = {name: max(cls.MIN_EXPECTED, cls.SLACK * t) for name, t in times.items()}
        grace = max(cls.MIN_GRACE, cls.GRACE_FACTOR * max(times.values(), default=0.0))
        return cls(expected, min(grace, cap), cap)

    def for_part(self, name: str, grace_left: float) -> float:
        if name not in self.expected:
            return self.cap
        return min(self.cap, self.expected[name] + grace_left)

    def describe(self) -> str:
        if not self.expected:
            return f"{self.cap:g} s per part"
        low, high = min(self.expected.values()), max(self.expected.values())
        return f"{low:.1f}-{high:.1f} s per part plus {self.grace:.1f} s of grace per submission"


def calibrate(exercise: Exercise, reference_source: str, cap: float = DEFAULT_PART_TIMEOUT) -> Budgets:
    """Grade the instructor's reference answer (on this machine, under this load) to set budgets.

    Raises ReferenceFailed when the reference itself fails a part: then no grade would be fair.
    """
    reference = grade_submission(exercise, reference_source, Budgets.uniform(cap),
                                 reference_source=reference_source)
    for part in reference.parts:
        if not part.passed:
            raise ReferenceFailed.on_part(exercise.assignment, part.part, part.message)
    return Budgets.from_reference(reference, cap)


_warmed: Hub | None = None  # the hub whose launcher forked a grading rank for warm_up in this process


def warm_up() -> None:
    """Start distlab's launcher (one torch import, then the grading modules: a confined rank, like
    every graded one) before any part's clock starts ticking. Once per launcher: a worker grades
    every submission of its share on the same one (70 ms a submission when asked each time)."""
    global _warmed
    hub = Hub.get()  # a new one if the launcher died
    if hub is _warmed:
        return
    pool = Pool(1, "gloo", sink=_CaseSink(), confine_writes=True, hub=hub)
    try:
        pool.call(_nothing, timeout=60.0)
    finally:
        pool.stop()
    _warmed = hub


def _nothing() -> None:
    return None


def grade_submission(exercise: Exercise, source: str, budgets: Budgets | float = DEFAULT_PART_TIMEOUT,
                     parts: Iterable[str] | None = None, protected: Sequence[str] = (),
                     reference_source: str = "") -> SubmissionResult:
    """Grade the source of the student's answer cells, part by part, each batch on fresh ranks.

    ``protected``: directories the submission may not read (the instructor's; see ``sandbox``).
    ``reference_source``: the instructor's answer cell, for exercises judged against it.
    """
    if exercise.needs_reference and not reference_source:
        raise ReferenceFailed(f"{exercise.assignment} is judged against the instructor's reference "
                              f"answer; grade it with the grader (python -m grader), which has it")
    reference = reference_namespace(exercise, reference_source) if exercise.needs_reference else None
    warm_up()
    if not isinstance(budgets, Budgets):
        budgets = Budgets.uniform(float(budgets))
    started = time.monotonic()
    submission = Submission(exercise.function, exercise.setup_source, source, protected=tuple(protected))
    chosen = [exercise.part(p) for p in parts] if parts is not None else list(exercise.parts)
    result = SubmissionResult(exercise.assignment, source_digest(source))
    broken: str | None = None
    grace = budgets.grace
    for part in chosen:
        if broken is not None:
            # the submission failed before any case could run: it would again, in every part
            result.parts.append(PartResult(part.name, False, broken, 0.0, 0))
            continue
        outcome, reached = _grade_part(exercise, submission, part, budgets.for_part(part.name, grace), reference)
        if part.name in budgets.expected:
            grace = max(0.0, grace - max(0.0, outcome.seconds - budgets.expected[part.name]))
        result.parts.append(outcome)
        if not reached:
            broken = outcome.message
    result.seconds = time.monotonic() - started
    return result


# --- feedback text ------------------------------------------------------------------------------
def _cut(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _failures_text(failures: list[RankFailure], sink: _CaseSink, batch: Batch) -> str:
    """One line per distinct failure, naming the ranks and, when known, the case."""
    texts: dict[str, list[int]] = {}
    for failure in failures:
        if failure.kind in (FailureKind.FEEDBACK, FailureKind.NOT_LOADED):
            text = failure.message  # already says which case
        else:
            where = sink.case.get(failure.rank) or f"world_size={batch.world_size}"
            what = f"{failure.exc_type}: {failure.message}" if failure.message else failure.exc_type
            text = f"{where}: {what}"
        texts.setdefault(_cut(text, 400), []).append(failure.rank)
    lines = []
    for text, ranks in list(texts.items())[:3]:
        label = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        lines.append(f"{label}: {text}")
    if len(texts) > 3:
        lines.append(f"(and {len(texts) - 3} more)")
    if any(word in text for text in texts for word in ("MemoryError", "Cannot allocate memory")):
        lines.insert(0, f"out of memory: a grading rank may hold at most {RANK_MEMORY / 2**30:g} GB of data")
    return "\n".join(lines)


_FRAME = re.compile(r'File "' + re.escape(SUBMISSION_FILE) + r'", line (\d+)')


def _hang_text(exc: RankTimeout, sink: _CaseSink, submission: Submission, timeout: float) -> str:
    cases = sorted(set(sink.case.values()))
    lines = [f"did not finish within the {timeout:.0f} s left for this part "
             f"(a rank is probably waiting in a collective the others never joined)"]
    if cases:
        lines.append("running: " + "; ".join(cases))
    source_lines = (submission.source or "").splitlines()
    for rank, stack in sorted(exc.stacks.items()):
        numbers = _FRAME.findall(stack)
        if numbers:
            # faulthandler lists the innermost frame first
            number = int(numbers[0])
            code = source_lines[number - 1].strip() if 0 < number <= len(source_lines) else ""
            lines.append(f"rank {rank} was stuck at line {number} of your solution cell: {code}")
    return "\n".join(lines)
