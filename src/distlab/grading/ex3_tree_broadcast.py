"""Exercise 3: broadcast along a binomial tree, from send and recv.

The student writes ``tree_broadcast(tensor, src=0)``: afterwards every rank's ``tensor`` holds
rank ``src``'s data, in place, like ``dist.broadcast``. Only send/recv (isend/irecv allowed).
Any source rank and any world size, powers of two or not; every rank that has the data passes
it on, so the whole broadcast takes ceil(log2 n) rounds instead of n - 1.

The rounds are measured from the messages themselves: the grader joins every rank's sends and
receives into the tree they form and computes when each rank got the data (a rank's k-th send
arrives k rounds after it had the data itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from distlab.grading import compare
from distlab.grading.cases import DTYPES, generator
from distlab.grading.spec import Batch, Check, Exercise, Part, Submission, per_case, setup_cell

SETUP_SOURCE = setup_cell(__name__)

FUNCTION = "tree_broadcast"


@dataclass(frozen=True)
class Case:
    shape: tuple[int, ...]
    src: int = 0
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def describe(self, world_size: int) -> str:
        return f"world_size={world_size}, src={self.src}, shape={self.shape}, {self.dtype}"


def make_input(case: Case, world_size: int, rank: int) -> torch.Tensor:
    """What rank ``rank`` holds before the broadcast (only the source's data matters), made in the
    grading process: no other rank can make the source's data itself."""
    gen = generator(case, world_size, rank)
    if case.dtype == "int64":
        return torch.randint(-100, 100, case.shape, generator=gen, dtype=torch.int64)
    return (torch.randint(-80, 80, case.shape, generator=gen) / 8).to(DTYPES[case.dtype])


# --- rank side ----------------------------------------------------------------------------------
def rank_main(submission: Submission, cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    """On every rank: run each case through the student's function, return plain records."""
    from distlab.grading import harness

    return harness.run_in_place_cases(
        submission, cases,
        lambda case: {"src": case.src} if case.src else {})  # src=0 goes through the default


# --- trusted side -------------------------------------------------------------------------------
def _messages(record: dict[str, Any]) -> tuple[list[int], list[int]] | str:
    """(peers sent to, peers received from), in call order, or what is wrong with the record."""
    found = compare.p2p_messages(record)
    if isinstance(found, str):
        return found
    sends, recvs = found
    return [int(e.get("peer", -1)) for e in sends], [int(e.get("peer", -1)) for e in recvs]


def rounds_problem(records: list[Any], index: int, case: Case, world_size: int) -> str | None:
    """None when the messages form a tree rooted at src that finishes in ceil(log2 n) rounds."""
    sends: dict[int, list[int]] = {}
    parent: dict[int, int] = {}
    for rank in range(world_size):
        found = _messages(compare.record(records, rank, index) or {})
        if isinstance(found, str):
            return f"rank {rank} {found}"
        sends[rank], recvs = found
        if rank == case.src and recvs:
            return f"rank {rank} (the source) received a message; the source only sends"
        if rank != case.src and len(recvs) != 1:
            return f"rank {rank} received {len(recvs)} messages; in a tree each rank receives exactly once"
        if recvs:
            parent[rank] = recvs[0]
    for rank, peers in sends.items():
        for peer in peers:
            if parent.get(peer) != rank:
                return f"rank {rank} sent to rank {peer}, which did not receive from it"
    # when each rank has the data: its k-th send (k = 1, 2, ...) lands k rounds after it had it
    when = {case.src: 0}
    frontier = [case.src]
    while frontier:
        rank = frontier.pop()
        for k, child in enumerate(sends[rank], start=1):
            if child not in when:
                when[child] = when[rank] + k
                frontier.append(child)
    missing = sorted(set(range(world_size)) - set(when))
    if missing:
        return f"rank {missing[0]} never got the data from the source's tree"
    rounds, best = max(when.values()), math.ceil(math.log2(world_size))
    if rounds > best:
        last = max(when, key=lambda r: when[r])
        return (f"took {rounds} rounds (rank {last} got the data last); a binomial tree needs "
                f"ceil(log2 {world_size}) = {best}: every rank that has the data sends it on")
    return None


def judge(part: Part, batch: Batch, records: list[Any]) -> str | None:
    """None when every rank holds the source's tensor (and, for rounds, the tree is binomial)."""
    ws = batch.world_size
    for index, case in enumerate(batch.cases):
        text = case.describe(ws)
        want = make_input(case, ws, case.src)
        for rank in range(ws):
            record = compare.record(records, rank, index)
            if record is None:
                return f"{text}: rank {rank} sent back no result"
            problem = compare.tensor_problem(record.get("tensor"), want, exact=True,
                                             original=None if rank == case.src else make_input(case, ws, rank))
            if problem:
                return f"{text}: rank {rank} {problem}"
        if Check.ROUNDS in part.checks:
            problem = rounds_problem(records, index, case, ws)
            if problem:
                return f"{text}: {problem}"
    return None


PARTS = (
    Part("from_zero", "from rank 0 on a power-of-two world", (
        Batch.of(4, Case((5,)), Case((2, 3)), Case(())),
    )),
    Part("any_source", "from any rank", (
        Batch.of(4, Case((5,), src=3), Case((4,), src=1, dtype="int64"), Case((3,), src=2)),
    )),
    Part("any_world_size", "world sizes that are not powers of two", (
        Batch.of(3, Case((6,)), Case((6,), src=1), Case((2, 2), src=2, dtype="float64")),
    )),
    Part("rounds", "a binomial tree: ceil(log2 n) rounds, one receive per rank", (
        Batch.of(4, Case((8,), src=1), Case((8,), src=0)),
        Batch.of(3, Case((5,), src=2)),
    ), frozenset({Check.ROUNDS})),
)

EXERCISE = Exercise(
    key="ex3",
    assignment="ex3_tree_broadcast",
    function=FUNCTION,
    setup_source=SETUP_SOURCE,
    parts=PARTS,
    rank_main=rank_main,
    judge=judge,
    rank_inputs=per_case(make_input),
    communication=compare.only_point_to_point,
)


def try_case(fn: Any, world_size: int = 4, shape: tuple[int, ...] = (5,), src: int = 0,
             dtype: str = "float32", check_rounds: bool = False, timeout: float = 30.0) -> None:
    """Run ``fn`` on fresh ranks for one case; raise AssertionError with what went wrong.

    ``check_rounds=True`` also checks the messages form a binomial tree. For the learner's own
    kernel; the grade is decided by the grader.
    """
    from distlab.grading import runner

    if dtype not in DTYPES or not 0 <= src < world_size:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} and 0 <= src < world_size")
    batch = Batch(world_size, (Case(tuple(shape), src, dtype),))
    runner.try_batch(EXERCISE, fn, batch, [Check.ROUNDS] if check_rounds else [], timeout)
