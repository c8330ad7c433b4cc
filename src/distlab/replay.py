"""Replay a traced ring algorithm step by step: who sent which chunk to whom, and what every
rank's buffer held afterwards.

The input is the learner's own run: the per-rank trace (``distlab.run(..., trace=True)`` or
``%%dist --trace``) of a ring that called ``distlab.trace.snapshot(buffer)`` before its
first step and after each step (the instructor's reference ring does so for small buffers
while a trace is recording; ``recording(name)`` loads a committed run of it). Messages between two snapshots belong to one step; the chunks
are the element ranges the snapshot names, or else the cells that changed on the receiving
rank, so any world size and uneven chunks work. Without snapshots the k-th send of every rank is step k and no values show.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distlab.i18n import tr
from distlab.records import CallRecord, messages

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def recording(name: str) -> list[list[CallRecord]]:
    """A committed per-rank trace (``recordings/<name>.json``), made by ``python -m grader record``.

    Notebooks replay these where running the code would hand over an exercise's answer.
    """
    path = RECORDINGS / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in RECORDINGS.glob("*.json"))
        raise FileNotFoundError(f"no recording {name!r}; known: {', '.join(known) or 'none'}")
    with open(path, encoding="utf-8") as handle:
        traces: list[list[CallRecord]] = json.load(handle)
    return traces


@dataclass
class Frame:
    """One step: its label, each rank's buffer after it (None if unknown), the messages sent
    during it (``{"src", "dst", "bytes"}``) and, per rank, the indices of the chunk it sent
    and of the chunk it received (from the snapshot's ranges, else the cells that changed)."""

    label: str
    buffers: list[list[Any] | None]
    messages: list[dict[str, Any]] = field(default_factory=list)
    sent: list[set[int]] = field(default_factory=list)
    received: list[set[int]] = field(default_factory=list)


def _traces_of(source: Any) -> list[list[CallRecord]]:
    traces = getattr(source, "trace", source)
    if traces is None:
        raise ValueError("no trace: run with trace=True (or %%dist --trace)")
    return [list(t) for t in traces]


def _sends(records: Sequence[CallRecord], rank: int) -> list[dict[str, Any]]:
    return [{"src": rank, "dst": m["peer"], "bytes": m["bytes"]} for _, m in messages(records) if m["dir"] == "send"]


def _elements(span: list[int] | None) -> set[int]:
    """The element indices [start, stop) a snapshot says a step moved (none if it did not say)."""
    return set(range(*span)) if span else set()


def _flat(values: Any) -> list[Any]:
    if values and isinstance(values[0], (list, tuple)):
        return [v for row in values for v in _flat(list(row))]
    return list(values)


def ring_frames(source: Any) -> list[Frame]:
    """Frames of a traced run (``source``: per-rank trace lists, or a result with ``.trace``)."""
    traces = _traces_of(source)
    n = len(traces)
    snaps = [[i for i, r in enumerate(t) if r.get("op") == "snapshot"] for t in traces]
    if n and all(snaps):
        frames = []
        for k in range(min(len(s) for s in snaps)):
            msgs: list[dict[str, Any]] = []
            bufs: list[list[Any] | None] = []
            for rank, t in enumerate(traces):
                lo = snaps[rank][k - 1] + 1 if k else 0
                msgs += _sends(t[lo: snaps[rank][k]], rank)
                bufs.append(_flat(t[snaps[rank][k]]["values"]))
            frame = Frame(str(traces[0][snaps[0][k]].get("label") or tr("step {k}", k=k)), bufs, msgs)
            marks = [traces[rank][snaps[rank][k]] for rank in range(n)]
            frame.sent = [_elements(m.get("sent_range")) for m in marks]
            frame.received = [_elements(m.get("recv_range")) for m in marks]
            frames.append(frame)
    else:
        per_rank = [_sends(t, rank) for rank, t in enumerate(traces)]
        frames = [Frame(tr("start"), [None] * n)]
        for k in range(max((len(s) for s in per_rank), default=0)):
            frames.append(Frame(tr("step {k}", k=k + 1), [None] * n,
                                [s[k] for s in per_rank if k < len(s)]))
    prev: list[list[Any] | None] = [None] * n
    for f in frames:
        changed = [{i for i, (a, b) in enumerate(zip(p, c, strict=False)) if a != b} if p and c else set()
                   for p, c in zip(prev, f.buffers, strict=True)]
        f.received = [r or c for r, c in zip(f.received or changed, changed, strict=True)]
        f.sent = f.sent or [set() for _ in range(n)]
        for m in f.messages:  # no range given: the sender sent what the receiver changed
            dst = m["dst"]
            if dst is not None and 0 <= dst < n and not f.sent[m["src"]]:
                f.sent[m["src"]] = set(f.received[dst])
        prev = f.buffers
    return frames


def _chunk(cells: set[int]) -> str:
    return f" elements [{min(cells)}:{max(cells) + 1}]" if cells else ""


def _ring_svg(n: int, messages: Sequence[dict[str, Any]]) -> str:
    size, c, rad = 220, 110, 80
    pos = [(c + rad * math.sin(2 * math.pi * r / n), c - rad * math.cos(2 * math.pi * r / n))
           for r in range(n)]
    out = [f'<svg width="{size}" height="{size}" xmlns="http://www.w3.org/2000/svg">',
           ('<defs><marker id="dlarrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#e15759"/>'
            "</marker></defs>")]
    for m in messages:
        if not (0 <= m["src"] < n and 0 <= (m["dst"] if m["dst"] is not None else -1) < n):
            continue
        (x1, y1), (x2, y2) = pos[m["src"]], pos[m["dst"]]
        dx, dy = x2 - x1, y2 - y1
        length = math.hypot(dx, dy) or 1.0
        ux, uy = dx / length, dy / length
        sx, sy, ex, ey = x1 + 18 * ux, y1 + 18 * uy, x2 - 18 * ux, y2 - 18 * uy
        qx, qy = (sx + ex) / 2 - 22 * uy, (sy + ey) / 2 + 22 * ux  # bend right: 0->1, 1->0 apart
        out.append(f'<path d="M{sx:.1f},{sy:.1f} Q{qx:.1f},{qy:.1f} {ex:.1f},{ey:.1f}" '
                   'stroke="#e15759" stroke-width="2" fill="none" marker-end="url(#dlarrow)"/>')
    for r, (x, y) in enumerate(pos):
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="16" fill="#4e79a7"/>'
                   f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" fill="white" '
                   f'font-size="12">{r}</text>')
    out.append("</svg>")
    return "".join(out)


def render_frame(frames: Sequence[Frame], k: int) -> str:
    """HTML of step ``k``: ring diagram, messages, and the buffers with the chunks marked
    (blue border: sent this step, orange: received/changed this step)."""
    from distlab.render import BufferGrid, fmt_bytes

    f = frames[k]
    n = len(f.buffers)
    marks: dict[tuple[int, int], str] = {}
    lines = []
    for m in f.messages:
        cells = f.sent[m["src"]] if 0 <= m["src"] < n else set()
        lines.append(f"rank {m['src']} &rarr; rank {m['dst']}: "
                     f"{fmt_bytes(m['bytes'])}{_chunk(cells)}")
    for rank in range(n):
        marks.update({(rank, i): "#4e79a7" for i in f.sent[rank]})
        marks.update({(rank, i): "#f28e2b" for i in f.received[rank]})
    nums = [float(v) for fr in frames for b in fr.buffers if b for v in b
            if isinstance(v, (int, float))]
    vrange = (min(nums), max(nums)) if nums else None
    grid = (BufferGrid(f.buffers, marks=marks, vrange=vrange)._repr_html_()
            if any(b is not None for b in f.buffers) else f"<i>{tr('no buffer snapshots traced')}</i>")
    msgs = "<br>".join(lines) or f"<i>{tr('no messages in this step')}</i>"
    title = tr("step {k} of {last}: {label}", k=k, last=len(frames) - 1, label=f.label)
    return (f'<div class="distlab-ring-step"><b>{html.escape(title)}</b>'
            f'<div style="display:flex;gap:1em;align-items:center">{_ring_svg(n, f.messages)}'
            f'<div style="font-family:monospace;font-size:12px">{msgs}</div></div>{grid}</div>')


def show_frames(frames: Sequence[Frame]) -> None:
    """Every frame at once, each marked as the stepper marks it (blue: sent, orange: received).

    Static HTML: it stays in a saved notebook, where the live stepper widget does not.
    """
    from IPython.display import HTML, display

    for k in range(len(frames)):
        display(HTML(render_frame(frames, k)))


def ring_stepper(source: Any = None, frames: Sequence[Frame] | None = None,
                 interval_ms: int = 1200) -> Any:
    """An ipywidgets stepper (Play, step buttons, slider) over a traced ring run.

    ``source`` is what ``distlab.run(fn, trace=True)`` returned (or its ``.trace``, or the
    per-rank traces pulled from ``%%dist --trace``). Returns the widget; display it or leave
    it as the cell's last expression.
    """
    import ipywidgets as w

    frames = list(frames) if frames is not None else ring_frames(source)
    if not frames:
        raise ValueError("the trace holds no ring steps")
    last = len(frames) - 1
    play = w.Play(value=0, min=0, max=last, step=1, interval=interval_ms, description="Play")
    slider = w.IntSlider(value=0, min=0, max=last, description=tr("step"))
    w.jslink((play, "value"), (slider, "value"))
    back = w.Button(description="", icon="step-backward", tooltip=tr("previous step"),
                    layout=w.Layout(width="3em"))
    fwd = w.Button(description="", icon="step-forward", tooltip=tr("next step"),
                   layout=w.Layout(width="3em"))
    view = w.HTML(value=render_frame(frames, 0))

    def on_step(change: dict[str, Any]) -> None:
        view.value = render_frame(frames, change["new"])

    slider.observe(on_step, names="value")
    back.on_click(lambda _: setattr(slider, "value", max(slider.value - 1, 0)))
    fwd.on_click(lambda _: setattr(slider, "value", min(slider.value + 1, last)))
    box = w.VBox([w.HBox([play, back, slider, fwd]), view])
    box.frames = frames  # type: ignore[attr-defined]
    return box
