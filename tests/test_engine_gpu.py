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


def test_a_traced_nccl_call_ends_when_the_device_is_done_not_when_it_was_queued() -> None:
    """NCCL returns once the work is on a CUDA stream; the trace synchronises before its clock."""
    def traced_vs_events() -> tuple[float, float]:
        import os

        import torch
        import torch.distributed as dist

        from distlab import trace

        t = torch.ones(64 * 2**20, device=torch.device("cuda", int(os.environ["LOCAL_RANK"])))  # 256 MB
        dist.all_reduce(t)  # warm up
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(t)
        end.record()
        torch.cuda.synchronize()
        with trace.recording() as calls:
            dist.all_reduce(t)
        return calls[0]["t_end"] - calls[0]["t_start"], start.elapsed_time(end) / 1e3

    for traced, device in distlab.run(traced_vs_events, world_size=min(GPUS, 2), backend="nccl"):
        assert traced >= 0.5 * device, (traced, device)


def test_an_nccl_hang_fails_the_cell_within_its_deadline_and_the_next_cell_works() -> None:
    from kernel_session import KernelSession

    world = min(GPUS, 2)
    if world < 2:
        pytest.skip("a mismatched collective needs two GPUs")
    kernel = KernelSession()
    try:
        kernel.execute(f"%load_ext distlab\n%dist_start -n {world} --backend nccl", timeout=180)
        reply = kernel.execute("%%dist --timeout 20\nt = torch.ones(4, device=device)\n"
                               "if rank == 0:\n    dist.all_reduce(t)\ntorch.cuda.synchronize()", timeout=90)
        assert reply.error is not None and reply.error["ename"] == "RankTimeout", reply.stdout
        after = kernel.execute("%%dist\nt = torch.ones(4, device=device)\ndist.all_reduce(t)\nprint(t[0].item())",
                               timeout=180)
        assert after.error is None, after.traceback
        assert after.stdout.count(f"{float(world)}") == world
    finally:
        kernel.shutdown()
