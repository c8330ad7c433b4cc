"""The drawing both pictures of the kit share: per-rank buffers as a coloured grid, byte sizes.

Why its own module: the trace timeline (``distlab.viz``), the ring replay (``distlab.replay``) and
the committed figures (``distlab.svg``) all draw buffers the same way; each imports this one,
and none of them imports another to borrow it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

__all__ = ["BufferGrid", "cell_color", "fmt_bytes", "fmt_value", "rows_of"]


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as message sizes are powers of two)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def cell_color(v: float, lo: float, hi: float) -> tuple[str, str]:
    from matplotlib import colormaps

    frac = 0.5 if hi == lo else (v - lo) / (hi - lo)
    r, g, b, _ = colormaps["YlGnBu"](0.1 + 0.75 * frac)
    return f"rgb({r * 255:.0f},{g * 255:.0f},{b * 255:.0f})", (
        "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white")


def rows_of(buf: Any) -> list[list[Any]]:
    if hasattr(buf, "detach"):
        buf = buf.detach().cpu().tolist()
    buf = list(buf)
    return [list(row) for row in buf] if buf and isinstance(buf[0], (list, tuple)) else [buf]


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.0f}" if v.is_integer() and abs(v) < 1e6 else f"{v:.3g}"
    return html.escape(str(v))


class BufferGrid:
    """Per-rank buffers as an HTML grid of coloured cells (one row per rank, values shown).

    ``marks`` maps (rank, index) to a CSS colour drawn as a thick border, used by the ring
    stepper to show the chunk a rank just sent or received. ``vrange`` fixes the colour scale
    (default: the smallest and largest value shown), so that frames of a replay compare.
    """

    max_cells = 64

    def __init__(self, buffers: Sequence[Any], title: str | None = None,
                 labels: Sequence[str] | None = None,
                 marks: dict[tuple[int, int], str] | None = None,
                 vrange: tuple[float, float] | None = None) -> None:
        self.rows = [rows_of(b) if b is not None else [[]] for b in buffers]
        self.title, self.marks, self.vrange = title, marks or {}, vrange
        self.labels = list(labels) if labels else [f"rank {r}" for r in range(len(self.rows))]

    def __repr__(self) -> str:
        lines = [self.title] if self.title else []
        for label, rows in zip(self.labels, self.rows, strict=False):
            lines += [f"{label}: {[fmt_value(v) for v in row]}".replace("'", "") for row in rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        nums = [v for rows in self.rows for row in rows for v in row
                if isinstance(v, (int, float)) and not isinstance(v, bool)]
        lo, hi = self.vrange or ((min(nums), max(nums)) if nums else (0, 0))
        out = ['<div class="distlab-buffers" style="font-family:monospace;font-size:12px">']
        if self.title:
            out.append(f"<div><b>{html.escape(self.title)}</b></div>")
        out.append('<table style="border-collapse:separate;border-spacing:2px">')
        for rank, rows in enumerate(self.rows):
            for j, row in enumerate(rows):
                label = html.escape(self.labels[rank]) if j == 0 else ""
                cells = [f'<td style="padding-right:8px;text-align:left">{label}</td>']
                for i, v in enumerate(row[: self.max_cells]):
                    bg, fg = (cell_color(float(v), lo, hi)
                              if isinstance(v, (int, float)) else ("#eee", "black"))
                    mark = self.marks.get((rank, i)) if len(rows) == 1 else None
                    border = f"3px solid {mark}" if mark else "3px solid transparent"
                    cells.append(f'<td style="background:{bg};color:{fg};border:{border};'
                                 f'min-width:2.2em;text-align:center">{fmt_value(v)}</td>')
                if len(row) > self.max_cells:
                    cells.append(f"<td>... ({len(row) - self.max_cells} more)</td>")
                out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</table></div>")
        return "".join(out)
