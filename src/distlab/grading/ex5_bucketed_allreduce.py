"""Exercise 5: averaging gradients in buckets, as DDP does.

The student writes ``average_gradients(model, bucket_bytes)``, called on every rank after
``loss.backward()``: afterwards every parameter's ``.grad`` is the average over the ranks.
Gradients are packed into flat buckets of at most ``bucket_bytes`` (a gradient bigger than that
gets a bucket of its own), and each bucket is one ``all_reduce``. Graded on the trained
parameters (they must match single-process training on the whole batch) and on the all_reduce
calls of every step.
"""

from __future__ import annotations

from typing import Any

from distlab.grading import compare, harness
from distlab.grading.spec import Batch, Check, Exercise, Part, Submission, setup_cell
from distlab.grading.training import (
    SGD,
    TrainCase,
    build_model,
    greedy_buckets,
    local_backward,
    params_problem,
    reference,
    shard,
    shards,
    steps_problem,
)

SETUP_SOURCE = setup_cell(__name__)

FUNCTION = "average_gradients"


# --- rank side ----------------------------------------------------------------------------------
def rank_main(submission: Submission, cases: tuple[TrainCase, ...]) -> list[dict[str, Any]]:
    """On every rank: train the case's model, calling the student's function after each backward."""
    return harness.run_cases(submission, cases, _one_case)


def _one_case(ctx: harness.RankContext, case: TrainCase, samples: list[Any]) -> dict[str, Any]:
    model = build_model(case)
    optimizer = SGD(list(model.parameters()), lr=case.lr, momentum=case.momentum)
    steps = []
    for step in range(case.steps):
        optimizer.zero_grad()
        local_backward(model, samples[step])
        with ctx.watcher.watch() as log:
            harness.call(ctx.fn, f"{case.describe(ctx.world_size)}, step {step}", model, case.bucket_bytes)
        steps.append(log)
        optimizer.step()
    return {"params": [harness.tensor_record(p.detach()) for p in model.parameters()], "steps": steps}


# --- trusted side -------------------------------------------------------------------------------
def _grad_bytes(case: TrainCase) -> list[int]:
    """Bytes of every gradient a step produces, in model.parameters() order."""
    model = build_model(case)
    local_backward(model, shard(case, 1, 0, 0))
    return [p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None]


def buckets_problem(log: Any, case: TrainCase, itemsize: int) -> str | None:
    ops, violations = (log or {}).get("ops"), (log or {}).get("violations")
    if not isinstance(ops, list) or not isinstance(violations, list):
        return "sent back no communication record"
    if violations:
        return "tampered with the grader's communication recorder: " + "; ".join(map(str, violations[:3]))
    entries = [e for e in ops if isinstance(e, dict)]
    other = sorted({compare.readable(e) for e in entries
                    if (e.get("via") == "dispatch" and e.get("op") != "allreduce_")
                    or e.get("via") in ("backend", "store")
                    or (e.get("via") == "python" and e.get("op") != "all_reduce")})
    if other:
        return f"used {', '.join(other)}; only all_reduce is allowed here"
    calls = [int(e.get("out") or 0) for e in entries if e.get("via") == "dispatch"]
    sizes = _grad_bytes(case)
    allowed = {greedy_buckets(sizes, case.bucket_bytes), greedy_buckets(sizes[::-1], case.bucket_bytes)}
    if len(calls) not in allowed:
        return (f"made {len(calls)} all_reduce calls; packing the {len(sizes)} gradients "
                f"({sum(sizes)} bytes) into buckets of at most {case.bucket_bytes} bytes, in order, "
                f"takes {' or '.join(map(str, sorted(allowed)))}")
    limit = max(case.bucket_bytes, max(sizes))
    if any(n * itemsize > limit for n in calls):
        return f"reduced a bucket of {max(calls) * itemsize} bytes; buckets hold at most {limit}"
    if sum(calls) * itemsize != sum(sizes):
        return (f"reduced {sum(calls) * itemsize} bytes in all; the gradients hold {sum(sizes)}: "
                f"each gradient goes into exactly one bucket")
    return None


def judge(part: Part, batch: Batch, records: list[Any]) -> str | None:
    ws = batch.world_size
    for index, case in enumerate(batch.cases):
        text = case.describe(ws)
        want = reference(case, ws)
        itemsize = want[0].element_size()
        for rank in range(ws):
            record = compare.record(records, rank, index) or {}
            problem = params_problem(record, want, rank, "training on the whole batch in one process")
            if problem:
                return f"{text}: {problem}"
            if Check.BUCKETS in part.checks:
                problem = steps_problem(record, case, rank, text, buckets_problem, case, itemsize)
                if problem:
                    return problem
    return None


PARTS = (
    Part("averages", "the trained parameters match single-process training", (
        Batch.of(2, TrainCase(bucket_bytes=64), TrainCase(bucket_bytes=4096, dtype="float64")),
        Batch.of(4, TrainCase(bucket_bytes=200, momentum=0.9)),
    )),
    Part("buckets", "one all_reduce per bucket of at most bucket_bytes", (
        Batch.of(2, TrainCase(bucket_bytes=64), TrainCase(bucket_bytes=8), TrainCase(bucket_bytes=100_000)),
        Batch.of(3, TrainCase(bucket_bytes=150, steps=2)),
    ), frozenset({Check.BUCKETS})),
    Part("frozen", "parameters without gradients (frozen or unused) are skipped", (
        Batch.of(2, TrainCase(bucket_bytes=64, frozen=True), TrainCase(bucket_bytes=64, unused=True)),
        Batch.of(3, TrainCase(bucket_bytes=128, frozen=True, unused=True, steps=2)),
    ), frozenset({Check.BUCKETS})),
)

EXERCISE = Exercise(
    key="ex5",
    assignment="ex5_bucketed_allreduce",
    function=FUNCTION,
    setup_source=SETUP_SOURCE,
    parts=PARTS,
    rank_main=rank_main,
    judge=judge,
    rank_inputs=shards,
)


def try_case(fn: Any, world_size: int = 2, bucket_bytes: int = 64, steps: int = 2, frozen: bool = False,
             unused: bool = False, check_buckets: bool = False, timeout: float = 30.0) -> None:
    """Train on fresh ranks with ``fn`` averaging the gradients; raise AssertionError if wrong.

    ``check_buckets=True`` also checks the all_reduce calls of every step. The grade is decided
    by the grader.
    """
    from distlab.grading import runner

    case = TrainCase(steps=steps, bucket_bytes=bucket_bytes, frozen=frozen, unused=unused)
    batch = Batch(world_size, (case,))
    runner.try_batch(EXERCISE, fn, batch, [Check.BUCKETS] if check_buckets else [], timeout)
