"""The recorder counts what each primitive moves, on real gloo ranks, and leaves torch as it was.

Byte conventions checked here (see distlab.trace): ``size`` is the nccl-tests message size,
``bus_bytes`` is size times the nccl-tests factor, ``sent``/``recv`` are the logical bytes a
rank's data gives to / gets from the others, so summed over ranks sent == recv.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import distlab
from distlab import trace

# Send this module's functions by value: the ranks need not import it (and pytest).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 3  # odd world size: factors like 2(n-1)/n are not round, chunks are uneven
F = 4  # bytes per float32


def _every_primitive() -> None:
    """Each primitive once (so records can be found by op name); float32 throughout."""
    r = dist.get_rank()
    dist.all_reduce(torch.ones(6))  # 24 B
    dist.broadcast(torch.ones(6), src=1)
    dist.reduce(torch.ones(6), dst=2)
    dist.scatter(torch.empty(2), [torch.ones(2)] * N if r == 0 else None, src=0)
    dist.gather(torch.ones(2), [torch.empty(2) for _ in range(N)] if r == 0 else None, dst=0)
    dist.all_gather([torch.empty(2) for _ in range(N)], torch.ones(2))
    dist.all_gather_single(torch.empty(2 * N), torch.ones(2))
    dist.reduce_scatter(torch.empty(2), [torch.ones(2) for _ in range(N)])
    dist.reduce_scatter_single(torch.empty(2), torch.ones(2 * N))
    with warnings.catch_warnings():  # the deprecated spellings must be recorded too
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_into_tensor(torch.empty(2 * N), torch.ones(2))
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * N))
    dist.all_to_all([torch.empty(2) for _ in range(N)], [torch.ones(2) for _ in range(N)])
    # uneven all_to_all_single: every rank sends j+1 rows to rank j, so rank r gets 3(r+1)
    dist.all_to_all_single(torch.empty(N * (r + 1)), torch.ones(6),
                           output_split_sizes=[r + 1] * N, input_split_sizes=[1, 2, 3])
    dist.barrier()
    if r == 0:
        dist.send(torch.ones(5), dst=1)
    elif r == 1:
        dist.recv(torch.empty(5))  # any source: the peer comes from recv's return value
    right, left = (r + 1) % N, (r - 1) % N
    reqs = [dist.isend(torch.ones(3), right), dist.irecv(torch.empty(3), left)]
    for req in reqs:
        req.wait()
    ops = [dist.P2POp(dist.isend, torch.ones(4), right), dist.P2POp(dist.irecv, torch.empty(4), left)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    dist.all_reduce(torch.ones(8), async_op=True).wait()  # only async all_reduce: 32 B
    dist.broadcast_object_list([{"hello": list(range(10))}] if r == 0 else [None], src=0)
    sub = dist.new_group([0, 2])
    if r != 1:
        dist.all_reduce(torch.ones(4), group=sub)  # 16 B in a group of 2


def _expected(r: int) -> dict[str, tuple[int, int, int, float]]:
    """op -> (size, sent, recv, bus_bytes) on rank r for _every_primitive."""
    ag = (24, 16, 16, 16.0)  # all_gather / reduce_scatter / all_to_all of 3 x 8 B
    exp = {
        "all_reduce": (24, 32, 32, 32.0),
        "broadcast": (24, 48, 0, 24.0) if r == 1 else (24, 0, 24, 24.0),
        "reduce": (24, 0, 48, 24.0) if r == 2 else (24, 24, 0, 24.0),
        "scatter": (24, 16, 0, 16.0) if r == 0 else (24, 0, 8, 16.0),
        "gather": (24, 0, 16, 16.0) if r == 0 else (24, 8, 0, 16.0),
        "all_gather": ag, "all_gather_single": ag, "all_gather_into_tensor": ag,
        "reduce_scatter": ag, "reduce_scatter_single": ag, "reduce_scatter_tensor": ag,
        "all_to_all": ag,
        "all_to_all_single": (24, 24 - (r + 1) * F, 2 * (r + 1) * F, 16.0),
        "barrier": (0, 0, 0, 0.0),
        "isend": (12, 12, 0, 12.0), "irecv": (12, 0, 12, 12.0),
        "batch_isend_irecv": (32, 16, 16, 32.0),
    }
    if r == 0:
        exp["send"] = (20, 20, 0, 20.0)
    if r == 1:
        exp["recv"] = (20, 0, 20, 20.0)
    return exp


@pytest.fixture(scope="module")
def traced() -> Any:
    return distlab.run(_every_primitive, world_size=N, trace=True, timeout=120)


def _by_op(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        out.setdefault(rec["op"], []).append(rec)
    return out


def test_bytes_match_theoretical_volume_for_each_primitive(traced: Any) -> None:
    for r in range(N):
        ops = _by_op(traced.trace[r])
        for op, (size, sent, recv, bus) in _expected(r).items():
            rec = ops[op][0]
            got = (rec["size"], rec["sent"], rec["recv"], rec["bus_bytes"])
            assert got == pytest.approx((size, sent, recv, bus)), f"rank {r} {op}"


def test_logical_bytes_are_conserved_across_ranks(traced: Any) -> None:
    """Whatever one rank sends, another receives: per collective, sum(sent) == sum(recv)."""
    per_rank = [_by_op(t) for t in traced.trace]
    for op in _expected(0):
        if op in ("isend", "irecv", "send"):  # one-sided: checked as pairs below
            continue
        sent = sum(ops[op][0]["sent"] for ops in per_rank if op in ops)
        recv = sum(ops[op][0]["recv"] for ops in per_rank if op in ops)
        assert sent == recv, op
    for one_side, other_side in (("send", "recv"), ("isend", "irecv")):
        sent = sum(ops[one_side][0]["sent"] for ops in per_rank if one_side in ops)
        assert sent == sum(ops[other_side][0]["recv"] for ops in per_rank if other_side in ops)


def test_records_carry_peer_group_async_and_times(traced: Any) -> None:
    r0, r1, r2 = (_by_op(t) for t in traced.trace)
    assert r0["send"][0]["peer"] == 1 and r1["recv"][0]["peer"] == 0
    assert r0["send"][0]["p2p"] == [{"dir": "send", "peer": 1, "bytes": 20, "tag": 0}]
    assert r1["broadcast"][0]["peer"] == 1 and r0["reduce"][0]["peer"] == 2
    assert r0["isend"][0]["peer"] == 1 and r0["irecv"][0]["peer"] == 2
    batch = r0["batch_isend_irecv"][0]
    assert [(m["dir"], m["peer"]) for m in batch["p2p"]] == [("send", 1), ("recv", 2)]
    # the second all_reduce (async, 8 floats) and the subgroup one
    _, async_ar, sub_ar = r0["all_reduce"]
    assert async_ar["async"] and async_ar["t_wait"] >= async_ar["t_end"] >= async_ar["t_start"]
    assert async_ar["reduce_op"] == "SUM" and async_ar["shapes"] == [[8]]
    assert sub_ar["group_ranks"] == [0, 2] and sub_ar["group_size"] == 2
    assert sub_ar["sent"] == 16 and sub_ar["bus_bytes"] == 16.0
    assert len(r1["all_reduce"]) == 2  # rank 1 is outside the subgroup
    for rec in traced.trace[2]:
        assert rec["rank"] == 2 and rec["wall_end"] >= rec["wall_start"] and rec["error"] is None
    assert r2["all_to_all_single"][0]["dtypes"] == ["float32", "float32"]


def test_object_variants_are_recorded_once_with_their_inner_bytes(traced: Any) -> None:
    for r, records in enumerate(traced.trace):
        ops = _by_op(records)
        rec = ops["broadcast_object_list"][0]
        assert rec["peer"] == 0
        assert (rec["sent"] if r == 0 else rec["recv"]) > 0  # the pickled object moved
    # torch's inner broadcasts were not recorded as calls of their own
    assert len(_by_op(traced.trace[0])["broadcast"]) == 1


def _p2p_ops_across_recording_boundaries() -> list[float]:
    """P2POps built before a recording, used inside it, and built inside, used after."""
    r, n = dist.get_rank(), dist.get_world_size()
    before = [dist.P2POp(dist.isend, torch.full((2,), float(r)), (r + 1) % n),
              dist.P2POp(dist.irecv, torch.empty(2), (r - 1) % n)]
    with trace.recording() as calls:
        for req in dist.batch_isend_irecv(before):
            req.wait()
        inside = [dist.P2POp(dist.isend, torch.full((2,), float(r)), (r + 1) % n),
                  dist.P2POp(dist.irecv, torch.empty(2), (r - 1) % n)]
    for req in dist.batch_isend_irecv(inside):
        req.wait()
    assert [c["op"] for c in calls] == ["batch_isend_irecv"]
    return before[1].tensor.tolist() + inside[1].tensor.tolist()


def test_p2p_ops_work_across_recording_boundaries() -> None:
    got = distlab.run(_p2p_ops_across_recording_boundaries, world_size=2)
    assert got == [[1.0] * 4, [0.0] * 4]


def _bad_calls() -> list[tuple[str, dict[str, Any]]]:
    """Two calls torch rejects: a list for a tensor, and split sizes for one rank, not two."""
    out = []
    with trace.recording() as calls:
        for call in (lambda: dist.broadcast([1.0, 2.0], src=0),
                     lambda: dist.all_to_all_single(torch.empty(2), torch.ones(2),
                                                    output_split_sizes=[2], input_split_sizes=[2])):
            try:
                call()
            except (TypeError, ValueError, RuntimeError) as exc:
                out.append((str(exc), calls[-1]))
    return out


def test_a_call_torch_rejects_fails_with_torchs_error_and_is_still_recorded() -> None:
    per_rank = distlab.run(_bad_calls, world_size=2)
    for (b_msg, b_rec), (a_msg, a_rec) in per_rank:
        assert b_rec["op"] == "broadcast" and b_rec["error"].endswith(b_msg) and b_rec["size"] == 0
        assert a_rec["op"] == "all_to_all_single" and a_rec["error"].endswith(a_msg)
    # rank 1 has no slot in a one-entry split list: the recorder says so and lets torch decide
    a_rec = per_rank[1][1][1]
    assert a_rec["note"].startswith("arguments not understood by the recorder: IndexError")


def test_recording_restores_torch_even_after_an_exception() -> None:
    originals = {name: getattr(dist, name) for name in trace.TENSOR_OPS + trace.OBJECT_OPS
                 if hasattr(dist, name)}
    c10d_isend = dist.distributed_c10d.isend
    with pytest.raises(RuntimeError, match="boom"), trace.recording():
        assert dist.all_reduce is not originals["all_reduce"]
        assert dist.distributed_c10d.isend is dist.isend  # P2POp(dist.isend) validates
        raise RuntimeError("boom")
    assert not trace.is_recording()
    assert {name: getattr(dist, name) for name in originals} == originals
    assert dist.distributed_c10d.isend is c10d_isend


def test_nested_recordings_see_their_own_calls() -> None:
    with trace.recording() as outer:
        trace.snapshot(torch.arange(3), "a")
        with trace.recording() as inner:
            trace.snapshot([1, 2], "b")
        assert trace.is_recording()
    assert [s["label"] for s in outer] == ["a", "b"] and [s["label"] for s in inner] == ["b"]
    assert outer[0]["values"] == [0, 1, 2]


def _blocking_calls() -> tuple[list[float], list[float], list[tuple[str, bool, Any, bool]]]:
    """Blocking collectives, one with async_op given by position, one torch implements by
    calling another (all_gather_into_tensor calls all_gather_single)."""
    n = dist.get_world_size()
    t = torch.ones(4)
    out = torch.empty(2 * n)
    with trace.recording() as calls, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce(t, dist.ReduceOp.SUM, None, False)
        dist.all_gather_into_tensor(out, torch.full((2,), float(dist.get_rank())))
        dist.barrier()
    return t.tolist(), out.tolist(), [(c["op"], c["async"], c["t_wait"], c["t_end"] >= c["t_start"])
                                      for c in calls]


def test_blocking_calls_are_recorded_once_as_blocking_with_their_results() -> None:
    for t, out, calls in distlab.run(_blocking_calls, world_size=2):
        assert t == [2.0] * 4 and out == [0.0, 0.0, 1.0, 1.0]
        assert calls == [("all_reduce", False, None, True), ("all_gather_into_tensor", False, None, True),
                         ("barrier", False, None, True)]


def test_the_recorder_never_initialises_cuda_on_a_cpu_rank() -> None:
    """It synchronises the device before its clock only where CUDA is already in use (NCCL)."""
    import distlab

    def traced() -> bool:
        import torch
        import torch.distributed as dist

        from distlab import trace

        with trace.recording() as calls:
            dist.all_reduce(torch.ones(4))
            dist.all_reduce(torch.ones(4), async_op=True).wait()
        return len(calls) == 2 and not torch.cuda.is_initialized()

    assert distlab.run(traced, world_size=2) == [True, True]
