"""The instructor's reference algorithms (grader/reference.py) give torch's own answers, on real
gloo ranks, for every world size, uneven sizes, pieced rings and subgroups.
"""

from __future__ import annotations

import sys
from typing import Any

import cloudpickle
import pytest

import distlab
from grader import reference

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this file
cloudpickle.register_pickle_by_value(reference)  # nor the instructor's package

SIZES = (1, 2, 3, 7, 10, 1001, 300_001)  # fewer elements than ranks, uneven chunks, a large buffer


def _compare_with_builtin(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    from distlab import trace

    algorithms = reference

    n, me = dist.get_world_size(), dist.get_rank()
    rows = []
    for numel in sizes:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(1000 * me + numel))
        expected = x.clone()
        dist.all_reduce(expected)
        for name, run in (("ring", algorithms.ring_all_reduce),
                          ("ring, 3 pieces", lambda t: algorithms.ring_all_reduce(t, pieces=3)),
                          ("rs+ag", algorithms.all_reduce_rs_ag)):
            y = x.clone()
            with trace.recording() as calls:
                run(y)
            sent = sum(m["bytes"] for c in calls for m in c["p2p"] if m["dir"] == "send")
            rows.append({"name": name, "numel": numel, "n": n,
                         "error": float((y - expected).abs().max()), "sent": sent,
                         "ops": sorted({c["op"] for c in calls if c["op"] != "snapshot"})})
    return rows


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_reference_all_reduces_match_torch(world_size: int) -> None:
    per_rank = distlab.run(_compare_with_builtin, world_size=world_size, args=(SIZES,), timeout=120)
    for rows in per_rank:
        for row in rows:
            assert row["error"] < 1e-4, row
            if row["name"].startswith("ring"):
                assert row["ops"] in (["irecv", "isend"], []), row  # point-to-point only
                # a ring moves 2(n-1)/n of the buffer: each rank sends every chunk but one, twice
                assert row["sent"] <= 2 * 4 * -(-row["numel"] // world_size) * (world_size - 1), row
            else:
                assert "all_reduce" not in row["ops"], row
    for index, row in enumerate(per_rank[0]):  # all ranks together send exactly 2(n-1) buffers' worth / n
        total = sum(rows[index]["sent"] for rows in per_rank)
        if row["name"].startswith("ring"):
            assert total == 2 * (world_size - 1) * 4 * row["numel"], row


def _ring_on_a_subgroup() -> list[float]:
    import torch
    import torch.distributed as dist

    ring_all_reduce = reference.ring_all_reduce
    odd = dist.new_group([1, 3])
    t = torch.full((5,), float(dist.get_rank()))
    if dist.get_rank() in (1, 3):
        ring_all_reduce(t, group=odd)
    return t.tolist()


def test_ring_on_a_subgroup_uses_global_peers() -> None:
    assert distlab.run(_ring_on_a_subgroup, world_size=4) == [
        [0.0] * 5, [4.0] * 5, [2.0] * 5, [4.0] * 5]


def _bad_pieces() -> str:
    import torch

    ring_all_reduce = reference.ring_all_reduce
    try:
        ring_all_reduce(torch.ones(4), pieces=0)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_ring_rejects_zero_pieces() -> None:
    assert distlab.run(_bad_pieces, world_size=2) == ["pieces must be at least 1, got 0"] * 2
