"""Cases of the all-reduce family of exercises: deterministic inputs and the reference result.

Every rank builds its own input from the case, its rank and the world size; the grading process
rebuilds every rank's input the same way, so the reference never depends on what ranks report.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

OPS = ("SUM", "AVG", "MAX", "MIN")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}


@dataclass(frozen=True)
class Case:
    """One call of the student's function: every rank passes a tensor of ``shape``."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    op: str = "SUM"
    groups: tuple[tuple[int, ...], ...] = ()  # a partition of the ranks, one group per part; () = world
    check_comm: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def describe(self, world_size: int) -> str:
        text = f"world_size={world_size}, shape={self.shape} (numel={self.numel}), {self.dtype}, op={self.op}"
        if self.groups:
            text += f", groups={[list(g) for g in self.groups]}"
        return text

    def members(self, world_size: int, rank: int) -> tuple[int, ...]:
        for group in self.groups:
            if rank in group:
                return group
        return tuple(range(world_size))


def make_input(case: Case, world_size: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input: deterministic, so the grader can rebuild every rank's input itself."""
    seed = zlib.crc32(repr((case, world_size, rank)).encode())
    gen = torch.Generator().manual_seed(seed)
    if case.dtype == "int64":
        return torch.randint(-100, 100, case.shape, generator=gen, dtype=torch.int64)
    # multiples of 1/8: every partial sum is exact, whatever order the ranks add in
    return (torch.randint(-80, 80, case.shape, generator=gen) / 8).to(DTYPES[case.dtype])


def expected(case: Case, world_size: int, rank: int) -> torch.Tensor:
    """What ``dist.all_reduce`` would leave in rank ``rank``'s tensor."""
    inputs = torch.stack([make_input(case, world_size, r) for r in case.members(world_size, rank)])
    if case.op == "SUM":
        return inputs.sum(0)
    if case.op == "AVG":
        return inputs.mean(0)
    if case.op == "MAX":
        return inputs.amax(0)
    return inputs.amin(0)


