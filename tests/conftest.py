"""How the suite spreads over parallel workers (``pytest -n``, pytest-xdist).

Most time in this suite is spent waiting: for kernels, ranks, nbgrader and a browser. Two or
three workers overlap those waits. Tests that share a module- or package-scoped fixture (one
kernel, one graded course, one JupyterLab server) go to the same worker, so each such fixture is
built once and its tests run in the order they are written; every other test may run anywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
_SHARED_SCOPES = {"module", "package", "session"}


def _shared_fixture(item: pytest.Item) -> str | None:
    """One name for the suite's own wider-than-a-test fixtures that ``item`` uses (None: none)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    shared = []
    for name in info.names_closure:
        for definition in info.name2fixturedefs.get(name, ()):
            source = Path(definition.func.__code__.co_filename).resolve()
            if definition.scope in _SHARED_SCOPES and _TESTS in source.parents:
                shared.append(f"{source.relative_to(_TESTS)}::{name}")
    return min(shared, default=None)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marked as each test is collected, before xdist reads the groups in collection_modifyitems."""
    shared = _shared_fixture(item)
    if shared is not None:
        item.add_marker(pytest.mark.xdist_group(shared))
