"""Turns per-rank outcomes into the text a learner reads: grouped ranks, cell lines, stacks.

Ranks that failed the same way are shown once ("ranks 1-3"), because four copies of one
traceback hide the one rank that differs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from distlab.i18n import tr
from distlab.protocol import FailureKind, RankFailure


def rank_label(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2,5'; [3] -> 'rank 3'."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        spans.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    noun = "rank" if len(ordered) == 1 else "ranks"
    return f"{noun} {','.join(spans)}"


def parse_ranks(text: str, world_size: int) -> tuple[int, ...]:
    """'0,2' or '1-3' or '0,2-3' -> sorted ranks; ValueError with a one-line reason otherwise."""
    ranks: set[int] = set()
    for part in text.replace(" ", "").split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ValueError(tr("--ranks expects a list like 0,2 or 1-3, got {text}", text=repr(text)))
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if high < low:
            raise ValueError(tr("--ranks range {part} is backwards", part=repr(part)))
        ranks.update(range(low, high + 1))
    bad = sorted(r for r in ranks if r >= world_size)
    if bad:
        raise ValueError(tr("--ranks {text}: rank {rank} does not exist with {n} ranks (0-{last})",
                            text=text, rank=bad[0], n=world_size, last=world_size - 1))
    return tuple(sorted(ranks))


def _group(items: dict[int, str]) -> list[tuple[list[int], str]]:
    groups: dict[str, list[int]] = {}
    for rank in sorted(items):
        groups.setdefault(items[rank], []).append(rank)
    return [(ranks, text) for text, ranks in groups.items()]


def format_failures(failures: Sequence[RankFailure]) -> str:
    """One block per distinct failure, headed by the ranks that share it."""
    texts = {}
    for failure in failures:
        lines = []
        if failure.kind is FailureKind.CRASHED:  # no traceback: what ended it, and perhaps why
            lines.append(failure.traceback.rstrip() or f"{failure.exc_type}: {failure.message}")
        else:
            if failure.lineno is not None and failure.line:
                lines.append(tr("at cell line {line}: {text}", line=failure.lineno, text=failure.line.strip()))
            lines.append(failure.traceback.rstrip() or f"{failure.exc_type}: {failure.message}")
        texts[failure.rank] = "\n".join(lines)
    blocks = []
    for ranks, text in _group(texts):
        blocks.append(f"--- {rank_label(ranks)} ---\n{text}")
    return "\n".join(blocks)


_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')


_INTERNAL = ("distlab/worker.py", "distlab/launcher.py", "distlab/join.py", "distlab/trace.py", "<frozen runpy>",
             "runpy.py")
_MAIN = ("distlab/launcher.py", "distlab/join.py")  # a forked rank's or a joined rank's main thread


def stack_frames(dump: str) -> list[tuple[str, int, str]]:
    """The main thread's frames in a faulthandler dump, outermost first, without distlab's own.

    The main thread is the one that runs the launcher's code (the rank was forked from it); the
    others are output forwarders and torch's threads.
    """
    sections: list[list[str]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread ", "Current thread ", "Stack ")):
            sections.append([])
        elif sections:
            sections[-1].append(line)
    main = next((s for s in sections if any(m in line for line in s for m in _MAIN)),
                sections[0] if sections else [])
    frames = []
    for line in main:
        match = _FRAME.match(line)
        if match:
            frames.append((match["file"], int(match["line"]), match["func"]))
    frames.reverse()
    last_internal = max((i for i, f in enumerate(frames) if f[0].endswith(_INTERNAL)), default=-1)
    return frames[last_internal + 1:]


def format_stack(dump: str, cell_lines: dict[str, list[str]]) -> tuple[str, str]:
    """(where the rank waits, as a short headline; the stack, outermost first, with cell lines)."""
    frames = stack_frames(dump)
    if not frames:
        return tr("no Python stack (the rank did not answer)"), dump.strip()
    rendered = []
    headline = ""
    for filename, lineno, func in frames:
        rendered.append(f'  File "{filename}", line {lineno}, in {func}')
        source = cell_lines.get(filename)
        if source and 0 < lineno <= len(source):
            text = source[lineno - 1].strip()
            rendered.append(f"    {text}")
            headline = tr("cell line {line}: {text}", line=lineno, text=text)
    if not headline:
        filename, lineno, func = frames[-1]
        headline = f"{func} ({filename}:{lineno})"
    return headline, "\n".join(rendered)


def format_stacks(stacks: dict[int, str], cell_lines: dict[str, list[str]]) -> str:
    """Stuck ranks grouped by the line they wait on."""
    by_rank = {}
    for rank, dump in stacks.items():
        headline, stack = format_stack(dump, cell_lines)
        by_rank[rank] = tr("waiting at {where}", where=headline) + f"\n{stack}"
    return "\n".join(f"--- {rank_label(ranks)} ---\n{text}" for ranks, text in _group(by_rank))
