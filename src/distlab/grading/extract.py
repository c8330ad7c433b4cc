"""Pull the graded answer out of a submitted notebook: only the answer cells, by nbgrader id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def solution_source(nb: Any, solution_ids: Sequence[str]) -> str:
    """The source of the cells whose nbgrader grade_id is one of ``solution_ids``.

    ``nb`` is a notebook as nbformat reads it or as plain JSON.

    Cells are joined in notebook order; a missing answer cell gives "" (every part then fails
    with "... is not defined"), never an error.
    """
    parts = []
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("grade_id") in solution_ids:
            source = cell.get("source", "")
            parts.append("".join(source) if isinstance(source, list) else str(source))
    return "\n\n".join(parts)
