"""One recorder of torch.distributed calls, shared by the timeline, the benchmark and the grader.

Use it inside a rank process::

    with distlab.trace.recording() as calls:
        dist.all_reduce(t)
    calls[0]["op"], calls[0]["sent"], calls[0]["bus_bytes"]

While active, the functions in ``torch.distributed`` (and the same names in
``torch.distributed.distributed_c10d``, so ``dist.P2POp(dist.isend, ...)`` keeps working)
are replaced by recording wrappers; they are restored on exit, even after an exception.
Patching happens at module-attribute level: code that ran ``from torch.distributed import
all_reduce`` *before* recording began holds the original function and is not recorded.

Every call appends one record (a dict of plain Python values, so it pickles and travels
back to the kernel):

- ``op``, ``seq``, ``rank`` (global), ``group_ranks``, ``group_size``
- ``shapes``, ``dtypes`` of every tensor argument
- ``size``: the message size as nccl-tests defines it (all_gather: the whole output,
  reduce_scatter and all_to_all: the whole input, others: the tensor)
- ``bus_bytes``: ``size`` times the nccl-tests bus factor - the bytes each rank moves in a
  bandwidth-optimal algorithm (all_reduce 2(n-1)/n, reduce_scatter/all_gather/all_to_all
  (n-1)/n, broadcast/reduce 1)
- ``sent``, ``recv``: the logical bytes this rank's data gives to / gets from other ranks
  (broadcast root sends (n-1)*size, reduce root receives (n-1)*size, all_reduce counts as
  reduce_scatter + all_gather); summed over ranks, sent == recv
- ``peer`` (global src/dst/root or None), ``p2p``: list of ``{"dir", "peer", "bytes", "tag"}``
- ``async``, ``t_start``/``t_end`` (time.perf_counter, comparable across processes on one
  host), ``wall_start``/``wall_end`` (time.time), ``t_wait`` (perf_counter when the last
  ``wait()`` on a returned request finished, else None), ``reduce_op``, ``error`` (the
  exception the call raised, else None), and ``note`` when the recorder could not read
  the arguments (the call still goes to torch, which raises its own error)
- ``op == "snapshot"`` records (see ``snapshot``) carry a buffer's values for replays

Calls made by torch itself inside a recorded call (broadcast_object_list calls broadcast)
are not recorded twice; the ``*_object`` variants add up the bytes of those inner calls.
Async calls return a ``TracedWork`` that forwards everything to torch's request (so
``isinstance(req, dist.Work)`` is False while recording). The recorder's work is about 20 us of
CPU per call, but right after a collective the caches are cold and it takes five times that, so
blocking gloo collectives are issued async and described while gloo works, then waited for: a
traced 1 MB all_reduce on 2 ranks takes 0-5% longer than an untraced one
(bench/bench_trace_overhead.py).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distlab.costmodel import bus_factor
from distlab.records import CallRecord
from distlab.volume import p2p_messages, tensors, volume

TENSOR_OPS = (
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "broadcast", "scatter", "gather",
    "reduce", "all_reduce", "all_gather", "all_gather_single", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "all_reduce_coalesced",
)
OBJECT_OPS = (
    "broadcast_object_list", "scatter_object_list", "gather_object", "all_gather_object",
    "send_object_list", "recv_object_list",
)

# Blocking collectives that gloo runs on its own threads: the recorder issues them with
# async_op=True, describes the call while gloo works, then waits, so its bookkeeping does not add
# to the call. (Right after a collective the CPU caches are cold: describing a call then costs
# about 120 us instead of 20 us, which made a traced 1 MB all_reduce 10% slower on 2 ranks.)
_OVERLAPPED = frozenset((
    "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_single", "all_gather_into_tensor",
    "gather", "scatter", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "barrier",
))

_REDUCING = ("reduce", "all_reduce", "reduce_scatter", "reduce_scatter_single",
             "reduce_scatter_tensor", "all_reduce_coalesced")

_sinks: list[list[CallRecord]] = []
_originals: dict[str, Callable[..., Any]] = {}
_wrappers: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}  # name -> (orig, traced)
_dtype_names: dict[torch.dtype, str] = {}  # small caches: the recorder runs on every call
_factors: dict[tuple[str, int], float] = {}
_reduce_names: dict[Any, str] = {}
# id(group) -> (group, its global ranks, my group rank, my global rank, is it a gloo group)
_groups: dict[int, tuple[Any, list[int], int, int, bool]] = {}
_lock = threading.Lock()
_local = threading.local()
_seq = itertools.count()


class TracedWork:
    """A request handle that notes when ``wait()`` returned; everything else is forwarded."""

    __slots__ = ("_record", "_work")

    def __init__(self, work: Any, record: CallRecord) -> None:
        self._work = work
        self._record = record

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        _device_done()
        now = time.perf_counter()
        prev = self._record["t_wait"]
        self._record["t_wait"] = now if prev is None else max(prev, now)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _group_info(group: Any) -> tuple[list[int], int, int]:
    """(global ranks of the group, this rank's group rank, this rank's global rank), cached:
    asking torch costs microseconds per call, and the recorder must stay cheap."""
    hit = _group_entry(group)
    return hit[1], hit[2], hit[3]


def _group_entry(group: Any) -> tuple[Any, list[int], int, int, bool]:
    pg = group or dist.group.WORLD
    hit = _groups.get(id(pg))
    if hit is None or hit[0] is not pg:
        ranks = list(dist.get_process_group_ranks(pg))  # type: ignore[arg-type]
        on_gloo = str(dist.get_backend(pg)) == "gloo"  # type: ignore[arg-type]
        hit = _groups[id(pg)] = (pg, ranks, dist.get_rank(group), dist.get_rank(), on_gloo)
    return hit


def _dtype_name(dtype: torch.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).replace("torch.", "")
    return name


def _reduce_name(red: Any) -> str:
    try:
        name = _reduce_names.get(red)
    except TypeError:  # an unhashable op object (premul_sum): name it every time
        return str(getattr(red, "name", None) or red)
    if name is None:
        name = _reduce_names[red] = str(getattr(red, "name", None) or red)
    return name


def _factor(op: str, n: int) -> float:
    f = _factors.get((op, n))
    if f is None:
        f = _factors[(op, n)] = bus_factor(op, n)
    return f


def _describe(op: str, names: list[str], args: Any, kwargs: Any) -> CallRecord:
    a = dict(zip(names, args, strict=False))  # bind by name, without inspect.bind (slow)
    a.update(kwargs)
    group = a.get("group")
    if op == "batch_isend_irecv" and a.get("p2p_op_list"):
        group = a["p2p_op_list"][0].group
    ranks, me, my_global = _group_info(group)
    n = len(ranks)
    size, sent, recv, peer = volume(op, a, n, me, my_global)
    p2p = p2p_messages(op, a, peer, size)
    if op == "batch_isend_irecv":
        sent = sum(p["bytes"] for p in p2p if p["dir"] == "send")
        recv = sum(p["bytes"] for p in p2p if p["dir"] == "recv")
        size = sent + recv
    ts = tensors(a)
    red = a.get("op", dist.ReduceOp.SUM) if op in _REDUCING else None
    is_async = bool(a.get("async_op", False)) or op in ("isend", "irecv", "batch_isend_irecv")
    return {
        "op": op, "seq": next(_seq), "rank": my_global, "group_ranks": ranks,
        "group_size": n, "shapes": [list(t.shape) for t in ts],
        "dtypes": [_dtype_name(t.dtype) for t in ts], "size": size,
        "bus_bytes": size * _factor(op, n), "sent": sent, "recv": recv, "peer": peer,
        "p2p": p2p, "async": is_async,
        "reduce_op": None if red is None else _reduce_name(red),
        "t_start": 0.0, "t_end": 0.0, "wall_start": 0.0, "wall_end": 0.0, "t_wait": None,
        "error": None,
    }


def _safe_describe(op: str, names: list[str], args: Any, kwargs: Any) -> CallRecord:
    """Describe a call; arguments the recorder cannot read (a call torch will reject, or an
    API it does not know) still give a record, with zero bytes and a ``note``, and the call
    goes ahead: torch, not the recorder, decides whether it fails."""
    try:
        return _describe(op, names, args, kwargs)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as exc:
        ranks, _, me = _group_info(None)
        return {"op": op, "seq": next(_seq), "rank": me, "group_ranks": ranks,
                "group_size": len(ranks), "shapes": [], "dtypes": [], "size": 0,
                "bus_bytes": 0.0, "sent": 0, "recv": 0, "peer": None, "p2p": [],
                "async": False, "reduce_op": None, "t_start": 0.0, "t_end": 0.0,
                "wall_start": 0.0, "wall_end": 0.0, "t_wait": None, "error": None,
                "note": f"arguments not understood by the recorder: {type(exc).__name__}: {exc}"}


def _add_inner(outer: CallRecord, inner: CallRecord) -> None:
    for key in ("size", "sent", "recv", "bus_bytes"):
        outer[key] += inner[key]
    outer["p2p"].extend(inner["p2p"])
    if outer["peer"] is None and inner["peer"] is not None:
        outer["peer"] = inner["peer"]


# batch_isend_irecv passes group_dst when ``p2p_op.op is isend`` and group_src otherwise; a
# P2POp built with the function of the other side of a recording boundary would get the
# wrong key, so the wrappers accept either.
_PEER_FIX = {"isend": ("group_src", "group_dst"), "irecv": ("group_dst", "group_src")}


def _retarget(ops: Any) -> None:
    """Point P2POps built before recording began at the functions installed now."""
    for p in ops:
        name = getattr(p.op, "__name__", "")
        if name in ("isend", "irecv") and getattr(c10d, name) is not p.op:
            p.op = getattr(c10d, name)


def _record(op: str, names: list[str], args: Any, kwargs: Any, stack: list[Any]) -> CallRecord:
    """Describe a call, hand the record to every active recording and mark it as running."""
    rec = _safe_describe(op, names, args, kwargs)
    for sink in _sinks:
        sink.append(rec)
    stack.append(rec)
    return rec


_NOT_OVERLAPPED = object()


def _overlapped_call(op: str, fn: Callable[..., Any], names: list[str], where: tuple[int, int],
                     args: Any, kwargs: Any, stack: list[Any]) -> Any:
    """A blocking gloo collective, issued as an async one and described while it runs.

    ``where`` holds the positions of the ``async_op`` and ``group`` parameters. Returns
    ``_NOT_OVERLAPPED`` (and calls nothing) for a call that is async already or goes to a
    non-gloo group; the caller then records it the ordinary way. The call itself means the
    same: torch's blocking path is "issue, then wait", and gloo ignores the flag.
    """
    async_at, group_at = where
    positional = async_at < len(args)
    if args[async_at] if positional else kwargs.get("async_op", False):
        return _NOT_OVERLAPPED
    try:
        if not _group_entry(args[group_at] if group_at < len(args) else kwargs.get("group"))[4]:
            return _NOT_OVERLAPPED
    except (ValueError, TypeError, RuntimeError, AttributeError, KeyError):  # not a group torch knows: torch says so
        return _NOT_OVERLAPPED
    if positional:
        call_args, call_kwargs = (*args[:async_at], True, *args[async_at + 1:]), kwargs
    else:
        call_args, call_kwargs = args, {**kwargs, "async_op": True}
    stack.append({"op": op})  # calls torch makes while issuing this one are not recorded twice
    wall_start, t_start = time.time(), time.perf_counter()
    try:
        work = fn(*call_args, **call_kwargs)
        error = None
    except BaseException as exc:
        work, error = None, exc
    stack.pop()
    rec = _record(op, names, args, kwargs, stack)  # while gloo moves the data
    rec["wall_start"], rec["t_start"] = wall_start, t_start
    try:
        if error is not None:
            raise error
        # None: this rank is not in the group; an _IllegalWork: the call was queued in a
        # coalescing block and has nothing to wait for
        if work is not None and type(work).__name__ != "_IllegalWork":
            work.wait()
    except BaseException as exc:
        _close(rec, stack, exc)
        raise
    _close(rec, stack)
    return None


def _device_done() -> None:
    """NCCL returns as soon as the work is queued on a CUDA stream (and ``wait()`` makes only the
    stream wait): let the device finish before reading the clock, or the timeline shows the launch,
    not the transfer. Free on a CPU-only rank, where CUDA is never initialised."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _close(rec: CallRecord, stack: list[Any], error: BaseException | None = None) -> None:
    """The call has returned (or raised ``error``): stamp its end and leave it."""
    if error is not None:
        rec["error"] = f"{type(error).__name__}: {error}"
    elif not rec.get("async"):  # an async call ends at its wait(): TracedWork synchronises there
        _device_done()
    rec["t_end"], rec["wall_end"] = time.perf_counter(), time.time()
    stack.pop()


def _wrap(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    names = list(inspect.signature(fn).parameters)
    overlap = (names.index("async_op"), names.index("group")) if op in _OVERLAPPED else None

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        if op in _PEER_FIX:  # batch_isend_irecv chose the key by identity of op.op
            wrong, right = _PEER_FIX[op]
            if wrong in kwargs:
                kwargs[right] = kwargs.pop(wrong)
        elif op == "batch_isend_irecv":
            _retarget(args[0] if args else kwargs.get("p2p_op_list", []))
        if not _sinks or not dist.is_initialized():
            return fn(*args, **kwargs)
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        if stack:  # a call torch makes inside a recorded call
            if stack[-1]["op"] in OBJECT_OPS:
                _add_inner(stack[-1], _safe_describe(op, names, args, kwargs))
            return fn(*args, **kwargs)
        if overlap is not None:
            overlapped = _overlapped_call(op, fn, names, overlap, args, kwargs, stack)
            if overlapped is not _NOT_OVERLAPPED:
                return overlapped
        rec = _record(op, names, args, kwargs, stack)
        rec["wall_start"], rec["t_start"] = time.time(), time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _close(rec, stack, exc)
            raise
        _close(rec, stack)
        if op == "recv" and rec["peer"] is None and isinstance(result, int):
            rec["peer"] = rec["p2p"][0]["peer"] = result
        if isinstance(result, list) and op == "batch_isend_irecv":
            return [TracedWork(w, rec) for w in result]
        if result is not None and hasattr(result, "wait"):
            return TracedWork(result, rec)
        return result

    traced.__wrapped_by_distlab__ = True  # type: ignore[attr-defined]
    return traced


def _install() -> None:
    for name in TENSOR_OPS + OBJECT_OPS:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "__wrapped_by_distlab__", False):
            continue
        _originals[name] = fn
        cached = _wrappers.get(name)
        if cached is None or cached[0] is not fn:  # build each wrapper once per process
            cached = _wrappers[name] = (fn, _wrap(name, fn))
        traced = cached[1]
        setattr(dist, name, traced)
        if getattr(c10d, name, None) is fn:
            setattr(c10d, name, traced)


def _uninstall() -> None:
    _groups.clear()
    for name, fn in _originals.items():
        if getattr(c10d, name, None) is getattr(dist, name, None):
            setattr(c10d, name, fn)
        setattr(dist, name, fn)
    _originals.clear()


@contextmanager
def recording() -> Iterator[list[CallRecord]]:
    """Record every torch.distributed call made in this process while the block runs.

    Yields the list the records are appended to. Recordings nest: an inner one sees only
    its own calls, the outer one sees all of them.
    """
    sink: list[CallRecord] = []
    with _lock:
        if not _sinks:
            _install()
        _sinks.append(sink)
    try:
        yield sink
    finally:
        with _lock:
            _sinks[:] = [s for s in _sinks if s is not sink]
            if not _sinks:
                _uninstall()


def is_recording() -> bool:
    """True while a ``recording()`` block is active in this process."""
    return bool(_sinks)


def snapshot(tensor: Any, label: str = "", sent: tuple[int, int] | None = None,
             received: tuple[int, int] | None = None) -> None:
    """Add the current values of ``tensor`` to the active recordings (no-op otherwise).

    A ring algorithm calls this after each step so ``viz.ring_stepper`` can replay what
    every rank's buffer held; ``sent``/``received`` optionally name the element ranges
    [start, stop) of the chunks this step moved. The record has ``op == "snapshot"``.
    """
    if not _sinks:
        return
    values = tensor.detach().cpu().tolist() if isinstance(tensor, torch.Tensor) else list(tensor)
    now = time.perf_counter()
    rank = dist.get_rank() if dist.is_initialized() else 0
    rec: CallRecord = {"op": "snapshot", "seq": next(_seq), "rank": rank, "label": label, "values": values,
           "t_start": now, "t_end": now, "size": 0, "sent": 0, "recv": 0, "bus_bytes": 0.0,
           "p2p": [], "peer": None,
           "sent_range": list(sent) if sent else None,
           "recv_range": list(received) if received else None}
    for sink in _sinks:
        sink.append(rec)
