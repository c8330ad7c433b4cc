"""The instructor's reference implementations of algorithms that graded exercises ask for.

They live here, beside the grader, and never in the ``distlab`` package that students install:
``ring_all_reduce`` is exercise 2's answer and ``all_reduce_rs_ag`` exercise 1's. The benchmark
(bench/bench_ring.py), the tests and the committed recordings that the notebooks replay
(``python -m grader record``) use them. Grading ranks cannot import this module (see
``distlab.grading.sandbox``).

Every function runs on a rank inside an initialised process group and works on CPU (gloo)
and GPU (NCCL) tensors alike.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distlab import trace
from distlab.compat import all_gather_single, reduce_scatter_single

# Buffers at most this long are snapshotted automatically while a trace is recording, so a
# traced ring can be replayed with its values; larger ones would bloat the trace.
AUTO_SNAPSHOT_MAX_NUMEL = 1024
# On a GPU a large ring cuts each chunk into pieces of about this size that flow through the
# ring back to back (see ring_all_reduce). On the CPU it does not: every message costs about
# 0.15 ms of CPU there (bench/bench_ring.py), and the cores that would overlap the pieces are
# busy running the other ranks.
PIECE_BYTES = 4 * 1024 * 1024
MAX_PIECES = 8


def _global_rank(group: Any, group_rank: int) -> int:
    return group_rank if group is None else int(dist.get_global_rank(group, group_rank))


def ring_all_reduce(
    tensor: torch.Tensor, group: Any = None, snapshot: bool | None = None,
    pieces: int | None = None,
) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place with the ring algorithm, using only isend/irecv.

    The flat buffer is cut into n chunks (``tensor_split``: sizes may differ by one).
    Reduce-scatter: in n-1 steps each rank sends one chunk to its right neighbour and adds the
    chunk arriving from its left; afterwards rank r holds the full sum of chunk (r+1) % n.
    All-gather: in n-1 more steps those finished chunks travel around the ring. Each rank
    sends 2(n-1)/n of the buffer in total, which is why the ring is bandwidth-optimal.

    The chunk a rank receives in one step is the chunk it sends in the next, so nothing waits
    for a whole step to end: the receive of step k+1 is posted before step k is added (two
    spare buffers take turns), and a chunk is forwarded as soon as it is added. A large chunk
    can also be cut into ``pieces`` that flow through the ring one after another, so that
    piece 1 is added and forwarded while piece 2 is still on the wire (default: one piece on
    the CPU, where each extra message costs more than the overlap gains; on a GPU one per
    4 MiB, at most 8).

    With ``snapshot`` (default: when a trace is recording and the buffer is small) the buffer
    is added to the trace before the first step and after every step, for ``viz.ring_stepper``;
    a snapshotted ring moves whole chunks (one message per step).
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
    bounds = [0]
    for piece_of_buffer in chunks:
        bounds.append(bounds[-1] + piece_of_buffer.numel())
    if snapshot:
        pieces = 1
    elif pieces is None:
        chunk_bytes = chunks[0].numel() * flat.element_size()
        pieces = 1 if flat.device.type == "cpu" else max(1, min(MAX_PIECES, chunk_bytes // PIECE_BYTES))
    elif pieces < 1:
        raise ValueError(f"pieces must be at least 1, got {pieces}")
    parts = [list(chunk.tensor_split(pieces)) for chunk in chunks]  # parts[chunk][piece], views
    # Two spare buffers per piece: the receive of step k+1 is posted before step k is added,
    # so the left neighbour never waits for us to be ready.
    spare = [[torch.empty_like(p) for p in parts[0]] for _ in range(2)]
    steps = 2 * (n - 1)

    def recv_chunk(k: int) -> int:  # reduce-scatter step k adds chunk me-k-1; all-gather receives me-k'
        return (me - k - 1) % n if k < n - 1 else (me - (k - n + 1)) % n

    def send_chunk(k: int) -> int:  # our own chunk first, then whatever arrived one step before
        return me if k == 0 else recv_chunk(k - 1)

    def span(i: int) -> tuple[int, int]:  # element range [start, stop) of chunk i
        return bounds[i], bounds[i + 1]

    sends: dict[tuple[int, int], Any] = {}  # (chunk, piece) -> request still in flight

    def settle(c: int, j: int) -> None:  # the memory of (c, j) may be reused once its send is done
        if (c, j) in sends:
            sends.pop((c, j)).wait()

    def send(c: int, j: int) -> None:
        if parts[c][j].numel():
            settle(c, j)
            sends[(c, j)] = dist.isend(parts[c][j], right, group)

    def post_recv(k: int, j: int) -> tuple[Any, torch.Tensor | None]:
        # Reduce-scatter receives into a spare buffer and adds it; all-gather receives in place.
        c = recv_chunk(k)
        target = parts[c][j]
        if not target.numel():
            return None, None
        if k < n - 1:
            buf = spare[k % 2][j][: target.numel()]
            return dist.irecv(buf, left, group), buf
        settle(c, j)
        return dist.irecv(target, left, group), None

    # Receives are posted piece by piece in (step, piece) order on every rank, the order in
    # which the left neighbour sends, so each message lands in the receive meant for it.
    waiting = [post_recv(0, j) for j in range(pieces)]
    for j in range(pieces):
        send(send_chunk(0), j)
    for k in range(steps):
        c = recv_chunk(k)
        for j in range(pieces):
            request, buf = waiting[j]
            if k + 1 < steps and not snapshot:
                waiting[j] = post_recv(k + 1, j)
            if request is not None:
                request.wait()
                if buf is not None:
                    parts[c][j].add_(buf)
            if snapshot and j == pieces - 1:
                phase, step = ("reduce-scatter", k + 1) if k < n - 1 else ("all-gather", k - n + 2)
                trace.snapshot(flat, f"{phase} {step}", span(send_chunk(k)), span(c))
                if k + 1 < steps:  # only now: an all-gather receive lands in the buffer itself
                    waiting[j] = post_recv(k + 1, j)
            if k + 1 < steps:
                send(send_chunk(k + 1), j)  # the chunk just completed: send_chunk(k + 1) == c
    for request in sends.values():
        request.wait()
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
