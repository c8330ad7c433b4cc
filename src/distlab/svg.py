"""Pictures as SVG text: per-rank buffers and ring steps, for figures that show without running.

The notebooks' live pictures are HTML (``viz.BufferGrid``) and widgets; a reader on GitHub or
nbviewer sees neither until the notebook runs. These draw the same grids as self-contained SVG,
deterministically (same data, same bytes), so ``make figures`` can commit them and a test can
check that they are rebuilt unchanged.
"""

from __future__ import annotations

import html
import math
import unicodedata
from collections.abc import Sequence
from typing import Any

from distlab.render import cell_color, fmt_value, rows_of

CELL_W, CELL_H, GAP = 34, 22, 2
TITLE_H, FONT, CHAR_W = 22, 12, 7.3  # CHAR_W: width of one monospace character at FONT
SENT, RECEIVED = "#4e79a7", "#f28e2b"  # the stepper's colours


def columns(text: str) -> int:
    """How many monospace columns ``text`` takes: a Chinese character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def text_width(text: str) -> float:
    """Pixels ``text`` takes at FONT."""
    return columns(text) * CHAR_W


def _text(x: float, y: float, text: str, anchor: str = "start", weight: str = "normal",
          fill: str = "black") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-family="monospace" font-size="{FONT}" '
            f'text-anchor="{anchor}" font-weight="{weight}" fill="{fill}">{html.escape(text)}</text>')


def buffers(bufs: Sequence[Any], title: str | None = None, labels: Sequence[str] | None = None,
            marks: dict[tuple[int, int], str] | None = None,
            vrange: tuple[float, float] | None = None) -> tuple[str, int, int]:
    """(SVG body, width, height) of one grid: a row of coloured, numbered cells per rank."""
    rows = [rows_of(b)[0] if b is not None else [] for b in bufs]
    names = list(labels) if labels else [f"rank {r}" for r in range(len(rows))]
    nums = [float(v) for row in rows for v in row if isinstance(v, (int, float)) and not isinstance(v, bool)]
    lo, hi = vrange or ((min(nums), max(nums)) if nums else (0.0, 0.0))
    top = TITLE_H if title else 0
    label_w = int(max((text_width(name) for name in names), default=0)) + 10
    width = max(label_w + max((len(r) for r in rows), default=0) * (CELL_W + GAP),
                int(text_width(title or "")) + 4)
    parts = [_text(0, 15, title, weight="bold")] if title else []
    for r, row in enumerate(rows):
        y = top + r * (CELL_H + GAP)
        parts.append(_text(0, y + 15, names[r]))
        for i, v in enumerate(row):
            x = label_w + i * (CELL_W + GAP)
            bg, fg = cell_color(float(v), lo, hi) if isinstance(v, (int, float)) else ("#eee", "black")
            mark = (marks or {}).get((r, i))
            stroke = f' stroke="{mark}" stroke-width="3"' if mark else ""
            parts.append(f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="{bg}"{stroke}/>')
            parts.append(_text(x + CELL_W / 2, y + 15, fmt_value(v), anchor="middle", fill=fg))
    return "\n".join(parts), width, top + len(rows) * (CELL_H + GAP)


def ring(n: int, messages: Sequence[dict[str, Any]], size: int = 150) -> tuple[str, int, int]:
    """(SVG body, width, height): n ranks on a circle, an arrow for each message src -> dst."""
    c, rad = size / 2, size / 2 - 22
    pos = [(c + rad * math.sin(2 * math.pi * r / n), c - rad * math.cos(2 * math.pi * r / n)) for r in range(n)]
    parts = ['<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" '
             'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>']
    for m in messages:
        (x1, y1), (x2, y2) = pos[m["src"]], pos[m["dst"]]
        dx, dy = x2 - x1, y2 - y1
        length = math.hypot(dx, dy) or 1.0
        ux, uy = dx / length, dy / length
        parts.append(f'<line x1="{x1 + 15 * ux:.1f}" y1="{y1 + 15 * uy:.1f}" x2="{x2 - 15 * ux:.1f}" '
                     f'y2="{y2 - 15 * uy:.1f}" stroke="#555" stroke-width="1.5" marker-end="url(#arrow)"/>')
    for r, (x, y) in enumerate(pos):
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="13" fill="#fff" stroke="#333"/>')
        parts.append(_text(x, y + 4, str(r), anchor="middle"))
    return "\n".join(parts), size, size


def compose(panels: Sequence[tuple[str, int, int]], across: bool = False, gap: int = 14,
            caption: str | None = None) -> str:
    """One SVG document of ``panels`` stacked top to bottom (or left to right), with a caption."""
    x = y = 0
    body, width, height = [], 0, 0
    top = TITLE_H + 4 if caption else 0
    for svg, w, h in panels:
        body.append(f'<g transform="translate({x},{y + top})">\n{svg}\n</g>')
        if across:
            x += w + gap
            width, height = x - gap, max(height, h)
        else:
            y += h + gap
            width, height = max(width, w), y - gap
    head = [_text(0, 16, caption, weight="bold")] if caption else []
    width = max(width, int(text_width(caption or "")) + 4)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 4}" height="{height + top + 4}" '
            f'viewBox="0 0 {width + 4} {height + top + 4}">\n'
            f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(head + body) + "\n</svg>\n")
