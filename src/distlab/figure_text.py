"""Text in matplotlib figures, in the learner's edition, never as empty boxes.

Why: matplotlib's own font (DejaVu Sans) has no Chinese characters. A Chinese label drawn with it
comes out as empty boxes, and matplotlib warns about each missing glyph on stderr. A Chinese
reader's machine nearly always has a font that has them (Microsoft YaHei on Windows, PingFang or
Heiti on macOS, Noto Sans CJK or WenQuanYi on Linux): the figures of the Chinese edition use it
after DejaVu Sans (matplotlib picks the font per character) and speak Chinese. A machine without
one (a bare Linux server a browser reaches) gets the figures in English rather than in boxes.
The SVG pictures of :mod:`distlab.render` need none of this: the browser draws their text.
"""

from __future__ import annotations

from typing import Any

from distlab.i18n import language, tr
from distlab.svg import columns

# Fonts with the Simplified Chinese characters, by the family name matplotlib reads from the file
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "Source Han Sans CN",
             "Microsoft YaHei", "PingFang SC", "Heiti SC", "STHeiti", "Hiragino Sans GB",
             "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Sarasa Gothic SC", "SimHei", "SimSun",
             "Noto Sans CJK JP", "Droid Sans Fallback", "Arial Unicode MS")


def cjk_font() -> str | None:
    """The family name of an installed font with Chinese characters, or None. Read each time (a
    cheap look at matplotlib's list): a font added with ``font_manager.fontManager.addfont`` counts."""
    from matplotlib import font_manager

    installed = {entry.name for entry in font_manager.fontManager.ttflist}
    return next((name for name in CJK_FONTS if name in installed), None)


def figure_language() -> str:
    """The language of the kit's figure labels: the edition's, unless it is Chinese and no font
    here can draw Chinese."""
    lang = language()
    return "en" if lang == "zh" and cjk_font() is None else lang


def figure_tr(template: str, **fields: object) -> str:
    """``tr`` for text drawn in a figure (see :func:`figure_language`)."""
    return tr(template, figure_language(), **fields)


def fit_fonts(fig: Any) -> None:
    """Let every text of ``fig`` that holds Chinese fall back to a font that has it. Call it before
    the figure is measured (``tight_layout``) or drawn: both look up each character's glyph."""
    from matplotlib.text import Text

    font = cjk_font()
    if font is None:
        return
    for text in fig.findobj(Text):
        shown = text.get_text()
        if columns(shown) > len(shown):  # a wide character: Chinese, or its punctuation
            families = list(text.get_fontfamily())
            if font not in families:
                text.set_fontfamily([*families, font])
