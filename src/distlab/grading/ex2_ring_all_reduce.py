"""Exercise 2: ring all-reduce from point-to-point messages.

The student writes ``ring_all_reduce(tensor)``: SUM over all ranks, in place, using only
send/recv (isend/irecv and batch_isend_irecv allowed). A reduce-scatter phase then an
all-gather phase around the ring: 2(n-1) steps, in each of which every rank sends one chunk
(1/n of the tensor) to its right neighbour and receives one from its left. Graded on the results
and on the messages each rank sent: how many, to whom, and how big.
"""

from __future__ import annotations

from typing import Any

from distlab.grading import compare
from distlab.grading.cases import DTYPES, Case, expected, make_input
from distlab.grading.spec import Batch, Check, Exercise, Part, Submission, per_case, setup_cell

SETUP_SOURCE = setup_cell(__name__)

FUNCTION = "ring_all_reduce"


# --- rank side ----------------------------------------------------------------------------------
def rank_main(submission: Submission, cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    """On every rank: run each case through the student's function, return plain records."""
    from distlab.grading import harness

    return harness.run_in_place_cases(submission, cases)


# --- trusted side -------------------------------------------------------------------------------
def ring_problem(record: dict[str, Any], world_size: int, rank: int, numel: int, check: Check) -> str | None:
    """Check one rank's messages: their count and neighbours (STEPS) or their sizes (BYTES)."""
    found = compare.p2p_messages(record)
    if isinstance(found, str):
        return found
    sends, recvs = found
    steps = 2 * (world_size - 1)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    if check is Check.STEPS:
        if len(sends) != steps or len(recvs) != steps:
            return (f"sent {len(sends)} and received {len(recvs)} messages; a ring all-reduce on "
                    f"{world_size} ranks takes 2(n-1) = {steps} steps (n-1 to reduce-scatter, n-1 to "
                    f"all-gather), one send and one receive per step")
        wrong = sorted({int(e.get("peer", -1)) for e in sends if e.get("peer") != right})
        if wrong:
            return f"sent to rank {wrong[0]}; in the ring each rank sends only to its right neighbour {right}"
        wrong = sorted({int(e.get("peer", -1)) for e in recvs if e.get("peer") != left})
        if wrong:
            return f"received from rank {wrong[0]}; each rank receives only from its left neighbour {left}"
        return None
    chunk = -(-numel // world_size)
    biggest = max((int(e.get("out") or 0) for e in sends), default=0)
    if biggest > chunk:
        return (f"sent {biggest} elements in one message; a step carries one chunk, at most "
                f"ceil(numel / n) = {chunk} elements")
    total = sum(int(e.get("out") or 0) for e in sends)
    if total > steps * chunk:
        return f"sent {total} elements in all, more than 2(n-1) chunks = {steps * chunk}"
    return None


def judge(part: Part, batch: Batch, records: list[Any]) -> str | None:
    """None when every rank's tensor is the sum (and, for steps/bytes, the messages are a ring's)."""
    ws = batch.world_size
    def check(case: Case, rank: int, record: dict[str, Any]) -> str | None:
        problem = compare.tensor_problem(record.get("tensor"), expected(case, ws, rank),
                                         exact=case.dtype == "int64", original=make_input(case, ws, rank))
        for kind in (Check.STEPS, Check.BYTES):
            if problem is None and kind in part.checks:
                problem = ring_problem(record, ws, rank, case.numel, kind)
        return problem

    return compare.first_problem(batch, records, check)


PARTS = (
    Part("divisible", "sizes divisible by the world size", (
        Batch.of(3, Case((6,)), Case((9,))),
        Batch.of(4, Case((8,)), Case((16,))),
    )),
    Part("any_size", "any size, shape and dtype, fewer elements than ranks", (
        Batch.of(3, Case((7,)), Case((2,)), Case((1,)), Case((2, 5)), Case(()), Case((7,), "int64"),
                 Case((5,), "float64")),
        Batch.of(4, Case((5,)), Case((3,))),
    )),
    Part("steps", "2(n-1) steps, each a send to the right and a receive from the left", (
        Batch.of(4, Case((16,)), Case((7,))),
        Batch.of(3, Case((9,))),
    ), frozenset({Check.STEPS})),
    Part("bytes", "each step sends one chunk: 1/n of the tensor", (
        Batch.of(4, Case((16,)), Case((10,))),
        Batch.of(3, Case((9,))),
    ), frozenset({Check.BYTES})),
)

EXERCISE = Exercise(
    key="ex2",
    assignment="ex2_ring_all_reduce",
    function=FUNCTION,
    setup_source=SETUP_SOURCE,
    parts=PARTS,
    rank_main=rank_main,
    judge=judge,
    communication=compare.only_point_to_point,
    rank_inputs=per_case(make_input),
)


def try_case(fn: Any, world_size: int = 3, shape: tuple[int, ...] = (6,), dtype: str = "float32",
             check: str | None = None, timeout: float = 30.0) -> None:
    """Run ``fn`` on fresh ranks for one case; raise AssertionError with what went wrong.

    ``check="steps"`` also checks the number of messages and their neighbours, ``check="bytes"``
    their sizes. For the learner's own kernel; the grade is decided by the grader.
    """
    from distlab.grading import runner

    if dtype not in DTYPES or check not in (None, "steps", "bytes"):
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} and check None, 'steps' or 'bytes'")
    batch = Batch(world_size, (Case(tuple(shape), dtype),))
    runner.try_batch(EXERCISE, fn, batch, [Check(check)] if check else [], timeout)
