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

from distlab.svg import text_width

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


@pytest.mark.parametrize("lang", sorted(figures.EDITION_FIGURES))
def test_make_figures_rebuilds_the_committed_pictures(lang: str, tmp_path: Path) -> None:
    committed_in = figures.EDITION_FIGURES[lang]
    written = figures.draw(tmp_path, lang=lang)
    committed = sorted(p.name for p in committed_in.glob("*.svg"))
    assert sorted(p.name for p in written) == committed
    for path in written:
        assert path.read_bytes() == (committed_in / path.name).read_bytes(), f"{lang} {path.name}: run make figures"
        assert path.read_text().startswith("<svg ")


TEXT = re.compile(r"<text [^>]*>([^<]*)</text>")
SVG_WIDTH = re.compile(r'<svg [^>]*width="(\d+)"')


@pytest.mark.parametrize("name", sorted(p.name for p in FIGURES.glob("*.svg")))
def test_a_chinese_reader_sees_the_same_picture_in_chinese(name: str) -> None:
    """Same cells and numbers; every caption and title in Chinese (operator names and "rank" stay,
    as in the text); the picture wide enough for its wider characters."""
    english, chinese = (FIGURES / name).read_text(), (NOTEBOOKS / "zh" / "figures" / name).read_text()
    assert english.count("<rect") == chinese.count("<rect")
    numbers = [t for t in TEXT.findall(english) if re.fullmatch(r"[-0-9.e+]+", t)]
    assert numbers == [t for t in TEXT.findall(chinese) if re.fullmatch(r"[-0-9.e+]+", t)]
    words = [t for t in TEXT.findall(chinese) if re.search(r"[A-Za-z]{2,} +[A-Za-z]{2,}", t)]
    assert not words, f"{name}: English left in the Chinese picture: {words}"
    assert re.search(r"[\u4e00-\u9fff]", chinese), name
    widest = max(text_width(t) for t in TEXT.findall(chinese))
    assert int(SVG_WIDTH.search(chinese).group(1)) >= widest


def test_a_word_without_its_translation_fails_the_drawing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new English caption stops `make figures` with a stub to fill in, never an English word in
    the Chinese picture."""
    real = figures.drawings
    monkeypatch.setattr(figures, "drawings", lambda data, tr=str: {**real(data, tr), "x.svg": tr("a new caption")})
    with pytest.raises(figures.Untranslated, match="a new caption"):
        figures.draw(tmp_path, lang="zh")
    assert not list(tmp_path.iterdir())


def test_the_make_target_draws_them() -> None:
    done = subprocess.run(["make", "-s", "figures", f"PY={sys.executable}", "STAMP="], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("wrote notebooks/figures/") == len(list(FIGURES.glob("*.svg")))
    assert done.stdout.count("wrote notebooks/zh/figures/") == len(list(FIGURES.glob("*.svg")))
    assert subprocess.run(["git", "diff", "--quiet", "--", str(FIGURES), str(NOTEBOOKS / "zh" / "figures")],
                          cwd=ROOT).returncode == 0


@pytest.mark.slow
def test_the_recorded_runs_are_what_the_ranks_do() -> None:
    assert figures.record() == json.loads(figures.RECORDED.read_text())
