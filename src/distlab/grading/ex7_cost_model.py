"""Exercise 7: what communication and memory cost at scale, as functions.

The student writes four functions in one answer cell (id ``cost_functions``):
``ring_time``, ``hierarchical_time``, ``memory_per_gpu`` and ``bytes_per_step`` (notebook 12
derives them). They are plain arithmetic, so the expected values *are* the answer: this module
holds only the cases. The grader computes what each case should give by running the
instructor's reference answer (solutions/ex7_cost_model/) in its own process at grading time
(``Exercise.needs_reference``); nothing a student installs contains it. The notebook's visible
checks pass their expected values explicitly (published figures and notebook 12's numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from distlab.grading import compare
from distlab.grading.spec import Batch, Exercise, Part, Submission, setup_cell

SETUP_SOURCE = setup_cell(__name__, 'import math')

FUNCTION = "memory_per_gpu"
ANSWER_CELL = "cost_functions"
FUNCTIONS = ("ring_time", "hierarchical_time", "memory_per_gpu", "bytes_per_step")
REL_TOL = 1e-6


@dataclass(frozen=True)
class Case:
    """One call: ``function(*args, **kwargs)``; ``expected`` only for checks without the reference."""

    function: str
    args: tuple[float, ...]
    kwargs: tuple[tuple[str, float], ...] = ()
    expected: float | None = field(default=None, compare=False)

    def describe(self, world_size: int = 1) -> str:
        shown = [f"{a:g}" for a in self.args] + [f"{k}={v:g}" for k, v in self.kwargs]
        return f"{self.function}({', '.join(shown)})"


# --- rank side ----------------------------------------------------------------------------------
def rank_main(submission: Submission, cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    """On the one grading rank: call each case's function and return plain numbers."""
    from distlab.grading import guard, harness

    watcher = guard.install()  # before the student's source runs
    namespace = harness.load_namespace(submission, watcher)
    records: list[dict[str, Any]] = []
    for case in cases:
        fn = namespace.get(case.function)
        if not callable(fn):
            records.append({"missing": case.function})
            continue
        with watcher.watch() as log:
            value = harness.call(fn, case.describe(), *case.args, **dict(case.kwargs))
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        records.append({"value": number, "type": type(value).__name__, **log})
    return records


# --- trusted side -------------------------------------------------------------------------------
def no_communication(record: dict[str, Any]) -> str | None:
    entries = compare.log_entries(record)
    if isinstance(entries, str):
        return entries
    return f"communicated ({compare.readable(entries[0])}); these are formulas" if entries else None


def judge(part: Part, batch: Batch, records: list[Any], reference: dict[str, Any] | None = None) -> str | None:
    for index, case in enumerate(batch.cases):
        record = compare.record(records, 0, index)
        if record is None:
            return f"{case.describe()}: sent back no result"
        if "missing" in record:
            return f"{case.function} is not defined by your solution cell"
        got = record.get("value")
        if got is None:
            return f"{case.describe()}: returned a {record.get('type')}, not a number"
        if reference is not None:
            expected = float(reference[case.function](*case.args, **dict(case.kwargs)))
        elif case.expected is not None:
            expected = case.expected
        else:
            return f"{case.describe()}: no expected value to compare with"
        if not math.isclose(got, expected, rel_tol=REL_TOL, abs_tol=1e-12):
            return f"{case.describe()}: expected {expected:.6g}, got {got:.6g}"
    return None


NVLINK, IB, HDR = 450e9, 50e9, 25e9

PARTS = (
    Part("ring", "all_reduce on a ring under the alpha-beta model", (
        Batch.of(1, Case("ring_time", (20e9, 8, 5e-6, NVLINK)), Case("ring_time", (4, 64, 5e-6, 10e9)),
                 Case("ring_time", (1e9, 1, 5e-6, IB)), Case("ring_time", (3e6, 3, 2e-5, HDR))),
    )),
    Part("hierarchical", "reduce_scatter in the node, all_reduce across nodes, all_gather in the node", (
        Batch.of(1, Case("hierarchical_time", (20e9, 8, 8, 5e-6, NVLINK, 15e-6, IB)),
                 Case("hierarchical_time", (20e9, 64, 8, 5e-6, NVLINK, 15e-6, IB)),
                 Case("hierarchical_time", (1e9, 1, 8, 5e-6, NVLINK, 15e-6, IB)),
                 Case("hierarchical_time", (1e9, 4, 1, 5e-6, NVLINK, 15e-6, IB)),
                 Case("hierarchical_time", (7e6, 3, 4, 2e-6, 300e9, 1e-5, HDR))),
    )),
    Part("memory", "model states per GPU for data parallel and ZeRO-1, 2, 3", (
        Batch.of(1, *[Case("memory_per_gpu", (7.5e9, 64, s)) for s in range(4)],
                 *[Case("memory_per_gpu", (10e9, 48, s)) for s in range(4)],
                 Case("memory_per_gpu", (1e9, 8, 2), (("param_bytes", 4), ("grad_bytes", 4),
                                                      ("optimizer_bytes", 8))),
                 Case("memory_per_gpu", (3e9, 1, 3))),
    )),
    Part("volume", "bytes each GPU sends per step", (
        Batch.of(1, *[Case("bytes_per_step", (10e9, 64, s)) for s in range(4)],
                 Case("bytes_per_step", (1e9, 1, 3)), Case("bytes_per_step", (7.5e9, 6, 1), (("param_bytes", 4),))),
    )),
)

EXERCISE = Exercise(
    key="ex7",
    assignment="ex7_cost_model",
    function=FUNCTION,
    solution_ids=(ANSWER_CELL,),
    setup_source=SETUP_SOURCE,
    parts=PARTS,
    rank_main=rank_main,
    judge=judge,
    communication=no_communication,
    needs_reference=True,
)


def try_case(fn: Any, args: tuple[float, ...], expected: float, rel_tol: float = 1e-3,
             timeout: float = 30.0, **kwargs: float) -> None:
    """Call ``fn(*args, **kwargs)`` in a fresh process; raise AssertionError unless it gives ``expected``
    (to ``rel_tol``: published figures are rounded). The grade is decided by the grader."""
    from distlab.grading import runner

    def relaxed(part: Part, batch: Batch, records: list[Any]) -> str | None:
        problem = judge(part, batch, records)
        record = compare.record(records, 0, 0) or {}
        got = record.get("value")
        if problem and isinstance(got, float) and math.isclose(got, expected, rel_tol=rel_tol):
            return None  # within the published figure's rounding
        return problem

    case = Case(fn.__name__, tuple(args), tuple(sorted(kwargs.items())), expected)
    batch = Batch(1, (case,))
    checking = replace(EXERCISE, judge=relaxed, needs_reference=False)
    runner.try_batch(checking, fn, batch, timeout=timeout, function=fn.__name__)
