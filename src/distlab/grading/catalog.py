"""Which exercises can be graded, without importing torch.

The instructor CLI and nbgrader's configuration only need names and cell ids; the checks
themselves (and torch) are imported by the processes that grade.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from distlab.grading.spec import Exercise


@dataclass(frozen=True)
class Entry:
    key: str          # the short name notebooks use: "ex1"
    assignment: str   # the nbgrader assignment and notebook name
    module: str       # where the parts, the rank driver and the judge live
    function: str     # what the student defines, in the answer cell of the same id
    parts: tuple[str, ...]
    answer_cell: str = ""  # the answer cell's id when it is not the function's name

    @property
    def solution_ids(self) -> tuple[str, ...]:
        return (self.answer_cell or self.function,)

    def load(self) -> Exercise:
        exercise: Exercise = importlib.import_module(self.module).EXERCISE
        return exercise


ENTRIES = (
    Entry("ex1", "ex1_all_reduce_rs_ag", "distlab.grading.ex1_all_reduce_rs_ag", "all_reduce_rs_ag",
          ("divisible", "indivisible", "shapes", "dtypes", "ops", "subgroup", "communication")),
    Entry("ex2", "ex2_ring_all_reduce", "distlab.grading.ex2_ring_all_reduce", "ring_all_reduce",
          ("divisible", "any_size", "steps", "bytes")),
    Entry("ex3", "ex3_tree_broadcast", "distlab.grading.ex3_tree_broadcast", "tree_broadcast",
          ("from_zero", "any_source", "any_world_size", "rounds")),
    Entry("ex4", "ex4_all_to_all", "distlab.grading.ex4_all_to_all", "all_to_all_p2p",
          ("equal_chunks", "uneven_chunks", "messages", "counts")),
    Entry("ex5", "ex5_bucketed_allreduce", "distlab.grading.ex5_bucketed_allreduce", "average_gradients",
          ("averages", "buckets", "frozen")),
    Entry("ex6", "ex6_zero1", "distlab.grading.ex6_zero1", "zero1_step", ("matches", "communication", "state")),
    Entry("ex7", "ex7_cost_model", "distlab.grading.ex7_cost_model", "memory_per_gpu",
          ("ring", "hierarchical", "memory", "volume"), answer_cell="cost_functions"),
)


def entry(name: str) -> Entry:
    """An exercise by its short key ("ex1") or its assignment name ("ex1_all_reduce_rs_ag")."""
    for item in ENTRIES:
        if name in (item.key, item.assignment):
            return item
    raise KeyError(f"no exercise {name!r}; known: {', '.join(e.assignment for e in ENTRIES)}")
