"""Pull the graded answer out of a submitted notebook: only the answer cells, by nbgrader id (or,
when a tool dropped the ids, by the function a cell defines)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


def solution_source(nb: Any, solution_ids: Sequence[str]) -> str:
    """The source of the cells whose nbgrader grade_id is one of ``solution_ids``.

    ``nb`` is a notebook as nbformat reads it or as plain JSON.

    Cells are joined in notebook order; a missing answer cell gives "" (every part then fails
    with "... is not defined"), never an error. Of cells pasted with the same grade id, only the
    last counts, as nbgrader's DeduplicateIds leaves it: the parallel pass then grades the very
    source nbgrader's pass reads, and its result is taken instead of grading the student twice.
    """
    later: set[str] = set()
    kept = []
    for cell in reversed(nb.get("cells", [])):
        grade_id = cell_grade_id(cell)
        if grade_id is None:  # no id, or not a cell
            continue
        meta = _nbgrader_metadata(cell)
        flagged = any(meta.get(flag) for flag in ("grade", "solution", "locked"))
        if flagged and grade_id in later:
            continue  # an earlier copy: nbgrader empties its metadata
        if flagged:
            later.add(grade_id)
        if cell.get("cell_type") == "code" and grade_id in solution_ids:
            kept.append(_source(cell))
    return "\n\n".join(reversed(kept))


def cell_grade_id(cell: Any) -> str | None:
    """A cell's nbgrader grade id; None for a cell without one, or with one no answer cell can have
    (a list, a number: a hand edit), or for what is not a cell at all."""
    grade_id = _nbgrader_metadata(cell).get("grade_id") if isinstance(cell, dict) else None
    return grade_id if isinstance(grade_id, str) else None


def _nbgrader_metadata(cell: dict[str, Any]) -> dict[str, Any]:
    """A cell's nbgrader metadata, {} where a hand-edited notebook holds something else there."""
    metadata = cell.get("metadata")
    nbgrader = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return nbgrader if isinstance(nbgrader, dict) else {}


def drop_unreadable_nbgrader_metadata(nb: dict[str, Any]) -> int:
    """Make plain cells of cells whose nbgrader metadata nbgrader cannot read; returns how many.

    A hand-edited notebook (or a hostile one) may hold a string where nbgrader expects a mapping,
    or a list as a grade id. nbgrader then fails on the whole submission, and the grader skipped it
    as "no answer cell". As plain cells they cost nothing: nbgrader puts every test cell back from
    the instructor's copy, and the answer cell is still found by the function it defines.
    """
    cells = nb.get("cells")
    dropped = 0
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict):
            continue
        metadata = cell.get("metadata")
        if not isinstance(metadata, dict):
            cell["metadata"] = {}
            dropped += 1
        elif "nbgrader" in metadata and not (isinstance(metadata["nbgrader"], dict)
                                             and isinstance(metadata["nbgrader"].get("grade_id", ""), str)):
            del metadata["nbgrader"]
            dropped += 1
    return dropped


def _source(cell: Any) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def defines(cell: Any, function: str) -> bool:
    """Whether a code cell defines ``function`` at its top level (read as text: a cell need not be
    plain Python to hold the answer)."""
    found = re.search(rf"^(?:async\s+)?def\s+{re.escape(function)}\s*\(", _source(cell), flags=re.MULTILINE)
    return cell.get("cell_type") == "code" and found is not None


def recover_answer_cell(nb: Any, solution_ids: Sequence[str], function: str) -> int | None:
    """Give the answer cell its nbgrader id back when a tool dropped the cells' metadata.

    Some editors and converters (a round trip through a script, some hosted notebooks) keep the
    cells and lose their ``nbgrader`` metadata; without its id the answer would be graded as
    missing. When no cell carries an answer id (and the exercise has one answer cell), the last
    code cell without an id that defines ``function`` becomes the answer cell. Returns its index,
    or None when nothing was missing or nothing could stand in.
    """
    cells = nb.get("cells", [])
    ids = [cell_grade_id(cell) for cell in cells]
    if len(solution_ids) != 1 or set(ids) & set(solution_ids):
        return None
    found = [i for i, cell in enumerate(cells) if isinstance(cell, dict) and ids[i] is None and defines(cell, function)]
    if not found:
        return None
    metadata = cells[found[-1]].setdefault("metadata", {})
    metadata["nbgrader"] = type(metadata)(grade=False, grade_id=solution_ids[0], locked=False, schema_version=3,
                                          solution=True, task=False)
    return found[-1]
