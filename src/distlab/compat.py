"""The single-tensor collectives under whichever name the installed torch has.

torch 2.13 renamed ``all_gather_into_tensor`` to ``all_gather_single`` and
``reduce_scatter_tensor`` to ``reduce_scatter_single``, and warns on the old names; older torch
has only the old ones. The course teaches both names and runs warning-free on either.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


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
