"""Write notebooks/NN_*.ipynb from the chapter modules next to this file.

Run from anywhere:  .venv/bin/python notebooks/_build/build.py
With --check it writes nothing and exits 1 if a committed notebook differs from its source.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
NOTEBOOKS = HERE.parent
sys.path.insert(0, str(HERE))

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


def render(module_name: str) -> tuple[Path, str]:
    from nbkit import notebook

    mod = importlib.import_module(module_name)
    nb = notebook(mod.STEM, mod.CELLS)
    return NOTEBOOKS / f"{mod.STEM}.ipynb", nbformat.writes(nb) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    only = [a for a in argv if not a.startswith("-")]
    stale = []
    for name in CHAPTERS:
        if only and not any(name.startswith(o) or name[2:].startswith(o) for o in only):
            continue
        try:
            path, text = render(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            print(f"skip {name}: not written yet")
            continue
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(NOTEBOOKS.parent)}")
    if stale:
        print("out of date (run notebooks/_build/build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
