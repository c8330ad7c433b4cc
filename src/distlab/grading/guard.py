"""Rank side: see every communication a submission makes, however it reaches the wire.

Runs inside a grading rank, installed *before* the submission's source is executed, so any
reference the submission captures is already watched. Three channels, because each one alone
can be sidestepped from Python:

- dispatcher: a ``TorchDispatchMode`` sees every ``c10d`` operator (``dist.all_reduce``,
  ``dist.group.WORLD.allreduce(...)`` and ``torch.ops.c10d.allreduce_`` all end up there);
- backend/store: the Python methods of ``Backend`` (``ProcessGroupGloo``) and ``Store`` are
  wrapped, so calling a backend directly or passing data through the rendezvous store shows up;
- python: ``distlab.trace.recording()``, the project's recorder of ``torch.distributed`` calls
  (names as the learner wrote them, ``all_reduce`` rather than ``allreduce_``).

After each watched call the guard checks that its hooks are still in place; a submission that
removed them gets a violation, not a pass. It also counts, in C++, what every process group
did: each backend numbers its operations (``_get_sequence_number_for_group``), and each
recorded operation notes how far the numbers moved while it ran. Numbers that moved outside
any recorded operation mean communication went around the recorder (dispatch modes disabled,
another thread, a record removed), which is a violation too. The records are plain Python values, so they travel
back to the trusted grader without unpickling anything the submission could have built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

_C10D = torch._C._distributed_c10d
# taken before any submission runs; a torch without it leaves this check out
_SEQUENCE: Callable[[Any], int] | None = getattr(_C10D.ProcessGroup, "_get_sequence_number_for_group", None)
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_dtensor")
_NEUTRAL_OPS = {"wait_tensor"}
_P2P_OPS = {"send", "recv_", "recv_any_source_"}  # functional collectives' wait: not a communication of its own


def _sequence_numbers() -> dict[int, int]:
    """How many operations each process group of this rank has run so far (C++ counters)."""
    from torch.distributed.distributed_c10d import _world

    numbers: dict[int, int] = {}
    if _SEQUENCE is None:
        return numbers
    for group in list(_world.pg_map):
        try:
            numbers[id(group)] = int(_SEQUENCE(group))
        except Exception:  # noqa: BLE001 - a group being torn down counts nothing
            continue
    return numbers


def _moved(before: dict[int, int], after: dict[int, int]) -> int:
    """Operations run between two readings of ``_sequence_numbers`` (a new group starts at 0)."""
    return sum(max(0, number - before.get(group, 0)) for group, number in after.items())


def _numel(value: Any) -> int:
    """Elements in a tensor or a (nested) list of tensors; 0 for anything else."""
    if isinstance(value, torch.Tensor):
        return int(value.numel())
    if isinstance(value, (list, tuple)):
        return sum(_numel(v) for v in value)
    return 0


class _Recorder(TorchDispatchMode):
    """Appends one record per collective operator dispatched while active."""

    def __init__(self, sink: list[dict[str, Any]]) -> None:
        super().__init__()
        self.sink = sink

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in dynamo.disable, importing torch._dynamo
        # (~800 modules, seconds of CPU per rank) on the first operator; nothing here compiles
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        namespace = getattr(func, "namespace", "")
        if namespace in _COLLECTIVE_NAMESPACES:
            name = func._schema.name.split("::", 1)[-1]
            if name not in _NEUTRAL_OPS:
                # c10d ops take (outputs, inputs, ...) for gathers and scatters, (tensors, ...) otherwise
                out = _numel(args[0]) if args else 0
                inp = _numel(args[1]) if len(args) > 1 else 0
                entry: dict[str, Any] = {"via": "dispatch", "op": name, "out": out, "in": inp, "seq": 0}
                if name in _P2P_OPS and len(args) > 2 and isinstance(args[2], int):
                    entry["peer"] = args[2]  # send/recv_: (tensors, group, peer rank in the group, tag)
                self.sink.append(entry)
                before = _sequence_numbers()
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    entry["seq"] = _moved(before, _sequence_numbers())
        return func(*args, **(kwargs or {}))


# methods that move data between ranks, by the base class that defines them
_BACKEND_METHODS = (
    "broadcast", "allreduce", "allreduce_coalesced", "reduce", "allgather", "_allgather_base",
    "allgather_coalesced", "gather", "scatter", "reduce_scatter", "_reduce_scatter_base",
    "alltoall_base", "alltoall", "send", "recv", "recv_anysource", "barrier", "monitored_barrier",
)
_STORE_METHODS = (
    "set", "get", "add", "compare_set", "append", "multi_get", "multi_set", "queue_push", "queue_pop",
)


def _hook_targets() -> list[tuple[type, str, str]]:
    """(class, method, label) for every data-moving method of c10d's backend and store classes."""
    targets = []
    for base, names, label in ((_C10D.Backend, _BACKEND_METHODS, "backend"),
                               (_C10D.Store, _STORE_METHODS, "store")):
        for attr in dir(_C10D):
            cls = getattr(_C10D, attr)
            if isinstance(cls, type) and issubclass(cls, base):
                targets += [(cls, name, label) for name in names
                            if type(vars(cls).get(name)).__name__ == "instancemethod"]
    return targets


class CommGuard:
    """One per rank process (see ``install``), set up before the submission runs; ``watch()`` each call."""

    def __init__(self) -> None:
        self._armed: list[dict[str, Any]] | None = None
        self._hooks: list[tuple[type, str, Callable[..., Any]]] = []
        for cls, name, label in _hook_targets():
            wrapper = self._wrap(f"{label}.{name}", vars(cls)[name])
            setattr(cls, name, wrapper)
            self._hooks.append((cls, name, wrapper))

    def _wrap(self, label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        guard = self

        def watched(*args: Any, **kwargs: Any) -> Any:
            if guard._armed is None:
                return original(*args, **kwargs)
            entry = {"via": label.split(".", 1)[0], "op": label, "out": 0, "in": 0, "seq": 0}
            guard._armed.append(entry)
            before = _sequence_numbers()
            try:
                return original(*args, **kwargs)
            finally:
                entry["seq"] = _moved(before, _sequence_numbers())

        return watched

    @contextmanager
    def watch(self) -> Iterator[dict[str, list[Any]]]:
        """Record the communication of the enclosed code: ``{"ops": [...], "violations": [...]}``.

        ``ops`` holds dicts ``{"via", "op", "out", "in"}`` (``out``/``in``: elements in the first
        and second tensor arguments); ``violations`` lists hooks the code removed.
        """
        log: dict[str, list[Any]] = {"ops": [], "violations": []}
        recorder = _Recorder(log["ops"])
        with _python_recording() as python_calls:
            self._armed = log["ops"]
            start = _sequence_numbers()
            recorder.__enter__()
            try:
                yield log
            finally:
                self._armed = None
                stack = _get_current_dispatch_mode_stack()
                if stack and stack[-1] is recorder:
                    recorder.__exit__(None, None, None)
                else:  # popped, or buried under a mode of the submission's own
                    log["violations"].append("the dispatch recorder was removed")
                log["violations"].extend(self._replaced_hooks())
                unseen = _moved(start, _sequence_numbers()) - sum(
                    int(e.get("seq") or 0) for e in log["ops"] if isinstance(e, dict))
                if unseen > 0:
                    log["violations"].append(f"{unseen} communication(s) went around the recorder")
        for call in python_calls:
            log["ops"].append({"via": "python", "op": str(call.get("op", "?")), "out": 0, "in": 0})

    def _replaced_hooks(self) -> list[str]:
        return [f"{cls.__name__}.{name} was replaced" for cls, name, wrapper in self._hooks
                if vars(cls).get(name) is not wrapper]


@contextmanager
def _python_recording() -> Iterator[list[Any]]:
    """``distlab.trace.recording()`` when it is available; an empty list otherwise."""
    try:
        from distlab.trace import recording
    except ImportError:  # the recorder is optional for grading: the dispatcher channel decides
        yield []
        return
    with recording() as calls:
        yield calls


_INSTALLED: CommGuard | None = None


def install() -> CommGuard:
    """The rank's guard, created on first use (hooks must never be stacked twice)."""
    global _INSTALLED
    if _INSTALLED is None:
        _INSTALLED = CommGuard()
    return _INSTALLED
