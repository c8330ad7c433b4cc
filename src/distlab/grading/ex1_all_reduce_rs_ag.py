"""Exercise 1: all_reduce built from reduce_scatter and all_gather.

The student writes ``all_reduce_rs_ag(tensor, op=dist.ReduceOp.SUM, group=None)``, in place like
``dist.all_reduce``. This module holds the graded parts, the rank-side driver and the trusted
judge; the reference result is computed here from every rank's input, never on the ranks.

``try_case`` is the helper the notebook's visible tests use in the learner's own kernel.
"""

from __future__ import annotations

from typing import Any

from distlab.grading import compare
from distlab.grading.cases import DTYPES, OPS, Case, expected, make_input
from distlab.grading.spec import SINGLE_TENSOR_NAMES, Batch, Exercise, Part, Submission, per_case, setup_cell

SETUP_SOURCE = setup_cell(__name__, extra=SINGLE_TENSOR_NAMES)

FUNCTION = "all_reduce_rs_ag"


# --- rank side ----------------------------------------------------------------------------------
def rank_main(submission: Submission, cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    """On every rank: run each case through the student's function, return plain records."""
    from distlab.grading import harness

    return harness.run_in_place_cases(submission, cases, _case_kwargs)


def _case_kwargs(case: Case) -> dict[str, Any]:
    """The op and this rank's subgroup; every rank creates every group of the partition, in order."""
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = None
    for ranks in case.groups:
        group = dist.new_group(list(ranks))
        if rank in ranks:
            mine = group
    kwargs: dict[str, Any] = {}
    if case.op != "SUM":  # SUM goes through the default argument
        kwargs["op"] = getattr(dist.ReduceOp, case.op)
    if mine is not None:
        kwargs["group"] = mine
    return kwargs


# --- trusted side -------------------------------------------------------------------------------
def judge(part: Part, batch: Batch, records: list[Any]) -> str | None:
    """None when every rank's tensor matches the reference and came from the algorithm.

    Every case, not only the communication part's, holds each rank to about one chunk per rank
    through each collective (twice the padded tensor, for slack): the right numbers from whole
    copies (all_gather every tensor and reduce locally, or reduce_scatter one copy per rank) are
    the all_reduce the exercise forbids, done the expensive way. The communication part also
    requires both calls.
    """
    ws = batch.world_size

    def check(case: Case, rank: int, record: dict[str, Any]) -> str | None:
        problem = compare.tensor_problem(record.get("tensor"), expected(case, ws, rank),
                                         exact=case.op in ("MAX", "MIN") or case.dtype == "int64",
                                         original=make_input(case, ws, rank))
        if problem is None:
            size = len(case.members(ws, rank))  # the ranks it reduces with: its subgroup's, or all
            problem = compare.comm_problem(record, allowed=("reduce_scatter", "all_gather"),
                                           required=("reduce_scatter", "all_gather") if case.check_comm else (),
                                           limit_elements=2 * size * -(-case.numel // size))
        return problem

    return compare.first_problem(batch, records, check)


def only_rs_ag(record: dict[str, Any]) -> str | None:
    """Every part: no communication but reduce_scatter and all_gather (all_reduce is what is built)."""
    return compare.comm_problem(record, allowed=("reduce_scatter", "all_gather"), required=())


# one batch = one set of fresh ranks; world size 2 is covered by the notebook's visible tests
PARTS = (
    Part("divisible", "sizes divisible by the world size", (
        Batch.of(4, Case((8,)), Case((12,)), Case((4,))),
    )),
    Part("indivisible", "sizes not divisible by the world size, fewer elements than ranks", (
        Batch.of(3, Case((7,)), Case((2,)), Case((1,)), Case((10,))),
        Batch.of(4, Case((5,)), Case((3,)), Case((9,))),
    )),
    Part("shapes", "any shape", (
        Batch.of(3, Case((2, 5)), Case((3, 1, 4)), Case(()), Case((4, 3))),
    )),
    Part("dtypes", "float32, float64 and int64", (
        Batch.of(3, Case((7,), "float64"), Case((7,), "int64"), Case((6,), "float32")),
    )),
    Part("ops", "SUM, MAX, MIN and AVG", (
        Batch.of(3, Case((7,), op="MAX"), Case((5,), "int64", "MIN"), Case((8,), op="AVG"),
                 Case((4,), "int64", "MAX"), Case((6,), "float64", "SUM")),
    )),
    Part("subgroup", "a subgroup of the ranks", (
        Batch.of(4, Case((5,), groups=((0, 2), (1, 3))), Case((7,), op="MAX", groups=((0, 1, 3), (2,))),
                 Case((3,), groups=((0,), (1, 2, 3)))),
    )),
    Part("communication", "only reduce_scatter and all_gather, one chunk per rank", (
        Batch.of(4, Case((16,), check_comm=True), Case((7,), op="MAX", check_comm=True)),
    )),
)

EXERCISE = Exercise(
    key="ex1",
    assignment="ex1_all_reduce_rs_ag",
    function=FUNCTION,
    setup_source=SETUP_SOURCE,
    parts=PARTS,
    rank_main=rank_main,
    judge=judge,
    communication=only_rs_ag,
    rank_inputs=per_case(make_input),
)


def try_case(fn: Any, world_size: int = 2, shape: tuple[int, ...] = (4,), dtype: str = "float32",
             op: str = "SUM", groups: tuple[tuple[int, ...], ...] = (), check_comm: bool = False,
             timeout: float = 30.0) -> None:
    """Run ``fn`` on fresh ranks for one case and raise AssertionError with what went wrong.

    For the learner's own kernel (the notebook's visible tests); the grade itself is decided
    by the grader in processes your kernel does not touch.
    """
    from distlab.grading import runner

    if dtype not in DTYPES or op not in OPS:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} and op one of {OPS}")
    batch = Batch(world_size, (Case(tuple(shape), dtype, op, tuple(map(tuple, groups)), check_comm),))
    runner.try_batch(EXERCISE, fn, batch, timeout=timeout)
