"""Exercise 4: all_to_all from point-to-point messages.

The student writes ``all_to_all_p2p(output_list, input_list)``, like ``dist.all_to_all``: rank r
sends ``input_list[j]`` to rank j and receives rank j's chunk for r into ``output_list[j]``. Chunks
may differ in size from pair to pair. Only send/recv (isend/irecv, batch_isend_irecv): one
message to each other rank, nothing to itself. With ``output_list=None`` the sizes are unknown
and the function learns them with a counts exchange first, then returns the list it received.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from distlab.grading import compare, harness
from distlab.grading.cases import DTYPES, generator
from distlab.grading.spec import Batch, Check, Exercise, Part, Submission, setup_cell

SETUP_SOURCE = setup_cell(__name__)

FUNCTION = "all_to_all_p2p"


@dataclass(frozen=True)
class Case:
    """``sizes[i][j]``: rows rank i sends to rank j; each row has shape ``row``."""

    sizes: tuple[tuple[int, ...], ...]
    row: tuple[int, ...] = ()
    dtype: str = "float32"
    counts: bool = False  # called with output_list=None: the sizes must be exchanged first

    def describe(self, world_size: int) -> str:
        text = f"world_size={world_size}, sizes={[list(r) for r in self.sizes]}"
        text += (f", rows of shape {self.row}" if self.row else "") + f", {self.dtype}"
        return text + (", output_list=None (exchange the counts first)" if self.counts else "")

    def chunk(self, src: int, dst: int) -> torch.Tensor:
        """What rank ``src`` sends to rank ``dst``, made in the grading process (the judge makes it
        again): only rank ``src`` is sent it, so rank ``dst`` gets it by a message or not at all."""
        gen = generator(self, src, dst)
        shape = (self.sizes[src][dst], *self.row)
        if self.dtype == "int64":
            return torch.randint(-100, 100, shape, generator=gen, dtype=torch.int64)
        return (torch.randint(-80, 80, shape, generator=gen) / 8).to(DTYPES[self.dtype])

    def numel(self, src: int, dst: int) -> int:
        return self.sizes[src][dst] * math.prod(self.row)


# --- rank side ----------------------------------------------------------------------------------
def rank_main(submission: Submission, cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    """On every rank: run each case through the student's function, return plain records."""
    return harness.run_cases(submission, cases, _one_case)


def _one_case(ctx: harness.RankContext, case: Case, inputs: list[torch.Tensor]) -> dict[str, Any]:
    rank, world_size = ctx.rank, ctx.world_size
    # outputs start as noise, so a chunk that never arrives shows
    outputs = [torch.full((case.sizes[src][rank], *case.row), -7, dtype=DTYPES[case.dtype])
               for src in range(world_size)]
    with ctx.watcher.watch() as log:
        returned = harness.call(ctx.fn, case.describe(world_size), None if case.counts else outputs, inputs)
    if case.counts:
        if type(returned) not in (list, tuple):
            return {"outputs": None, "returned": type(returned).__name__, **log}
        outputs = list(returned)
    return {"outputs": [harness.tensor_record(t) for t in outputs], **log}


# --- trusted side -------------------------------------------------------------------------------
def _rank_inputs(batch: Batch, rank: int) -> list[list[torch.Tensor]]:
    """What rank ``rank`` sends, for each case: its chunk for every rank, its own included."""
    return [[case.chunk(rank, dst) for dst in range(batch.world_size)] for case in batch.cases]


def messages_problem(record: dict[str, Any], case: Case, world_size: int, rank: int) -> str | None:
    """One message to and one from every other rank, each exactly the chunk, nothing else."""
    messages = compare.p2p_messages(record)
    if isinstance(messages, str):
        return messages
    sends, recvs = messages
    others = sorted(set(range(world_size)) - {rank})
    for kind, found in (("sent", sends), ("received", recvs)):
        peers = sorted(int(e.get("peer", -1)) for e in found)
        if rank in peers:
            return f"{kind} a message to itself; its own chunk is a local copy"
        if peers != others:
            return f"{kind} messages to/from ranks {peers}; expected exactly one per other rank {others}"
    for entry in sends:
        peer = int(entry.get("peer", -1))
        if int(entry.get("out") or 0) != case.numel(rank, peer):
            return (f"sent {entry.get('out')} elements to rank {peer}; its chunk has "
                    f"{case.numel(rank, peer)}: send each chunk as it is, once")
    return None


def judge(part: Part, batch: Batch, records: list[Any]) -> str | None:
    ws = batch.world_size
    for index, case in enumerate(batch.cases):
        text = case.describe(ws)
        for rank in range(ws):
            record = compare.record(records, rank, index)
            outputs = record.get("outputs") if record else None
            if case.counts and record is not None and not isinstance(outputs, list):
                return (f"{text}: rank {rank} returned {record.get('returned')}; with output_list=None, "
                        f"return the list of the {ws} chunks received")
            if not isinstance(outputs, list) or len(outputs) != ws:
                return f"{text}: rank {rank} sent back no result"
            for src in range(ws):
                problem = compare.tensor_problem(outputs[src], case.chunk(src, rank), exact=True)
                if problem:
                    return f"{text}: rank {rank}, output_list[{src}] (from rank {src}) {problem}"
            if Check.MESSAGES in part.checks:
                problem = messages_problem(record or {}, case, ws, rank)
                if problem:
                    return f"{text}: rank {rank} {problem}"
    return None


def _equal(world_size: int, rows: int) -> tuple[tuple[int, ...], ...]:
    return tuple((rows,) * world_size for _ in range(world_size))


UNEVEN_3 = ((1, 2, 0), (3, 1, 2), (0, 4, 1))
UNEVEN_4 = ((2, 0, 1, 3), (1, 1, 4, 0), (0, 2, 2, 1), (5, 1, 0, 2))

PARTS = (
    Part("equal_chunks", "every chunk the same size", (
        Batch.of(4, Case(_equal(4, 2)), Case(_equal(4, 1), row=(3,))),
        Batch.of(2, Case(_equal(2, 3))),
    )),
    Part("uneven_chunks", "chunks of different sizes, some empty, any row shape and dtype", (
        Batch.of(3, Case(UNEVEN_3), Case(UNEVEN_3, row=(2, 2), dtype="int64")),
        Batch.of(4, Case(UNEVEN_4, dtype="float64")),
    )),
    Part("messages", "one message to and from every other rank, each exactly its chunk", (
        Batch.of(4, Case(_equal(4, 2)), Case(((1, 2, 3, 4), (2, 3, 4, 1), (3, 4, 1, 2), (4, 1, 2, 3)))),
        Batch.of(3, Case(((2, 1, 3), (1, 2, 2), (3, 3, 1)), row=(2,))),
    ), frozenset({Check.MESSAGES})),
    Part("counts", "output_list=None: learn the sizes with a counts exchange, then receive", (
        Batch.of(3, Case(UNEVEN_3, counts=True), Case(UNEVEN_3, row=(2,), dtype="int64", counts=True)),
        Batch.of(4, Case(UNEVEN_4, dtype="float64", counts=True)),
    )),
)

EXERCISE = Exercise(
    key="ex4",
    assignment="ex4_all_to_all",
    function=FUNCTION,
    setup_source=SETUP_SOURCE,
    parts=PARTS,
    rank_main=rank_main,
    judge=judge,
    communication=compare.only_point_to_point,
    rank_inputs=_rank_inputs,
)


def try_case(fn: Any, sizes: Any = ((1, 2), (3, 1)), row: tuple[int, ...] = (), dtype: str = "float32",
             check_messages: bool = False, counts: bool = False, timeout: float = 30.0) -> None:
    """Run ``fn`` on ``len(sizes)`` fresh ranks; raise AssertionError with what went wrong.

    ``sizes[i][j]`` is how many rows rank i sends to rank j. ``check_messages=True`` also checks
    one message per pair, each exactly its chunk; ``counts=True`` calls ``fn(None, input_list)``,
    which must learn the sizes itself. The grade is decided by the grader.
    """
    from distlab.grading import runner

    sizes = tuple(tuple(int(n) for n in r) for r in sizes)
    if dtype not in DTYPES or any(len(r) != len(sizes) for r in sizes):
        raise ValueError(f"sizes must be square and dtype one of {sorted(DTYPES)}")
    batch = Batch(len(sizes), (Case(sizes, tuple(row), dtype, counts),))
    runner.try_batch(EXERCISE, fn, batch, [Check.MESSAGES] if check_messages else [], timeout)
