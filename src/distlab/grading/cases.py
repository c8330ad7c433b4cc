"""Cases of the all-reduce family of exercises: every rank's input and the reference result.

Inputs are made in the grading process, never on the ranks, from a key drawn afresh by each
grading process (:func:`generator`), and each rank is sent its own input alone (the runner pushes
it before the batch runs). A rank cannot rebuild another rank's input from the case it is given,
so a submission that looks up the case and copies the reference result (the case is public, in
the installed kit) has nothing to copy from: it must communicate. The reference is computed from
the same inputs, so it never depends on what ranks report.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass

import torch

OPS = ("SUM", "AVG", "MAX", "MIN")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}
_KEY = secrets.token_bytes(32)  # this process's; a rank's process has its own, and never this one


def generator(*what: object) -> torch.Generator:
    """A generator seeded by ``what`` and this process's secret key: the same data every time in
    this process (the judge rebuilds what a rank was sent), data no rank can make itself."""
    digest = hashlib.blake2b(repr(what).encode(), key=_KEY, digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


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
    """Rank ``rank``'s input, made in the grading process (see :func:`generator`)."""
    gen = generator(case, world_size, rank)
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


