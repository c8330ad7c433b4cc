"""What an exercise is made of, and what grading produces, as plain data.

An exercise is a list of graded parts; each part is a few batches of cases, one batch per world
size, and each batch runs once on fresh ranks. Results are JSON-able so that a grading process
can hand them to the nbgrader process (and to feedback) without pickles.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

DEFAULT_PART_TIMEOUT = 30.0  # seconds a graded part may run before it scores zero


def source_digest(source: str) -> str:
    """Identifies the graded source, so a result computed earlier is only reused for the same code."""
    return hashlib.sha256(source.encode()).hexdigest()


@dataclass(frozen=True)
class Batch:
    """Cases that run together, in order, on ``world_size`` fresh ranks."""

    world_size: int
    cases: tuple[Any, ...]

    @classmethod
    def of(cls, world_size: int, *cases: Any) -> Batch:
        """``Batch.of(4, case_a, case_b)``: how the exercises' PARTS tables spell a batch."""
        return cls(world_size, cases)


class Check(Enum):
    """What a part checks beyond the result each rank ends with; a judge reads ``part.checks``."""

    STEPS = "steps"                  # ex2: 2(n-1) ring steps, right neighbour out, left neighbour in
    BYTES = "bytes"                  # ex2: each step carries one chunk
    ROUNDS = "rounds"                # ex3: a binomial tree, ceil(log2 n) rounds
    MESSAGES = "messages"            # ex4: one message per pair of ranks, each exactly its chunk
    BUCKETS = "buckets"              # ex5: one all_reduce per bucket of at most bucket_bytes
    COMMUNICATION = "communication"  # ex6: one reduce_scatter and one all_gather per step
    STATE = "state"                  # ex6: optimizer state for this rank's shard only


@dataclass(frozen=True)
class Part:
    """One graded part: the notebook's grade cell ``test_<name>`` scores it."""

    name: str
    title: str
    batches: tuple[Batch, ...]
    checks: frozenset[Check] = frozenset()

    @property
    def grade_id(self) -> str:
        return f"test_{self.name}"


# rank side: rank_main(submission, cases) -> list of plain per-case records
RankMain = Callable[[Any, tuple[Any, ...]], list[dict[str, Any]]]
# trusted side: rank_inputs(batch, rank) -> what that rank alone is sent, one entry per case
RankInputs = Callable[[Batch, int], list[Any]]
# trusted side: judge(part, batch, per_rank_records) -> None when correct, else the feedback text
Judge = Callable[[Part, Batch, list[Any]], "str | None"]
# trusted side: one rank's record of one case -> None when its communication is allowed, else why not
CommRule = Callable[[dict[str, Any]], "str | None"]


SINGLE_TENSOR_NAMES = '''\
# torch 2.13 renamed the single-tensor collectives; older torch only has the old names
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor'''


def per_case(make: Callable[[Any, int, int], Any]) -> RankInputs:
    """``rank_inputs`` of an exercise whose every case gives each rank one input, ``make(case,
    world_size, rank)``."""
    return lambda batch, rank: [make(case, batch.world_size, rank) for case in batch.cases]


def setup_cell(module: str, imports: str = "import torch\nimport torch.distributed as dist", extra: str = "") -> str:
    """The locked setup cell an exercise notebook starts with, which the grader runs itself
    (never the submission's copy): ``imports``, distlab, and the exercise's module as ``exN``.

    ``module`` is the exercise module's ``__name__``; ``extra`` follows after a blank line.
    """
    name = module.rsplit(".", 1)[-1]
    text = f"{imports}\n\nimport distlab\nimport distlab.grading\nfrom distlab.grading import {name} as {name.split('_')[0]}"
    return f"{text}\n\n{extra}" if extra else text


def answer_cells(function: str, solution_ids: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The grade_ids of the answer cells whose source is graded: by default the cell named after the
    function. The one place this rule lives (the catalog applies it without importing the module)."""
    return tuple(solution_ids) or (function,)


@dataclass(frozen=True)
class Exercise:
    key: str                 # short name used in notebooks: "ex1"
    assignment: str          # nbgrader assignment (and notebook) name
    function: str            # the name the student defines
    setup_source: str        # the locked setup cell, executed (from here, never from the submission) first
    parts: tuple[Part, ...]
    rank_main: RankMain
    judge: Judge
    # checked on every case of every part before the judge: an exercise that asks to build a
    # collective gives no part to a submission that calls it (or any other forbidden one)
    communication: CommRule | None = None
    # judged against the instructor's reference answer (run in the trusted process at grading
    # time, never shipped): the judge gets ``reference=`` the namespace of the reference cell
    needs_reference: bool = False
    # grade_ids of the answer cells whose source is graded; by default the cell named after the function
    solution_ids: tuple[str, ...] = ()
    # the data each rank works on, made in the grading process with a key the ranks never see and
    # sent to each rank alone (harness.own_inputs): no rank can rebuild another's and copy the result
    rank_inputs: RankInputs | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "solution_ids", answer_cells(self.function, self.solution_ids))

    def part(self, name: str) -> Part:
        for part in self.parts:
            if part.name == name or part.grade_id == name:
                return part
        raise KeyError(f"{self.key} has no part {name!r}; parts: {', '.join(p.name for p in self.parts)}")


@dataclass(frozen=True)
class Submission:
    """What runs on the ranks: source text (grader) or a function shipped by value (in-kernel check)."""

    function: str
    setup_source: str = ""
    source: str | None = None
    fn: Callable[..., Any] | None = None
    protected: tuple[str, ...] = ()  # directories the graded source may not read (see sandbox)


@dataclass
class PartResult:
    part: str
    passed: bool
    message: str = ""        # feedback for the student; empty when passed
    seconds: float = 0.0
    cases: int = 0


@dataclass
class SubmissionResult:
    assignment: str
    source_sha256: str
    parts: list[PartResult] = field(default_factory=list)
    seconds: float = 0.0

    def by_grade_id(self) -> dict[str, PartResult]:
        return {f"test_{p.part}": p for p in self.parts}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> SubmissionResult:
        data = json.loads(text)
        parts = [PartResult(**p) for p in data.pop("parts")]
        return cls(parts=parts, **data)


def describe_parts(parts: Sequence[Part]) -> str:
    return ", ".join(p.name for p in parts)
