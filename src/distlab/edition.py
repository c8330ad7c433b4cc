"""Language editions of the course notebooks and exercises, made from one English source.

Why a catalogue keyed by the English text's hash: the English chapter sources stay the only
source of structure and code, and every translated markdown cell names the exact English text
it translates. When the English changes, its hash changes, the old translation no longer
matches, and the build refuses the edition as stale instead of shipping outdated Chinese next
to corrected English. Both editions run the same code: in a code cell only the comments are
translated, and the string literals a catalogue lists (the captions a cell prints or draws, so a
Chinese reader's output is Chinese too); a literal keeps its prefix and its ``{fields}``, except
that a field holding only a quoted word (a table's header, ``{'size':>9}``) may change its word
and its width, as long as it fills as many columns as the English one (a Chinese character takes
two), so the table below it stays aligned. An
entry whose body is the English literal keeps it: text that code matches (an OS error message), and
text matplotlib draws, since a learner's fonts may have no Chinese glyphs (boxes and a warning on
stderr instead).

A catalogue is a markdown file of entries, each headed by the hash of the English cell::

    <!-- en:3f2a9c1b0d -->
    中文的单元格内容……

and, for a string literal, by the hash of the literal as written (quotes and prefix included),
with the translated literal as its body::

    <!-- en:9b1e0c77aa -->
    f"第 {step} 步之后"
"""

from __future__ import annotations

import ast
import copy
import hashlib
import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distlab.i18n import LANGUAGES
from distlab.svg import columns

_MARKER = re.compile(r"^<!-- en:([0-9a-f]{10}) -->[ \t]*$", re.MULTILINE)
# Links the translated notebook (one folder down, notebooks/zh/) must reach one folder up. A
# translation writes links as the English has them; sibling notebooks stay siblings, pictures
# come from the edition's own figures/ (their words are translated too), and a link that already
# climbs (../00_welcome.ipynb, to the English edition) is kept as written.
_LOCAL_LINK = re.compile(r"\]\((?!https?:|#|mailto:|\.\./|figures/|[0-9]{2}_[\w-]+\.ipynb)([^)\s]+)\)")


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
    wrong: list[str] = field(default_factory=list)  # translated literals that cannot replace theirs

    def __bool__(self) -> bool:
        return bool(self.missing or self.unused or self.wrong)

    def describe(self, catalogue: Path) -> str:
        lines = [f"{catalogue}:"]
        for english in self.missing:
            first = english.strip().splitlines()[0] if english.strip() else ""
            lines.append(f"  no translation for en:{key(english)}  {first[:70]}")
        for k in self.unused:
            lines.append(f"  en:{k} translates text that is no longer in the English source")
        lines.extend(f"  {problem}" for problem in self.wrong)
        return "\n".join(lines)


def stubs(missing: Iterable[str]) -> str:
    """Catalogue entries to fill in: the English text under its key, for a translator."""
    unique = {key(text): text for text in missing}
    return "\n\n".join(f"<!-- en:{k} -->\n{text.strip()}" for k, text in unique.items()) + "\n\n"


# Comments that tools read, not people: nbgrader's markers, linters' and type checkers' pragmas.
_MACHINE_COMMENT = re.compile(r"^#+\s*(BEGIN|END) (SOLUTION|HIDDEN TESTS)|YOUR CODE HERE|^#\s*(noqa|type:|pragma|fmt:)"
                              r"|^#!")
_LETTERS = re.compile(r"[A-Za-z]")


@dataclass
class _Comment:
    first: int     # 0-based index of its first source line
    last: int      # ... and of its last
    column: int
    whole_line: bool
    english: str   # the comment text without "# ", lines joined by "\n"


def _tokens(source: str) -> list[tokenize.TokenInfo]:
    """Python tokens of a cell whose IPython lines (%magic, !cmd) are blanked, line numbers kept."""
    lines = source.splitlines(keepends=True)
    python = "".join("\n" if line.lstrip().startswith(("%", "!")) else line for line in lines)
    return list(tokenize.generate_tokens(io.StringIO(python).readline))


def _comments(source: str) -> list[_Comment]:
    """The comments people read, whole-line comments one block per run at one indent."""
    try:
        tokens = _tokens(source)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []
    lines = source.splitlines()
    found: list[_Comment] = []
    for token in tokens:
        if token.type != tokenize.COMMENT or _MACHINE_COMMENT.search(token.string) or not _LETTERS.search(token.string):
            continue
        row, column = token.start[0] - 1, token.start[1]
        text = re.sub(r"^#+ ?", "", token.string).rstrip()
        whole = not lines[row][:column].strip()
        previous = found[-1] if found else None
        if whole and previous and previous.whole_line and previous.last == row - 1 and previous.column == column:
            previous.last, previous.english = row, previous.english + "\n" + text
        else:
            found.append(_Comment(row, row, column, whole, text))
    return found


def translate_comments(source: str, catalogue: Catalogue) -> tuple[str, list[str], set[str]]:
    """``source`` with its comments translated; the English of comments without a translation;
    the keys used."""
    missing: list[str] = []
    used: set[str] = set()
    lines = source.splitlines()
    for comment in reversed(_comments(source)):  # from the bottom, so earlier line numbers hold
        translated = catalogue.get(comment.english)
        if translated is None:
            missing.append(comment.english)
            continue
        used.add(key(comment.english))
        if comment.whole_line:
            indent = lines[comment.first][:comment.column]
            lines[comment.first:comment.last + 1] = [f"{indent}# {line}".rstrip() for line in translated.splitlines()]
        else:
            row = comment.first
            lines[row] = f"{lines[row][:comment.column]}# {' '.join(translated.split())}"
    missing.reverse()
    return "\n".join(lines) + ("\n" if source.endswith("\n") else ""), missing, used


def comment_texts(source: str) -> list[str]:
    """The comments of a cell that people read (not nbgrader's markers or linters' pragmas)."""
    return [comment.english for comment in _comments(source)]


def without_comments(source: str) -> list[tuple[int, str]]:
    """What a cell runs: its tokens without comments and blank lines (IPython lines verbatim)."""
    magic = [(-1, line) for line in source.splitlines() if line.lstrip().startswith(("%", "!"))]
    ignored = (tokenize.COMMENT, tokenize.NL)
    return magic + [(t.type, t.string) for t in _tokens(source) if t.type not in ignored]


_FSTRING_START = getattr(tokenize, "FSTRING_START", -1)  # Python 3.12 splits an f-string in tokens
_FSTRING_END = getattr(tokenize, "FSTRING_END", -1)
_FIELD = re.compile(r"(?<!\{)\{(?!\{)[^{}]*\}")


@dataclass
class _Literal:
    start: int  # offsets in the cell's source
    end: int
    text: str   # as written: prefix, quotes and all


def _literals(source: str) -> list[_Literal]:
    """The string literals of a cell, an f-string as one literal on every Python version."""
    try:
        tokens = _tokens(source)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []
    offsets = [0]
    for line in source.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))

    def at(position: tuple[int, int]) -> int:
        return offsets[position[0] - 1] + position[1]

    found: list[_Literal] = []
    depth, begin = 0, 0
    for token in tokens:
        if token.type == _FSTRING_START:
            begin = at(token.start) if depth == 0 else begin
            depth += 1
        elif token.type == _FSTRING_END:
            depth -= 1
            if depth == 0:
                found.append(_Literal(begin, at(token.end), source[begin:at(token.end)]))
        elif token.type == tokenize.STRING and depth == 0:
            found.append(_Literal(at(token.start), at(token.end), token.string))
    return found


def _prefix(literal: str) -> str:
    return literal[:len(literal) - len(literal.lstrip("rRbBfFuU"))].lower()


def literal_problem(english: str, translated: str) -> str:
    """Why ``translated`` cannot stand in for the literal ``english`` ('' when it can): it must be
    one literal of the same kind (an f-string stays one) with the same ``{fields}``."""
    try:
        tree = ast.parse(translated.strip(), mode="eval")
    except SyntaxError as error:
        return f"not a Python literal: {error.msg}"
    if not isinstance(tree.body, (ast.Constant, ast.JoinedStr)):
        return "not a single string literal"
    if _prefix(translated.strip()) != _prefix(english):
        return f"prefix {_prefix(translated.strip())!r} differs from the English {_prefix(english)!r}"
    if _fields(translated) != _fields(english):
        return "its {fields} differ from the English literal's"
    for english_field, translated_field in zip(_quoted_fields(english), _quoted_fields(translated), strict=True):
        if english_field[1] and columns(translated_field[0]) != columns(english_field[0]):
            return (f"the field {english_field[2]} fills {columns(english_field[0])} columns, its translation "
                    f"{translated_field[2]} fills {columns(translated_field[0])}: the table below it would lose "
                    "its alignment (a Chinese character takes two columns; give the field a smaller width)")
    return ""


_QUOTED_FIELD = re.compile(r"""^\{\s*(?:'([^']*)'|"([^"]*)")\s*(?::([^{}!]*))?\}$""")


def _quoted_fields(literal: str) -> list[tuple[str, str, str]]:
    """The fields that hold only a quoted word: (the word as the field shows it, its format
    spec, the field as written)."""
    found = []
    for written in _FIELD.findall(literal):
        match = _QUOTED_FIELD.match(written)
        if match:
            word = match.group(1) if match.group(1) is not None else match.group(2)
            spec = match.group(3) or ""
            try:
                shown = format(word, spec)
            except ValueError:
                shown = word
            found.append((shown, spec, written))
    return found


def _fields(literal: str) -> list[str]:
    """A literal's {fields}, the words quoted inside them set aside (those may be translated),
    and the width of a field that holds only a quoted word (see _quoted_fields)."""
    return sorted("{''}" if _QUOTED_FIELD.match(found) else re.sub(r"'[^']*'|\"[^\"]*\"", "''", found)
                  for found in _FIELD.findall(literal))


def reads_as_text(literal: str) -> bool:
    """Two English words or more outside its {fields}: a caption, a message, a label."""
    return re.search(r"[A-Za-z']{2,} +[A-Za-z]{2,}", _FIELD.sub("", literal)) is not None


def translate_literals(source: str, catalogue: Catalogue) -> tuple[str, set[str], list[str], list[str]]:
    """``source`` with each literal the catalogue lists replaced; the keys used; the literals
    that read as text and have no entry (an entry whose body is the English literal keeps it, for
    text that code matches, such as an error message); translations that cannot stand in."""
    used: set[str] = set()
    missing: list[str] = []
    problems: list[str] = []
    for literal in reversed(_literals(source)):
        translated = catalogue.get(literal.text)
        if translated is None:
            if reads_as_text(literal.text):
                missing.append(literal.text)
            continue
        used.add(key(literal.text))
        problem = literal_problem(literal.text, translated)
        if problem:
            problems.append(f"en:{key(literal.text)} {literal.text[:60]}: {problem}")
            continue
        source = source[:literal.start] + translated.strip() + source[literal.end:]
    missing.reverse()
    return source, used, missing, problems


def code_shape(source: str) -> tuple[list[tuple[int, str]], list[str]]:
    """What a cell runs with its string literals set aside, and those literals: two editions'
    cells run the same code when their shapes are equal and only listed literals differ."""
    literals = _literals(source)
    for literal in reversed(literals):
        source = source[:literal.start] + '""' + source[literal.end:]
    return without_comments(source), [literal.text for literal in literals]


def translate_code(source: str, catalogue: Catalogue) -> tuple[str, Problems, set[str]]:
    """A code cell's ``source`` with its comments and listed captions translated; what is missing
    or wrong; the keys used."""
    problems = Problems()
    source, missing, used = translate_comments(source, catalogue)
    problems.missing.extend(missing)
    source, keys, missing, wrong = translate_literals(source, catalogue)
    problems.missing.extend(missing)
    problems.wrong.extend(wrong)
    return source, problems, used | keys


def translate_cells(cells: list[Any], catalogue: Catalogue, *, relink: bool = True, comments: bool = True
                    ) -> tuple[list[Any], Problems]:
    """Copies of ``cells`` whose markdown, code comments and captions are replaced by their translation.

    ``relink`` rewrites relative links (other than to notebooks and figures/) for a notebook one
    folder further down; ``comments`` translates the comments and captions in code cells.
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
        elif cell.cell_type == "code" and comments:
            cell.source, found, keys = translate_code(cell.source, catalogue)
            problems.missing.extend(found.missing)
            problems.wrong.extend(found.wrong)
            used |= keys
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
