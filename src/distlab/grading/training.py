"""A tiny data-parallel training run, the same on the ranks and in the grading process.

Every rank builds the same model from a fixed seed and trains it on its own shard of a batch;
the grading process trains the same model on the whole batch in one process (the gradient of
the mean loss over equal shards is the mean of the shards' gradients) and compares parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from distlab.grading import compare
from distlab.grading.cases import DTYPES, generator


@dataclass(frozen=True)
class TrainCase:
    steps: int = 3
    bucket_bytes: int = 64
    dtype: str = "float32"
    frozen: bool = False   # the first layer does not train (requires_grad=False)
    unused: bool = False   # one layer is in the model but not in the forward pass (grad is None)
    momentum: float = 0.0
    lr: float = 0.1
    batch: int = 4         # samples per rank

    def describe(self, world_size: int) -> str:
        text = f"world_size={world_size}, {self.steps} steps, bucket_bytes={self.bucket_bytes}, {self.dtype}"
        extras = [name for name in ("frozen", "unused") if getattr(self, name)]
        if self.momentum:
            extras.append(f"momentum={self.momentum:g}")
        return text + (f", {', '.join(extras)} layer" if extras else "")


class Net(nn.Module):
    def __init__(self, case: TrainCase) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 6)
        self.hidden = nn.Linear(6, 5)
        self.head = nn.Linear(5, 3)
        self.spare = nn.Linear(3, 3)  # used only when the case says so
        self.case = case
        if case.frozen:
            self.embed.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(torch.relu(self.hidden(torch.relu(self.embed(x)))))
        return out if self.case.unused else self.spare(out)


def build_model(case: TrainCase) -> Net:
    """The same initial weights on every rank and in the grader."""
    torch.manual_seed(1234)
    return Net(case).to(DTYPES[case.dtype])


def shard(case: TrainCase, world_size: int, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s samples at ``step``, made in the grading process: a rank is sent its own
    shards alone, so it learns the others' gradients by communicating or not at all."""
    gen = generator(case, world_size, rank, step)
    dtype = DTYPES[case.dtype]
    return (torch.randn(case.batch, 6, generator=gen).to(dtype),
            torch.randn(case.batch, 3, generator=gen).to(dtype))


def shards(batch: Any, rank: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """``rank_inputs`` of the training exercises: rank ``rank``'s samples, per case and step."""
    return [[shard(case, batch.world_size, rank, step) for step in range(case.steps)] for case in batch.cases]


def local_backward(model: Net, samples: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = samples
    nn.functional.mse_loss(model(x), y).backward()


class SGD:
    """torch.optim.SGD's update (momentum, no dampening), written out.

    torch.optim imports torch._dynamo (seconds of CPU) in every process that builds an
    optimizer; grading ranks are fresh processes, so they use this instead.
    """

    def __init__(self, params: list[nn.Parameter], lr: float, momentum: float = 0.0) -> None:
        self.params, self.lr, self.momentum = params, lr, momentum
        self.buffers: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def step(self) -> None:
        for index, p in enumerate(self.params):
            if p.grad is None:
                continue
            step = p.grad
            if self.momentum:
                buffer = self.buffers.get(index)
                buffer = step.clone() if buffer is None else buffer.mul_(self.momentum).add_(step)
                self.buffers[index] = buffer
                step = buffer
            p.sub_(step, alpha=self.lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def reference(case: TrainCase, world_size: int) -> list[torch.Tensor]:
    """Parameters after ``case.steps`` steps of single-process SGD on the whole batch."""
    model = build_model(case)
    optimizer = SGD(list(model.parameters()), lr=case.lr, momentum=case.momentum)
    for step in range(case.steps):
        optimizer.zero_grad()
        grads: dict[str, torch.Tensor] = {}
        for rank in range(world_size):
            model.zero_grad(set_to_none=True)
            local_backward(model, shard(case, world_size, rank, step))
            for name, p in model.named_parameters():
                if p.grad is not None:
                    grads[name] = grads.get(name, torch.zeros_like(p)) + p.grad / world_size
        for name, p in model.named_parameters():
            p.grad = grads.get(name)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def greedy_buckets(sizes: list[int], limit: int) -> int:
    """Buckets when gradients of ``sizes`` bytes are packed in order, each bucket <= ``limit``."""
    count, used = 0, math.inf
    for size in sizes:
        if used + size > limit:
            count, used = count + 1, 0.0
        used += size
    return count


# --- trusted side: what the ex5 and ex6 judges share --------------------------------------------
def params_problem(record: dict[str, Any], want: list[torch.Tensor], rank: int, expected: str) -> str | None:
    """What is wrong with one rank's trained parameters, from "rank N ..." on (None: they match)."""
    params = record.get("params")
    if not isinstance(params, list) or len(params) != len(want):
        return f"rank {rank} sent back no parameters"
    for number, (got, expect) in enumerate(zip(params, want, strict=True)):
        problem = compare.tensor_problem(got, expect, exact=False)
        if problem:
            return f"rank {rank}, parameter {number} after training {problem} (expected: {expected})"
    return None


def steps_problem(record: dict[str, Any], case: TrainCase, rank: int, text: str,
                  check: Callable[..., str | None], *args: Any) -> str | None:
    """``check(log, *args)`` on the communication log of each training step of one rank, as feedback."""
    steps = record.get("steps")
    if not isinstance(steps, list) or len(steps) != case.steps:
        return f"{text}: rank {rank} sent back no communication record"
    for step, log in enumerate(steps):
        problem = check(log, *args)
        if problem:
            return f"{text}, step {step}: rank {rank} {problem}"
    return None
