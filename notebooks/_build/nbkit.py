"""Small helpers that turn plain Python strings into notebook cells.

Why a generator: twelve notebooks share one template (learning goals, the idea, predict then
run, pitfalls, self-check, summary, next). Writing them as Python keeps the template, the
cell ids and the metadata identical everywhere and keeps diffs readable. The .ipynb files are
committed too, without outputs, so a learner never needs this script.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

import nbformat
from nbformat import NotebookNode

# Headings every notebook carries, in this order (tests/test_notebooks.py checks them).
TEMPLATE_HEADINGS = (
    "Learning goals",
    "The idea",
    "Predict, then run",
    "Pitfalls",
    "Self-check",
    "Summary",
    "Next",
)

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def _clean(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def md(text: str) -> NotebookNode:
    """A markdown cell from an indented triple-quoted string."""
    return nbformat.v4.new_markdown_cell(_clean(text))


def code(source: str, tags: Iterable[str] = ()) -> NotebookNode:
    """A code cell without outputs; ``tags`` go into the cell metadata (nbclient reads them)."""
    cell = nbformat.v4.new_code_cell(_clean(source))
    tags = list(tags)
    if tags:
        cell.metadata["tags"] = tags
    return cell


def dist(body: str, options: str = "-n 4", tags: Iterable[str] = ()) -> NotebookNode:
    """A ``%%dist`` cell: ``body`` runs on every rank."""
    return code(f"%%dist {options}\n" + _clean(body), tags=tags)


def predict(question: str, answer: str) -> NotebookNode:
    """A 'predict, then run' question whose answer stays folded until the learner opens it."""
    q = _clean(question)
    a = _clean(answer)
    return md(f"{q}\n\n<details><summary>Answer</summary>\n\n{a}\n\n</details>")


def notebook(stem: str, cells: list[NotebookNode]) -> NotebookNode:
    """A notebook with stable cell ids (``<stem>-NN``) so regenerating it changes nothing."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(cells):
        cell["id"] = f"{stem.split('_')[0]}-{i:02d}"
    nb.cells = cells
    nbformat.validate(nb)
    return nb


def setup(world_size: int = 4) -> NotebookNode:
    """The first code cell of every notebook: load the magics and wait until the ranks are up."""
    return code(f"%load_ext distlab\n%dist_start -n {world_size}")
