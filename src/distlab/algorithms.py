"""Reference implementations of the algorithms the course builds, used by the benchmark,
the notebooks and the grader (the learner's version is compared with these).

Every function runs on a rank inside an initialised process group and works on CPU (gloo)
and GPU (NCCL) tensors alike.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distlab import trace

# Buffers at most this long are snapshotted automatically while a trace is recording, so a
# traced ring can be replayed with its values; larger ones would bloat the trace.
AUTO_SNAPSHOT_MAX_NUMEL = 1024


def all_gather_single(
    output: torch.Tensor, input: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """Gather every rank's ``input`` into ``output`` (n times larger), concatenated in rank
    order. torch 2.13 renamed ``all_gather_into_tensor`` to ``all_gather_single`` and warns on
    the old name; this calls whichever the installed torch has, without a warning.
    """
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)


def reduce_scatter_single(
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any = dist.ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Reduce ``input`` (n times larger than ``output``) over ranks; rank r keeps slice r.
    Calls ``reduce_scatter_single`` (torch >= 2.13) or ``reduce_scatter_tensor``.
    """
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, op=op, group=group, async_op=async_op)


def _global_rank(group: Any, group_rank: int) -> int:
    return group_rank if group is None else int(dist.get_global_rank(group, group_rank))


def ring_all_reduce(
    tensor: torch.Tensor, group: Any = None, snapshot: bool | None = None
) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place with the ring algorithm, using only isend/irecv.

    The flat buffer is cut into n chunks (``tensor_split``: sizes may differ by one).
    Reduce-scatter: in n-1 steps each rank sends one chunk to its right neighbour and adds the
    chunk arriving from its left; afterwards rank r holds the full sum of chunk (r+1) % n.
    All-gather: in n-1 more steps those finished chunks travel around the ring. Each rank
    sends 2(n-1)/n of the buffer in total, which is why the ring is bandwidth-optimal.

    With ``snapshot`` (default: when a trace is recording and the buffer is small) the buffer
    is added to the trace before the first step and after every step, for ``viz.ring_stepper``.
    """
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce works in place and needs a contiguous tensor")
    flat = tensor.view(-1)
    if snapshot is None:
        snapshot = trace.is_recording() and flat.numel() <= AUTO_SNAPSHOT_MAX_NUMEL
    if snapshot:
        trace.snapshot(flat, "start")
    if n == 1:
        return tensor
    right, left = _global_rank(group, (me + 1) % n), _global_rank(group, (me - 1) % n)
    chunks = list(flat.tensor_split(n))  # views; the first chunks are the larger ones
    incoming = torch.empty_like(chunks[0])
    bounds = [0]
    for c in chunks:
        bounds.append(bounds[-1] + c.numel())

    def span(i: int) -> tuple[int, int]:  # element range [start, stop) of chunk i
        return bounds[i], bounds[i + 1]

    def exchange(send_idx: int, recv_into: torch.Tensor, reduce_into: torch.Tensor | None) -> None:
        # Post the receive before the send: a message that arrives before its receive is
        # posted is buffered and copied again. Reduce while our own send may still be going.
        recv = dist.irecv(recv_into, left, group) if recv_into.numel() else None
        send = dist.isend(chunks[send_idx], right, group) if chunks[send_idx].numel() else None
        if recv is not None:
            recv.wait()
            if reduce_into is not None:
                reduce_into.add_(recv_into)
        if send is not None:
            send.wait()

    for step in range(n - 1):  # reduce-scatter: send chunk me-step, accumulate chunk me-step-1
        s, r = (me - step) % n, (me - step - 1) % n
        buf = incoming[: chunks[r].numel()]
        exchange(s, buf, chunks[r])
        if snapshot:
            trace.snapshot(flat, f"reduce-scatter {step + 1}", span(s), span(r))
    for step in range(n - 1):  # all-gather: pass finished chunk me+1-step, receive chunk me-step
        s, r = (me + 1 - step) % n, (me - step) % n
        exchange(s, chunks[r], None)
        if snapshot:
            trace.snapshot(flat, f"all-gather {step + 1}", span(s), span(r))
    return tensor


def all_reduce_rs_ag(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place as reduce_scatter followed by all_gather.

    The buffer is padded to a multiple of n so every rank owns an equal slice. On gloo this
    is slower than the built-in all_reduce: gloo builds reduce_scatter out of all-reduces.
    """
    n = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    per = -(-flat.numel() // n)  # ceil
    if per * n == flat.numel() and tensor.is_contiguous():
        full = flat
    else:
        full = torch.zeros(per * n, dtype=tensor.dtype, device=tensor.device)
        full[: flat.numel()] = flat
    mine = torch.empty(per, dtype=tensor.dtype, device=tensor.device)
    reduce_scatter_single(mine, full, group=group)  # rank r: sum of slice r
    all_gather_single(full, mine, group=group)  # every rank: all summed slices
    if full is not flat:
        tensor.copy_(full[: flat.numel()].view_as(tensor))
    return tensor
