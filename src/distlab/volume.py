"""What one torch.distributed call moves, in bytes, from the point of view of one rank.

Kept apart from the recorder (``distlab.trace``) because it is pure arithmetic on a call's
arguments: the conventions are documented there and checked in tests/test_trace.py.
``a`` is always the call's arguments by parameter name.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist

from distlab.records import P2PMessage


def nbytes(t: Any) -> int:
    """Bytes of a tensor's data (0 for anything else)."""
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _nbl(ts: Any, skip: int = -1) -> int:
    """Bytes of a list of tensors, leaving out index ``skip`` (this rank's own slot)."""
    return sum(nbytes(t) for i, t in enumerate(ts or ()) if i != skip)


def _global(group: Any, a: dict[str, Any], name: str) -> int | None:
    """The global rank named by ``src``/``dst``/``peer`` or its ``group_*`` form."""
    if a.get(name) is not None:
        return int(a[name])
    g = a.get("group_" + name)
    if g is None:
        return None
    return int(dist.get_global_rank(group or dist.group.WORLD, g))  # type: ignore[arg-type]


def _split_bytes(t: Any, splits: Any, n: int, me: int) -> int:
    """Bytes of rank ``me``'s own slice of an all_to_all_single buffer."""
    if not isinstance(t, torch.Tensor) or n == 0 or me < 0:
        return 0
    if not splits:
        return nbytes(t) // n
    return int(splits[me]) * (nbytes(t) // max(t.shape[0], 1))


def volume(op: str, a: dict[str, Any], n: int, me: int,
           my_global: int) -> tuple[int, int, int, int | None]:
    """(size, sent, recv, peer) of one call on a rank of group rank ``me`` in ``n`` ranks."""
    group = a.get("group")
    if op in ("send", "isend"):
        return nbytes(a["tensor"]), nbytes(a["tensor"]), 0, _global(group, a, "dst")
    if op in ("recv", "irecv"):
        return nbytes(a["tensor"]), 0, nbytes(a["tensor"]), _global(group, a, "src")
    if op == "all_reduce":
        s = nbytes(a["tensor"])
        v = round(2 * (n - 1) * s / n)
        return s, v, v, None
    if op == "all_reduce_coalesced":
        s = _nbl(a["tensors"])
        v = round(2 * (n - 1) * s / n)
        return s, v, v, None
    if op in ("broadcast", "reduce"):
        s, root_name = nbytes(a["tensor"]), ("src" if op == "broadcast" else "dst")
        root = _global(group, a, root_name)
        i_am_root = root == my_global
        root_moves, other_moves = (n - 1) * s, s
        if op == "broadcast":
            return s, root_moves if i_am_root else 0, 0 if i_am_root else other_moves, root
        return s, 0 if i_am_root else other_moves, root_moves if i_am_root else 0, root
    if op in ("scatter", "gather"):
        one = nbytes(a["tensor"])
        root = _global(group, a, "src" if op == "scatter" else "dst")
        i_am_root = root == my_global
        if op == "scatter":
            return n * one, (n - 1) * one if i_am_root else 0, 0 if i_am_root else one, root
        return n * one, 0 if i_am_root else one, (n - 1) * one if i_am_root else 0, root
    if op == "all_gather":
        one = nbytes(a["tensor"])
        return _nbl(a["tensor_list"]), (n - 1) * one, _nbl(a["tensor_list"], me), None
    if op in ("all_gather_single", "all_gather_into_tensor"):
        out, inp = nbytes(a["output_tensor"]), nbytes(a["input_tensor"])
        return out, (n - 1) * inp, out - inp, None
    if op == "reduce_scatter":
        return _nbl(a["input_list"]), _nbl(a["input_list"], me), (n - 1) * nbytes(a["output"]), None
    if op in ("reduce_scatter_single", "reduce_scatter_tensor"):
        out, inp = nbytes(a["output"]), nbytes(a["input"])
        return inp, inp - out, (n - 1) * out, None
    if op == "all_to_all":
        ins, outs = a["input_tensor_list"], a["output_tensor_list"]
        return _nbl(ins), _nbl(ins, me), _nbl(outs, me), None
    if op == "all_to_all_single":
        inp, out = a["input"], a["output"]
        mine_in = _split_bytes(inp, a.get("input_split_sizes"), n, me)
        mine_out = _split_bytes(out, a.get("output_split_sizes"), n, me)
        return nbytes(inp), nbytes(inp) - mine_in, nbytes(out) - mine_out, None
    return 0, 0, 0, None  # barrier, monitored_barrier, *_object (filled from inner calls)


def p2p_messages(op: str, a: dict[str, Any], peer: int | None,
                 size: int) -> list[P2PMessage]:
    """The point-to-point messages of a call: ``{"dir", "peer", "bytes", "tag"}`` each."""
    if op in ("send", "isend", "recv", "irecv"):
        d: Literal["send", "recv"] = "send" if op in ("send", "isend") else "recv"
        return [{"dir": d, "peer": peer, "bytes": size, "tag": int(a.get("tag", 0))}]
    if op != "batch_isend_irecv":
        return []
    out: list[P2PMessage] = []
    for p in a["p2p_op_list"]:
        name = getattr(p.op, "__name__", "")
        out.append({"dir": "send" if name == "isend" else "recv", "peer": int(p.peer), "bytes": nbytes(p.tensor), "tag": int(p.tag)})
    return out


def tensors(a: dict[str, Any]) -> list[torch.Tensor]:
    """Every tensor a call was given (lists flattened, P2POps opened)."""
    found: list[torch.Tensor] = []
    for v in a.values():
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, torch.Tensor))
            found.extend(p.tensor for p in v if isinstance(p, dist.P2POp))
    return found
