"""Pictures of communication: a per-rank timeline and byte table of a trace, and buffer grids.

Everything here takes plain data (trace records from ``distlab.trace``, lists of numbers)
so it works in the kernel on what ranks sent back. Figures are drawn with matplotlib's
object API (no pyplot state, no backend needed) and shown as PNG; tables are HTML.
``ring_stepper`` lives in ``distlab.replay`` and is re-exported here.
"""

from __future__ import annotations

import html
import io
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from distlab.costmodel import canonical_op
from distlab.figure_text import figure_tr, fit_fonts
from distlab.i18n import tr
from distlab.records import CallRecord, Trace, messages
from distlab.render import BufferGrid, fmt_bytes
from distlab.replay import ring_stepper

__all__ = [
    "PNG",
    "BufferGrid",
    "fmt_bytes",
    "p2p_messages",
    "ring_stepper",
    "show_buffers",
    "show_trace",
    "timeline_figure",
    "trace_table_html",
]

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac"]


def png_bytes(fig: Figure) -> bytes:
    """Render a figure to PNG with the Agg canvas (no pyplot, no backend needed)."""
    buf = io.BytesIO()
    fit_fonts(fig)
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def enable_figure_display() -> None:
    """Let a bare ``Figure`` (made without pyplot, as every figure here is) show as a PNG
    when it is a cell's value; IPython only learns that when pyplot is imported."""
    if not in_kernel():
        return
    from IPython import get_ipython

    formatter = get_ipython().display_formatter.formatters["image/png"]  # type: ignore[union-attr]
    try:
        formatter.lookup_by_type(Figure)
    except KeyError:
        formatter.for_type(Figure, png_bytes)


class PNG:
    """A rendered figure: displays as PNG in the kernel and through a rank's ``display``."""

    def __init__(self, fig: Figure) -> None:
        self.figure = fig
        self.data = png_bytes(fig)

    def _repr_png_(self) -> bytes:
        return self.data

    def __repr__(self) -> str:
        return f"<figure: {self.figure.axes[0].get_title() if self.figure.axes else 'empty'}>"


def _display(*objs: Any) -> None:
    from IPython.display import display

    display(*objs)


def _calls(traces: Trace) -> list[list[CallRecord]]:
    return [[r for r in rank if r.get("op") != "snapshot"] for rank in traces]


def _done(r: CallRecord) -> float:
    wait = r.get("t_wait")
    return float(wait if wait is not None else r["t_end"])


def p2p_messages(traces: Trace) -> list[dict[str, Any]]:
    """Pair every traced send with its receive: the k-th send from a to b (per tag) matches
    the k-th receive on b from a. Returns ``{"src", "dst", "bytes", "send", "recv"}`` where
    ``send``/``recv`` are the records (``recv`` is None if b did not trace a matching one).
    """
    sends: dict[tuple[int, int, int], list[tuple[CallRecord, int]]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[CallRecord]] = defaultdict(list)
    for rank_records in traces:
        for rec, m in messages(rank_records):
            if m["peer"] is None:
                continue
            if m["dir"] == "send":
                sends[(rec["rank"], m["peer"], m["tag"])].append((rec, m["bytes"]))
            else:
                recvs[(m["peer"], rec["rank"], m["tag"])].append(rec)
    out = []
    for (src, dst, _tag), items in sends.items():
        matched = recvs.get((src, dst, _tag), [])
        for k, (rec, nbytes) in enumerate(items):
            out.append({"src": src, "dst": dst, "bytes": nbytes, "send": rec,
                        "recv": matched[k] if k < len(matched) else None})
    return out


def rank_names(n: int, nodes: dict[int, str] | None = None) -> list[str]:
    """"rank 3", or "rank 3 @node2" when the ranks run on several hosts (cluster mode)."""
    nodes = nodes or {}
    return [f"rank {r} @{nodes[r]}" if nodes.get(r) else f"rank {r}" for r in range(n)]


def timeline_figure(traces: Trace, title: str | None = None,
                    spans: Sequence[Sequence[dict[str, Any]]] | None = None,
                    nodes: dict[int, str] | None = None) -> Figure:
    """One lane per rank, one box per call (hatched tail: async call until its wait
    returned), arrows from each send to its matching receive. Times in ms from the first call.

    ``spans`` (per rank, dicts with ``label``, ``t_start``, ``t_end`` from ``time.perf_counter``)
    adds the rank's own work, say each layer's backward, as grey boxes in the upper half of its
    lane, with the calls in the lower half: what overlaps what.

    ``nodes`` (rank -> host, on a cluster) names each lane's host and shades every other host's
    lanes, so the arrows that cross between machines stand out.
    """
    enable_figure_display()
    calls = _calls(traces)
    work = [list(s) for s in spans] if spans else []
    starts = [r["t_start"] for rank in calls for r in rank] + [s["t_start"] for rank in work for s in rank]
    t0 = min(starts) if starts else 0.0
    ends = [_done(r) for rank in calls for r in rank] + [s["t_end"] for rank in work for s in rank]
    span = max(ends, default=t0 + 1e-3) - t0 or 1e-3
    n = max(len(traces), len(work), 1)
    fig = Figure(figsize=(10, (1.0 if work else 0.7) * n + 1.4), dpi=90)
    ax = fig.add_subplot()
    colors: dict[str, str] = {}
    low, height = (0.02, 0.36) if work else (-0.35, 0.7)  # calls: lower half when work is drawn
    for lane, rank_spans in enumerate(work):
        for s in rank_spans:
            x, w = (s["t_start"] - t0) * 1e3, max((s["t_end"] - s["t_start"]) * 1e3, span * 1e3 / 400)
            ax.broken_barh([(x, w)], (lane - 0.38, 0.36), facecolors="#bbbbbb", edgecolor="white")
            if w > span * 1e3 / 14:
                ax.text(x + w / 2, lane - 0.2, str(s.get("label", "")), ha="center", va="center",
                        fontsize=7, clip_on=True)
    for lane, rank_records in enumerate(calls):
        for rec in rank_records:
            op = canonical_op(rec["op"]) if rec["op"] not in ("isend", "irecv") else rec["op"]
            color = colors.setdefault(op, _PALETTE[len(colors) % len(_PALETTE)])
            x, w = (rec["t_start"] - t0) * 1e3, (rec["t_end"] - rec["t_start"]) * 1e3
            w = max(w, span * 1e3 / 400)  # keep instantaneous calls visible
            ax.broken_barh([(x, w)], (lane + low, height), facecolors=color,
                           edgecolor="black" if rec.get("error") else color)
            waited = rec.get("t_wait")
            if waited is not None and waited > rec["t_end"]:
                ax.broken_barh([(x + w, (waited - rec["t_end"]) * 1e3)],
                               (lane + low + height * 0.2, height * 0.6), facecolors="none",
                               edgecolor=color, hatch="///")
            if w > span * 1e3 / 12:
                ax.text(x + w / 2, lane + low + height / 2, rec["op"], ha="center", va="center",
                        fontsize=7, color="white", clip_on=True)
    for m in p2p_messages(traces):
        if m["recv"] is None or m["src"] >= n or m["dst"] >= n:
            continue
        xs = (m["send"]["t_start"] - t0) * 1e3
        xr = (_done(m["recv"]) - t0) * 1e3
        ax.annotate("", xy=(xr, m["dst"]), xytext=(xs, m["src"]),
                    arrowprops={"arrowstyle": "->", "color": "#333333", "lw": 0.8,
                                "shrinkA": 0, "shrinkB": 0})
    hosts = sorted({nodes[r] for r in range(n) if nodes and nodes.get(r)})
    for r in range(n):
        if nodes and nodes.get(r) in hosts and hosts.index(nodes[r]) % 2:
            ax.axhspan(r - 0.5, r + 0.5, color="#eef3fb", zorder=-1)
    ax.set_yticks(range(n), rank_names(n, nodes))
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel(figure_tr("time since first call (ms)"))
    ax.set_title(figure_tr(title) if title else figure_tr("torch.distributed calls per rank"))
    handles = [ax.bar(0, 0, color=c, label=op) for op, c in colors.items()]
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fit_fonts(fig)
    fig.tight_layout()
    return fig


def trace_table_html(traces: Trace, nodes: dict[int, str] | None = None) -> str:
    """Per rank and operation: calls, message size, logical bytes sent/received, the
    theoretical bus bytes (nccl-tests factors), time spent and the measured bus bandwidth."""
    columns = (tr("op"), tr("calls"), tr("size"), tr("sent"), tr("received"), tr("theoretical bus bytes"),
               tr("time (ms)"), tr("busbw (GB/s)"))
    head = "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>"
    parts = ['<div style="display:flex;flex-wrap:wrap;gap:1.5em">']
    names = rank_names(len(traces), nodes)
    for rank, rank_records in enumerate(_calls(traces)):
        rows: dict[str, list[float]] = {}
        for rec in rank_records:
            row = rows.setdefault(rec["op"], [0, 0, 0, 0, 0.0, 0.0])
            dt = _done(rec) - rec["t_start"]
            for i, v in enumerate((1, rec["size"], rec["sent"], rec["recv"], rec["bus_bytes"], dt)):
                row[i] += v
        body = []
        for op, (calls, size, sent, recv, bus, dt) in rows.items():
            bw = f"{bus / dt / 1e9:.3g}" if dt > 0 and bus else "-"
            body.append(f"<tr><td>{html.escape(op)}</td><td>{calls:.0f}</td>"
                        f"<td>{fmt_bytes(size)}</td><td>{fmt_bytes(sent)}</td>"
                        f"<td>{fmt_bytes(recv)}</td><td>{fmt_bytes(bus)}</td>"
                        f"<td>{dt * 1e3:.3f}</td><td>{bw}</td></tr>")
        if not body:
            body.append(f'<tr><td colspan="8">{html.escape(tr("no torch.distributed calls"))}</td></tr>')
        parts.append(f'<table class="distlab-trace"><caption>{html.escape(names[rank])}</caption>'
                     f"{head}{''.join(body)}</table>")
    parts.append("</div>")
    return "".join(parts)


def show_trace(traces: Trace, nodes: dict[int, str] | None = None) -> None:
    """Display the timeline and the per-rank table of a trace (called after ``--trace``);
    ``nodes`` names each rank's host on a cluster."""
    from IPython.display import HTML

    if not any(_calls(traces)):
        _display(HTML("<p>trace: no torch.distributed calls were made.</p>"))
        return
    _display(PNG(timeline_figure(traces, nodes=nodes)), HTML(trace_table_html(traces, nodes)))


def show_buffers(buffers: Sequence[Any], title: str | None = None,
                 labels: Sequence[str] | None = None) -> BufferGrid | None:
    """Draw per-rank buffers (list indexed by rank of 1-D/2-D tensors or lists).

    In a Jupyter kernel it displays the grid and returns None. Elsewhere (on a rank) it
    returns the grid: pass it to the rank's ``display``, e.g. ``display(show_buffers(...))``.
    """
    grid = BufferGrid(buffers, title=title, labels=labels)
    if not in_kernel():
        return grid
    _display(grid)
    return None


def in_kernel() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel attached), not on a rank."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return False
    return getattr(get_ipython(), "kernel", None) is not None
