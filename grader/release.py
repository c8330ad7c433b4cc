"""The student version as committed in exercises/: nbgrader's release, minus what varies by run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat


def normalise(nb: Any) -> Any:
    """Drop outputs and volatile metadata so a fresh release compares equal to the committed one."""
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
        cell.metadata.pop("collapsed", None)
    nb.metadata = nbformat.from_dict({
        "kernelspec": nb.metadata.get("kernelspec", {}),
        "language_info": {"name": nb.metadata.get("language_info", {}).get("name", "python")},
    })
    nbformat.validate(nb)
    return nb


TRANSLATIONS = Path(__file__).resolve().parent / "i18n"


def catalogue_path(assignment: str, lang: str) -> Path:
    return TRANSLATIONS / lang / f"{assignment}.md"


def translate(nb: Any, assignment: str, lang: str) -> tuple[Any, str]:
    """The student release in another language: same cells, ids, points and code; translated
    prose, comments and captions, with nbgrader's checksums of the cells that carry one recomputed
    (the grader accepts a locked code cell that is exactly this translation of the English one:
    distlab.grading.nbgrader_hooks.RestoreDeletedTests). Returns (notebook, what is missing or
    stale in the catalogue, '' when nothing)."""
    from nbgrader.utils import compute_checksum

    from distlab.edition import Catalogue, translate_cells

    catalogue = Catalogue.load(catalogue_path(assignment, lang))
    nb = nbformat.from_dict(nb)
    cells, problems = translate_cells(nb.cells, catalogue, relink=False)
    for cell in cells:
        info = cell.metadata.get("nbgrader", {})
        if "checksum" in info:
            info["checksum"] = compute_checksum(cell)
    nb.cells = cells
    nb.metadata["distlab"] = {"lang": lang}
    nbformat.validate(nb)
    return nb, problems.describe(catalogue.path) if problems else ""
