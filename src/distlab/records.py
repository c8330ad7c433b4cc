"""The shape of one recorded torch.distributed call: the value the recorder writes and the
timeline, the table, the replay, the benchmark and the grader read.

Why a TypedDict and not a class: records cross from the ranks to the kernel (and into graders) by
pickle, and plain dicts of plain values unpickle anywhere, even where distlab is a different
version. The type makes every reader's keys checked (``make lint`` runs mypy) without changing
what travels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Literal, TypedDict


class P2PMessage(TypedDict):
    """One point-to-point message inside a call (send, recv, or one op of a batch)."""

    dir: Literal["send", "recv"]
    peer: int | None  # global rank; None for a recv from any source before it returned
    bytes: int
    tag: int


_Call = TypedDict("_Call", {  # noqa: UP013 - the functional form: a key below is "async"
    "op": str,
    "seq": int,
    "rank": int,  # global rank of the caller
    "size": int,  # message size as nccl-tests defines it
    "sent": int,  # logical bytes this rank's data gives to other ranks
    "recv": int,  # ... and gets from them
    "bus_bytes": float,  # size times the nccl-tests bus factor
    "peer": int | None,
    "p2p": list[P2PMessage],
    "t_start": float,  # time.perf_counter()
    "t_end": float,
})

_Details = TypedDict("_Details", {  # noqa: UP013
    "async": bool,
    "group_ranks": list[int],
    "group_size": int,
    "shapes": list[list[int]],
    "dtypes": list[str],
    "reduce_op": str | None,
    "wall_start": float,
    "wall_end": float,
    "t_wait": float | None,  # when the last wait() on its request returned (async calls)
    "error": str | None,
    "note": str,  # the recorder could not read the arguments
    "label": str,  # snapshot: what the step was
    "values": list[float],  # snapshot: the buffer's values
    "sent_range": list[int] | None,
    "recv_range": list[int] | None,
}, total=False)


class CallRecord(_Call, _Details):
    """A call's record. Snapshots (``op == "snapshot"``) carry ``label`` and ``values`` and no
    call details; ``distlab.trace`` says what each field means."""


Trace = Sequence[Sequence[CallRecord]]  # one list of records per rank, in rank order


def messages(records: Iterable[CallRecord]) -> Iterator[tuple[CallRecord, P2PMessage]]:
    """Every point-to-point message in one rank's records, with the call that carried it: the one
    reader of ``p2p`` for the timeline's arrows and the ring replay."""
    for record in records:  # read leniently: a trace may come from a file an older kit wrote
        if record.get("op") != "snapshot":
            for message in record.get("p2p", ()):
                yield record, message
