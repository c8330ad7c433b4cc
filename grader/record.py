"""``python -m grader record``: the traced runs the notebooks replay, recorded from the references.

Notebook 09 steps through a ring all_reduce before exercise 2 asks the learner to write one, so
the notebook replays a recording of the instructor's ring (``distlab.replay.recording``) instead
of importing an implementation. The recording is data: every rank's calls, bytes and buffer
after each step, as ``%%dist --trace`` records them. Rerun this after changing the reference;
tests/test_no_answers.py checks that the committed file still matches a fresh recording.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cloudpickle

import distlab
from distlab.replay import RECORDINGS
from grader import reference

cloudpickle.register_pickle_by_value(reference)  # ranks need not find the grader on their path

RING_WORLD = 4
RING_NUMEL = 8


def _ring_on_rank() -> list[float]:
    import torch
    import torch.distributed as dist

    buf = torch.arange(float(RING_NUMEL)) + 10 * dist.get_rank()  # (8,), the input notebook 09 uses
    reference.ring_all_reduce(buf, snapshot=True)
    return buf.tolist()


_VOLATILE = ("t_start", "t_end", "t_wait", "wall_start", "wall_end", "seq")


def _stable(record: Mapping[str, Any]) -> dict[str, Any]:
    """A trace record without clock readings, so two recordings of one run compare equal."""
    return {k: v for k, v in record.items() if k not in _VOLATILE}


def record_ring() -> list[list[dict[str, Any]]]:
    result = distlab.run(_ring_on_rank, world_size=RING_WORLD, trace=True)
    assert result.trace is not None
    return [[_stable(r) for r in rank] for rank in result.trace]


def write(folder: Path = RECORDINGS) -> list[Path]:
    path = folder / f"ring_all_reduce_{RING_WORLD}ranks.json"
    path.write_text(json.dumps(record_ring(), indent=None, separators=(",", ":")) + "\n")
    return [path]


def main() -> int:
    for path in write():
        print(f"wrote {path}")
    return 0
