"""Every notebook shows a picture before any cell runs, and `make figures` rebuilds them all.

A reader on GitHub or nbviewer sees only committed files: each notebook links an SVG from its
markdown before its first code cell, every linked file exists, and drawing again from the
recorded runs (notebooks/figures/recorded.json) gives the same bytes. A slow test records the
runs again on real ranks and finds the same values.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
FIGURES = NOTEBOOKS / "figures"
sys.path.insert(0, str(NOTEBOOKS / "_build"))
import figures  # noqa: E402

sys.path.pop(0)
LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
STEMS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("stem", STEMS)
def test_a_picture_before_the_first_code_cell(stem: str) -> None:
    nb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    links = [link for c in nb.cells[:first_code] if c.cell_type == "markdown" for link in LINK.findall(c.source)]
    assert links, f"{stem}: no picture before the first code cell"
    for link in links:
        assert (NOTEBOOKS / link).is_file(), f"{stem}: {link} is missing"
        assert link.endswith(".svg")


def test_every_linked_image_exists() -> None:
    for path in NOTEBOOKS.rglob("*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                for link in LINK.findall(cell.source):
                    if not link.startswith(("http://", "https://")):
                        assert (path.parent / link).is_file(), f"{path.name}: {link}"


def test_make_figures_rebuilds_the_committed_pictures(tmp_path: Path) -> None:
    written = figures.draw(tmp_path)
    committed = sorted(p.name for p in FIGURES.glob("*.svg"))
    assert sorted(p.name for p in written) == committed
    for path in written:
        assert path.read_bytes() == (FIGURES / path.name).read_bytes(), f"{path.name}: run make figures"
        assert path.read_text().startswith("<svg ")


def test_the_make_target_draws_them() -> None:
    done = subprocess.run(["make", "-s", "figures", f"PY={sys.executable}", "STAMP="], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("wrote notebooks/figures/") == len(list(FIGURES.glob("*.svg")))
    assert subprocess.run(["git", "diff", "--quiet", "--", str(FIGURES)], cwd=ROOT).returncode == 0


@pytest.mark.slow
def test_the_recorded_runs_are_what_the_ranks_do() -> None:
    assert figures.record() == json.loads(figures.RECORDED.read_text())
