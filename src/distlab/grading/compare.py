"""Trusted side: rebuild tensors from rank records and compare them with the reference.

Comparisons use torch.equal / torch.allclose in the grading process on tensors built here from
bytes, so nothing the submission defines (an always-true ``__eq__``, a tensor subclass, a patched
torch) takes part. Every problem comes back as a sentence for the student.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

_DTYPES = {name: getattr(torch, name) for name in (
    "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")}
SHOWN = 8  # values shown per tensor in feedback

# c10d operator names (dispatcher) and torch.distributed names (python), by the collective they are
_FAMILIES = {
    "reduce_scatter": {"reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_",
                       "reduce_scatter_tensor", "reduce_scatter", "reduce_scatter_single"},
    "all_gather": {"allgather_", "_allgather_base_", "allgather_coalesced_",
                   "allgather_into_tensor_coalesced_", "all_gather_into_tensor", "all_gather",
                   "all_gather_single"},
}
_READABLE = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce_coalesced", "reduce_": "reduce",
    "broadcast_": "broadcast", "recv_": "recv", "recv_any_source_": "recv", "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all_single", "gather_": "gather", "scatter_": "scatter",
    "monitored_barrier_": "monitored_barrier",
}


def record(records: Any, rank: int, index: int) -> dict[str, Any] | None:
    """records[rank][index] if the rank sent a well-formed list of dicts, else None."""
    if not isinstance(records, list) or rank >= len(records):
        return None
    per_rank = records[rank]
    if not isinstance(per_rank, list) or index >= len(per_rank) or not isinstance(per_rank[index], dict):
        return None
    return per_rank[index]


def first_problem(batch: Any, records: Any,
                  check: Callable[[Any, int, dict[str, Any]], str | None]) -> str | None:
    """Every case of the batch, every rank in order: the first problem ``check`` finds in a rank's
    record, named with the case and the rank (a missing record is a problem too)."""
    ws = batch.world_size
    for index, case in enumerate(batch.cases):
        for rank in range(ws):
            found = record(records, rank, index)
            problem = "sent back no result" if found is None else check(case, rank, found)
            if problem:
                return f"{case.describe(ws)}: rank {rank} {problem}"
    return None


def rebuild(data: Any) -> torch.Tensor | str:
    """A tensor from a harness.tensor_record dict, or the reason it is not a plain tensor."""
    if not isinstance(data, dict):
        return "sent back no tensor"
    kind = data.get("type")
    if kind != "torch.Tensor":
        return (f"left a {kind} instead of a torch.Tensor in `tensor`"
                if isinstance(kind, str) else "sent back no tensor")
    dtype, shape, raw = data.get("dtype"), data.get("shape"), data.get("data")
    if (dtype not in _DTYPES or not isinstance(shape, list) or not isinstance(raw, bytes)
            or not all(isinstance(s, int) and s >= 0 for s in shape)):
        return "sent back a malformed tensor"
    torch_dtype = _DTYPES[dtype]
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    if len(raw) != numel * itemsize:
        return "sent back a malformed tensor"
    if numel == 0:
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(torch_dtype).reshape(shape).clone()


def show(t: torch.Tensor) -> str:
    flat = t.reshape(-1).tolist()
    head = ", ".join(_number(v) for v in flat[:SHOWN])
    return f"[{head}{', ...' if len(flat) > SHOWN else ''}]"


def _number(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def tensor_problem(data: Any, want: torch.Tensor, exact: bool,
                   original: torch.Tensor | None = None) -> str | None:
    """None when the rank's tensor equals ``want`` (exactly, or to float tolerance)."""
    got = rebuild(data)
    if isinstance(got, str):
        return got
    if got.dtype != want.dtype:
        return f"got dtype {got.dtype}, expected {want.dtype} (the result must keep the tensor's dtype)"
    if tuple(got.shape) != tuple(want.shape):
        return f"got shape {tuple(got.shape)}, expected {tuple(want.shape)} (the result must keep its shape)"
    if exact or not want.is_floating_point():
        same = torch.equal(got, want)
    else:
        tol = 1e-5 if want.dtype == torch.float32 else 1e-10
        same = bool(torch.allclose(got, want, rtol=tol, atol=tol))
    if same:
        return None
    text = f"got {show(got)}, expected {show(want)}"
    wrong = (got != want).reshape(-1).nonzero()
    if wrong.numel():
        text += f" (first difference at flat index {int(wrong[0])})"
    if original is not None and torch.equal(got, original) and not torch.equal(original, want):
        text += ("; the tensor was not changed: write the result into `tensor` in place, "
                 "like dist.all_reduce")
    return text


def family(op: str) -> str | None:
    for name, members in _FAMILIES.items():
        if op in members:
            return name
    return None


def readable(entry: dict[str, Any]) -> str:
    op, via = str(entry.get("op")), entry.get("via")
    if via == "backend":
        return f"the process group backend directly ({op.split('.', 1)[-1]})"
    if via == "store":
        return f"the rendezvous store ({op.split('.', 1)[-1]})"
    return _READABLE.get(op, op)


def log_entries(rec: dict[str, Any]) -> list[dict[str, Any]] | str:
    """The entries of one rank's communication log, or what is wrong with the log."""
    ops, violations = rec.get("ops"), rec.get("violations")
    if not isinstance(ops, list) or not isinstance(violations, list):
        return "sent back no communication record"
    if violations:
        return "tampered with the grader's communication recorder: " + "; ".join(map(str, violations[:3]))
    return [e for e in ops if isinstance(e, dict)]


_P2P_PYTHON = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})


def p2p_messages(rec: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | str:
    """(sends, receives) of a rank allowed only point-to-point calls, in call order, or what is
    wrong: a bad log, or any other communication (a collective, the backend or the store)."""
    entries = log_entries(rec)
    if isinstance(entries, str):
        return entries
    other = sorted({readable(e) for e in entries
                    if (e.get("via") == "dispatch" and e.get("op") not in ("send", "recv_"))
                    or e.get("via") in ("backend", "store")
                    or (e.get("via") == "python" and e.get("op") not in _P2P_PYTHON)})
    if other:
        return f"used {', '.join(other)}; only send/recv (isend/irecv) are allowed here"
    sends = [e for e in entries if e.get("via") == "dispatch" and e.get("op") == "send"]
    recvs = [e for e in entries if e.get("via") == "dispatch" and e.get("op") == "recv_"]
    return sends, recvs


def only_point_to_point(rec: dict[str, Any]) -> str | None:
    """The communication rule of the exercises built from send/recv (ex2-ex4)."""
    found = p2p_messages(rec)
    return found if isinstance(found, str) else None


def comm_problem(rec: dict[str, Any], allowed: Sequence[str], required: Sequence[str],
                 limit_elements: int | None = None) -> str | None:
    """Check one rank's communication log against the collectives the exercise allows."""
    entries = log_entries(rec)
    if isinstance(entries, str):
        return entries
    forbidden = sorted({readable(e) for e in entries if family(str(e.get("op"))) not in allowed})
    if forbidden:
        return (f"used {', '.join(forbidden)}; only {' and '.join(allowed)} are allowed here")
    seen = {family(str(e.get("op"))) for e in entries if e.get("via") == "dispatch"}
    missing = [name for name in required if name not in seen]
    if missing:
        return f"never called {' or '.join(missing)}"
    if limit_elements is not None:
        for name, key in (("reduce_scatter", "in"), ("all_gather", "out")):
            moved = sum(int(e.get(key) or 0) for e in entries
                        if e.get("via") == "dispatch" and family(str(e.get("op"))) == name)
            if moved > limit_elements:
                return (f"passed {moved} elements through {name}, more than {limit_elements}: each rank "
                        f"should reduce and gather one chunk of the (padded) tensor, not whole copies")
    return None
