"""Exercise 6: a ZeRO-1 style sharded optimizer step.

The student writes ``zero1_step(params, state, lr, momentum)``, called on every rank after
``loss.backward()`` (each rank's ``.grad`` is its own, not yet averaged). It reduce-scatters the
gradients so that each rank gets the average of one shard, updates that shard of the parameters
with SGD + momentum whose buffer exists only for the shard (kept in ``state``, a dict the
caller passes to every step), and all-gathers the updated shards into every rank's parameters.
Graded on the trained parameters (single-process training on the whole batch), on one
reduce_scatter and one all_gather per step, and on the size of the optimizer state.
"""

from __future__ import annotations

from typing import Any

import torch

from distlab.grading import compare, harness
from distlab.grading.spec import SINGLE_TENSOR_NAMES, Batch, Check, Exercise, Part, Submission, setup_cell
from distlab.grading.training import (
    TrainCase,
    build_model,
    local_backward,
    params_problem,
    reference,
    shards,
    steps_problem,
)

SETUP_SOURCE = setup_cell(__name__, extra=SINGLE_TENSOR_NAMES)

FUNCTION = "zero1_step"


def _state_elements(value: Any, depth: int = 0) -> int:
    """Tensor elements held in the optimizer state (dicts, lists and tuples of tensors)."""
    if type(value) is torch.Tensor:
        return int(value.numel())
    if depth > 4:
        return 0
    if type(value) is dict:
        return sum(_state_elements(v, depth + 1) for v in value.values())
    if type(value) in (list, tuple):
        return sum(_state_elements(v, depth + 1) for v in value)
    return 0


# --- rank side ----------------------------------------------------------------------------------
def rank_main(submission: Submission, cases: tuple[TrainCase, ...]) -> list[dict[str, Any]]:
    """On every rank: train the case's model with the student's sharded step."""
    return harness.run_cases(submission, cases, _one_case)


def _one_case(ctx: harness.RankContext, case: TrainCase, samples: list[Any]) -> dict[str, Any]:
    model = build_model(case)
    params = list(model.parameters())
    state: dict[str, Any] = {}
    steps = []
    for step in range(case.steps):
        model.zero_grad(set_to_none=True)
        local_backward(model, samples[step])
        with ctx.watcher.watch() as log:
            harness.call(ctx.fn, f"{case.describe(ctx.world_size)}, step {step}", params, state,
                         case.lr, case.momentum)
        steps.append(log)
    return {"params": [harness.tensor_record(p.detach()) for p in model.parameters()],
            "steps": steps, "state_elements": _state_elements(state)}


# --- trusted side -------------------------------------------------------------------------------
def comm_problem(log: Any, numel: int, world_size: int) -> str | None:
    rec = log if isinstance(log, dict) else {}
    problem = compare.comm_problem(rec, allowed=("reduce_scatter", "all_gather"),
                                   required=("reduce_scatter", "all_gather"),
                                   limit_elements=-(-numel // world_size) * world_size + world_size)
    if problem:
        return problem
    calls = [compare.family(str(e.get("op"))) for e in rec.get("ops", [])
             if isinstance(e, dict) and e.get("via") == "dispatch"]
    if calls.count("reduce_scatter") != 1 or calls.count("all_gather") != 1:
        return (f"made {calls.count('reduce_scatter')} reduce_scatter and {calls.count('all_gather')} "
                f"all_gather calls; a step is one of each, on the flattened parameters")
    return None


def judge(part: Part, batch: Batch, records: list[Any]) -> str | None:
    ws = batch.world_size
    for index, case in enumerate(batch.cases):
        text = case.describe(ws)
        want = reference(case, ws)
        numel = sum(p.numel() for p in want)
        for rank in range(ws):
            record = compare.record(records, rank, index) or {}
            problem = params_problem(record, want, rank, "SGD with momentum on the whole batch in one process")
            if problem:
                return f"{text}: {problem}"
            if Check.COMMUNICATION in part.checks:
                problem = steps_problem(record, case, rank, text, comm_problem, numel, ws)
                if problem:
                    return problem
            if Check.STATE in part.checks:
                held, shard = record.get("state_elements"), -(-numel // ws)
                if not isinstance(held, int) or held > shard:
                    return (f"{text}: rank {rank} keeps {held} elements of optimizer state; its shard of "
                            f"the {numel} parameters is {shard}: keep momentum for the shard only")
    return None


PARTS = (
    Part("matches", "the trained parameters match single-process SGD with momentum", (
        Batch.of(2, TrainCase(momentum=0.9), TrainCase(momentum=0.0, dtype="float64")),
        Batch.of(3, TrainCase(momentum=0.9, steps=2)),
    )),
    Part("communication", "one reduce_scatter and one all_gather per step", (
        Batch.of(4, TrainCase(momentum=0.9)),
        Batch.of(3, TrainCase(momentum=0.5, steps=2)),
    ), frozenset({Check.COMMUNICATION})),
    Part("state", "momentum is kept for this rank's shard only", (
        Batch.of(4, TrainCase(momentum=0.9)),
        Batch.of(2, TrainCase(momentum=0.9, steps=2)),
    ), frozenset({Check.STATE})),
)

EXERCISE = Exercise(
    key="ex6",
    assignment="ex6_zero1",
    function=FUNCTION,
    setup_source=SETUP_SOURCE,
    parts=PARTS,
    rank_main=rank_main,
    judge=judge,
    rank_inputs=shards,
)


def try_case(fn: Any, world_size: int = 2, momentum: float = 0.9, steps: int = 2, check: str | None = None,
             timeout: float = 30.0) -> None:
    """Train on fresh ranks with ``fn`` as the optimizer step; raise AssertionError if wrong.

    ``check="communication"`` also checks the collectives of every step, ``check="state"`` the
    size of the optimizer state. The grade is decided by the grader.
    """
    from distlab.grading import runner

    if check not in (None, "communication", "state"):
        raise ValueError("check must be None, 'communication' or 'state'")
    batch = Batch(world_size, (TrainCase(steps=steps, momentum=momentum),))
    runner.try_batch(EXERCISE, fn, batch, [Check(check)] if check else [], timeout)
