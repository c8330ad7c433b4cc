"""Language editions of the course notebooks and exercises, made from one English source.

Why a catalogue keyed by the English text's hash: the English chapter sources stay the only
source of structure and code, and every translated markdown cell names the exact English text
it translates. When the English changes, its hash changes, the old translation no longer
matches, and the build refuses the edition as stale instead of shipping outdated Chinese next
to corrected English. Code cells are never translated: both editions run the same code.

A catalogue is a markdown file of entries, each headed by the hash of the English cell::

    <!-- en:3f2a9c1b0d -->
    中文的单元格内容……
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distlab.i18n import LANGUAGES

_MARKER = re.compile(r"^<!-- en:([0-9a-f]{10}) -->[ \t]*$", re.MULTILINE)
# Links the translated notebook (one folder down, notebooks/zh/) must reach one folder up. A
# translation writes links as the English has them; sibling notebooks stay siblings, and a link
# that already climbs (../00_welcome.ipynb, to the English edition) is kept as written.
_LOCAL_LINK = re.compile(r"\]\((?!https?:|#|mailto:|\.\./|[0-9]{2}_[\w-]+\.ipynb)([^)\s]+)\)")


def key(english: str) -> str:
    """The catalogue key of an English cell: the first 10 hex digits of its SHA-1."""
    return hashlib.sha1(english.strip().encode("utf-8")).hexdigest()[:10]


@dataclass
class Catalogue:
    """Translations of one notebook's markdown cells, by the key of the English text."""

    path: Path
    entries: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Catalogue:
        entries: dict[str, str] = {}
        if path.exists():
            text = path.read_text(encoding="utf-8")
            marks = list(_MARKER.finditer(text))
            for mark, following in zip(marks, [*marks[1:], None], strict=True):
                end = following.start() if following else len(text)
                entries[mark.group(1)] = text[mark.end():end].strip("\n")
        return cls(path, entries)

    def get(self, english: str) -> str | None:
        return self.entries.get(key(english))


@dataclass
class Problems:
    """What keeps an edition from being complete: English text without a translation, and
    translations of English text that no longer exists."""

    missing: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.missing or self.unused)

    def describe(self, catalogue: Path) -> str:
        lines = [f"{catalogue}:"]
        for english in self.missing:
            first = english.strip().splitlines()[0] if english.strip() else ""
            lines.append(f"  no translation for en:{key(english)}  {first[:70]}")
        for k in self.unused:
            lines.append(f"  en:{k} translates text that is no longer in the English source")
        return "\n".join(lines)


def stubs(missing: Iterable[str]) -> str:
    """Catalogue entries to fill in: the English text under its key, for a translator."""
    return "\n\n".join(f"<!-- en:{key(text)} -->\n{text.strip()}" for text in missing) + "\n"


def translate_cells(cells: list[Any], catalogue: Catalogue, *, relink: bool = True
                    ) -> tuple[list[Any], Problems]:
    """Copies of ``cells`` whose markdown is replaced by its translation; code is untouched.

    ``relink`` rewrites relative links (figures/x.svg) for a notebook one folder further down.
    """
    problems = Problems()
    used: set[str] = set()
    out = []
    for cell in cells:
        cell = copy.deepcopy(cell)
        if cell.cell_type == "markdown" and cell.source.strip():
            translated = catalogue.get(cell.source)
            if translated is None:
                problems.missing.append(cell.source)
            else:
                used.add(key(cell.source))
                cell.source = _LOCAL_LINK.sub(r"](../\1)", translated) if relink else translated
        out.append(cell)
    problems.unused = sorted(set(catalogue.entries) - used)
    return out, problems


_CJK = re.compile(r"[\u4e00-\u9fff]")


def language_of(nb: Any) -> str:
    """The edition a notebook is written in: its metadata, else its markdown's script."""
    meta = (nb.get("metadata") or {}).get("distlab") or {}
    if meta.get("lang") in LANGUAGES:
        return str(meta["lang"])
    text = "".join("".join(c.get("source", "")) for c in nb.get("cells", [])
                   if c.get("cell_type") == "markdown")
    return "zh" if len(_CJK.findall(text)) > 20 else "en"
