"""The NCCL path end to end. Skipped without GPUs; run on a GPU machine with `pytest -m gpu`."""

from __future__ import annotations

import pytest

import distlab
from distlab.backends import visible_gpu_count

GPUS = visible_gpu_count()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU (NCCL path)")]


def _nccl_all_reduce() -> tuple[str, float, int]:
    import os

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    t = torch.full((1024,), float(dist.get_rank() + 1), device=device)
    dist.all_reduce(t)
    return dist.get_backend(), t[0].item(), torch.cuda.current_device()


def test_nccl_gives_each_rank_its_own_gpu() -> None:
    world = GPUS
    results = distlab.run(_nccl_all_reduce, world_size=world, backend="nccl")
    assert [r[0] for r in results] == ["nccl"] * world
    assert [r[1] for r in results] == [world * (world + 1) / 2] * world
    assert [r[2] for r in results] == list(range(world))


def test_auto_picks_nccl_with_a_gpu_per_rank() -> None:
    results = distlab.run(_nccl_all_reduce, world_size=GPUS, backend="auto")
    assert results[0][0] == "nccl"


def test_more_ranks_than_gpus_is_a_clear_error() -> None:
    with pytest.raises(distlab.BackendUnavailable, match="one GPU per rank"):
        distlab.run(_nccl_all_reduce, world_size=GPUS + 1, backend="nccl")


def test_cuda_results_come_back_on_the_cpu() -> None:
    def make() -> object:
        import torch

        return torch.ones(2, device="cuda")

    (tensor,) = distlab.run(make, world_size=1, backend="nccl")
    assert tensor.device.type == "cpu"
