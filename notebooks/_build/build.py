"""Write both editions of the course from the chapter modules next to this file.

English: notebooks/NN_*.ipynb, from the chapter modules. Chinese: notebooks/zh/NN_*.ipynb, the
same cells with every markdown cell, code comment and printed caption replaced by its entry in
notebooks/_build/zh/NN_*.md (see distlab.edition). Code is the same in both; only comments and captions differ.

    .venv/bin/python notebooks/_build/build.py            write every notebook
    .venv/bin/python notebooks/_build/build.py --check    write nothing; exit 1 if a committed
                                                          notebook differs from its source or a
                                                          translation is missing or stale
    .venv/bin/python notebooks/_build/build.py --todo 03  print catalogue stubs (the English
                                                          text under its key) still to translate
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
NOTEBOOKS = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(NOTEBOOKS.parent / "src"))

from distlab.edition import Catalogue, stubs, translate_cells  # noqa: E402

CHAPTERS = [
    "ch00_welcome",
    "ch01_process_groups",
    "ch02_point_to_point",
    "ch03_broadcast",
    "ch04_scatter_gather",
    "ch05_reduce_all_reduce",
    "ch06_all_gather",
    "ch07_reduce_scatter",
    "ch08_all_to_all",
    "ch09_composing",
    "ch10_training",
    "ch11_measuring",
    "ch12_cost_at_scale",
]
EDITIONS = {"en": NOTEBOOKS, "zh": NOTEBOOKS / "zh"}


def catalogue_path(stem: str, lang: str) -> Path:
    return HERE / lang / f"{stem}.md"


def render(module_name: str, lang: str = "en") -> tuple[Path, str, str]:
    """(where the notebook goes, its text, what is wrong with its translation or '')."""
    from nbkit import notebook

    mod = importlib.import_module(module_name)
    cells, problem = mod.CELLS, ""
    if lang != "en":
        catalogue = Catalogue.load(catalogue_path(mod.STEM, lang))
        cells, problems = translate_cells(cells, catalogue)
        problem = problems.describe(catalogue.path.relative_to(NOTEBOOKS.parent)) if problems else ""
    nb = notebook(mod.STEM, cells)
    if lang != "en":
        nb.metadata["distlab"] = {"lang": lang}
    return EDITIONS[lang] / f"{mod.STEM}.ipynb", nbformat.writes(nb) + "\n", problem


def todo(module_name: str, lang: str = "zh") -> str:
    mod = importlib.import_module(module_name)
    _, problems = translate_cells(mod.CELLS, Catalogue.load(catalogue_path(mod.STEM, lang)))
    return stubs(problems.missing) if problems.missing else ""


def main(argv: list[str]) -> int:
    check = "--check" in argv
    only = [a for a in argv if not a.startswith("-")]
    chosen = [n for n in CHAPTERS
              if not only or any(n.startswith(o) or n[2:].startswith(o) for o in only)]
    if "--todo" in argv:
        for name in chosen:
            sys.stdout.write(todo(name))
        return 0
    stale, untranslated = [], []
    for lang, folder in EDITIONS.items():
        for name in chosen:
            path, text, problem = render(name, lang)
            if problem:
                untranslated.append(problem)
                continue
            if check:
                if not path.exists() or path.read_text(encoding="utf-8") != text:
                    stale.append(str(path.relative_to(NOTEBOOKS)))
            else:
                folder.mkdir(exist_ok=True)
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.relative_to(NOTEBOOKS.parent)}")
    if untranslated:
        print("translations missing or stale (fill them in; `--todo NN` prints stubs):")
        print("\n".join(untranslated))
    if stale:
        print("out of date (run notebooks/_build/build.py):", ", ".join(stale))
    return 1 if stale or untranslated else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
