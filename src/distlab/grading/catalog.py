"""Which exercises can be graded, discovered from the package and read without importing torch.

Each exercise module (``ex<N>_<name>.py`` in this package) declares its facts once, in
``EXERCISE = Exercise(key=..., assignment=..., function=..., solution_ids=..., parts=PARTS)``.
The instructor CLI, nbgrader's configuration, release and the tests need only those names and
cell ids, and must not pay for (or depend on) torch, which every exercise module imports. So this
module reads the declaration from the module's source with ``ast`` instead of importing it;
``tests/test_grading_contract.py`` checks that what it reads equals what the imported module holds.
A new exercise is a new module: nothing else lists them.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distlab.grading.spec import Exercise, answer_cells

_PACKAGE = Path(__file__).resolve().parent
_MODULE_NAME = re.compile(r"ex(\d+)_\w+\.py")


@dataclass(frozen=True)
class Entry:
    key: str          # the short name notebooks use: "ex1"
    assignment: str   # the nbgrader assignment and notebook name
    module: str       # where the parts, the rank driver and the judge live
    function: str     # what the student defines
    solution_ids: tuple[str, ...]  # the answer cells whose source is graded
    parts: tuple[str, ...]

    def load(self) -> Exercise:
        exercise: Exercise = importlib.import_module(self.module).EXERCISE
        return exercise


class _Declaration:
    """The module-level names of one exercise module, evaluated as literals where they are."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names: dict[str, ast.expr] = {}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.names[node.targets[0].id] = node.value

    def value(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name):
            return self.value(self.names[node.id])
        if isinstance(node, ast.Tuple):
            return tuple(self.value(item) for item in node.elts)
        return ast.literal_eval(node)

    def part_names(self, node: ast.expr) -> tuple[str, ...]:
        """The first argument of every ``Part(...)`` in the parts table, in source order."""
        if isinstance(node, ast.Name):
            node = self.names[node.id]
        calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                 and c.func.id == "Part"]
        calls.sort(key=lambda c: (c.lineno, c.col_offset))
        return tuple(self.value(c.args[0]) for c in calls)

    def entry(self) -> Entry:
        call = self.names.get("EXERCISE")
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Exercise"):
            raise ValueError(f"{self.path.name}: no EXERCISE = Exercise(...) declaration")
        fields = {k.arg: k.value for k in call.keywords if k.arg}
        return Entry(
            key=self.value(fields["key"]), assignment=self.value(fields["assignment"]),
            module=f"distlab.grading.{self.path.stem}", function=self.value(fields["function"]),
            solution_ids=answer_cells(self.value(fields["function"]),
                                      self.value(fields["solution_ids"]) if "solution_ids" in fields else ()),
            parts=self.part_names(fields["parts"]),
        )


def _discover() -> tuple[Entry, ...]:
    found = [(int(m.group(1)), path) for path in _PACKAGE.iterdir() if (m := _MODULE_NAME.fullmatch(path.name))]
    return tuple(_Declaration(path).entry() for _, path in sorted(found))


ENTRIES = _discover()


def entry(name: str) -> Entry:
    """An exercise by its short key ("ex1") or its assignment name ("ex1_all_reduce_rs_ag")."""
    for item in ENTRIES:
        if name in (item.key, item.assignment):
            return item
    raise KeyError(f"no exercise {name!r}; known: {', '.join(e.assignment for e in ENTRIES)}")
