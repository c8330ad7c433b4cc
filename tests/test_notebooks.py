"""The course notebooks: order, template, committed state, and a headless run of each.

A learner relies on three things: the notebooks come in order with nothing missing, each one
follows the same template (so they know where the answer and the self-check are), and each
runs top to bottom without an error or a stray warning. The run tests execute every notebook
in a fresh kernel of this interpreter through nbclient, as `jupyter nbconvert --execute` would.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from kernel_session import AsyncUnixSocketKernelManager

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = [
    "00_welcome",
    "01_process_groups",
    "02_point_to_point",
    "03_broadcast",
    "04_scatter_gather",
    "05_reduce_all_reduce",
    "06_all_gather",
    "07_reduce_scatter",
    "08_all_to_all",
    "09_composing",
    "10_training",
    "11_measuring",
    "12_cost_at_scale",
]
TEMPLATE = ["Learning goals", "The idea", "Predict, then run", "Pitfalls", "Self-check",
            "Summary", "Next"]
RAISES = "raises-exception"
# Failing on purpose must mean failing on the ranks (a deadline, a rank's error), never a typo.
EXPECTED_FAILURES = {"RankError", "RankTimeout"}
CELL_TIMEOUT = 300  # seconds per cell; a notebook takes well under a minute on 2 cores


def _read(stem: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)


def _headings(nb: nbformat.NotebookNode) -> list[str]:
    return [m.group(1).strip() for c in nb.cells if c.cell_type == "markdown"
            for m in re.finditer(r"^#{1,6}\s+(.+)$", c.source, flags=re.MULTILINE)]


def _code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_numbering_has_no_gaps() -> None:
    found = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert found == EXPECTED
    assert [int(s[:2]) for s in found] == list(range(len(found)))


@pytest.mark.parametrize("stem", EXPECTED)
def test_template(stem: str) -> None:
    nb = _read(stem)
    headings = _headings(nb)
    assert headings and headings[0].startswith(f"{stem[:2]} ·"), headings[:1]
    positions = []
    for wanted in TEMPLATE:
        hits = [i for i, h in enumerate(headings) if h.lower() == wanted.lower()]
        assert hits, f"{stem}: no '## {wanted}' heading"
        positions.append(hits[0])
    assert positions == sorted(positions), f"{stem}: template headings out of order"

    code = _code_cells(nb)
    assert code[0].source.startswith("%load_ext distlab"), "first code cell loads the extension"
    assert any(c.source.startswith("%%dist") for c in code), "runs something on the ranks"
    assert any("show_buffers" in c.source for c in code), "draws the buffers from code"
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "<details><summary>Answer</summary>" in markdown, "a hidden answer to predict"
    after_self_check = nb.cells[[i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                                 and "## Self-check" in c.source][0]:]
    assert any(c.cell_type == "code" and "assert " in c.source for c in after_self_check), \
        "the self-check asserts"


@pytest.mark.parametrize("stem", EXPECTED)
def test_committed_without_outputs(stem: str) -> None:
    nb = _read(stem)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for cell in _code_cells(nb):
        assert cell.outputs == [], f"{stem}: outputs in cell {cell.get('id')}"
        assert cell.execution_count is None, f"{stem}: execution count in cell {cell.get('id')}"
        assert "execution" not in cell.metadata, f"{stem}: timing metadata in cell {cell.get('id')}"


def test_notebooks_match_their_generator() -> None:
    """notebooks/_build writes the notebooks; the committed files must be its current output."""
    proc = subprocess.run([sys.executable, str(NOTEBOOKS / "_build" / "build.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kernel_is_this_interpreter() -> None:
    """nbclient's "python3" kernel must run this venv's Python, where distlab and torch are."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.connection_file = "unused.json"
    argv = km.format_kernel_cmd()
    assert Path(argv[0]).resolve() == Path(sys.executable).resolve(), argv


# `%%dist -n 4` / `%dist_start -n 4` at the start of a code cell: what a learner edits to try
# another rank count. Cells that ask for a particular count (`-n 2` in notebook 02) keep it.
SHOWN_WARNING = re.compile(r"(\.py|<dist cell \d+>):\d+: \w*Warning: ")
RANK_OPTION = re.compile(r"^(%%?dist(?:_start)?\b[^\n]*?)-n 4\b", re.MULTILINE)


def with_rank_count(nb: nbformat.NotebookNode, world_size: int) -> int:
    """Change every default `-n 4` to `-n world_size`, as a learner would; returns how many."""
    changed = 0
    for cell in _code_cells(nb):
        source, n = RANK_OPTION.subn(rf"\g<1>-n {world_size}", cell.source)
        cell.source, changed = source, changed + n
    return changed


def _run_clean(stem: str, world_size: int, monkeypatch: pytest.MonkeyPatch,
               folder: Path = NOTEBOOKS) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv("DISTLAB_LANG", raising=False)  # each edition's folder chooses its language
    nb = nbformat.read(folder / f"{stem}.ipynb", as_version=4)
    if world_size != 4:
        assert with_rank_count(nb, world_size) > 0, f"{stem}: no `-n 4` to change"
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT,
                            kernel_manager_class=AsyncUnixSocketKernelManager,
                            resources={"metadata": {"path": str(folder)}})
    client.execute()  # raises CellExecutionError on an error in a cell not tagged raises-exception

    for cell in _code_cells(nb):
        where = f"{stem} on {world_size} ranks, cell {cell.get('id')}:\n{cell.source[:200]}"
        stderr = [o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr"]
        assert not stderr, f"stderr output in {where}\n{''.join(stderr)}"
        # a warning Python shows on a rank (file:line: SomeWarning) is noise a learner should not see
        shown = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert not SHOWN_WARNING.search(shown), f"a warning in {where}\n{shown}"
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if RAISES in cell.metadata.get("tags", []):
            assert errors, f"expected this cell to fail on the ranks: {where}"
            assert errors[0].ename in EXPECTED_FAILURES, f"{errors[0].ename} in {where}"
        else:
            assert not errors, f"error output in {where}"
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("stem", EXPECTED)
def test_notebook_runs_clean(stem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _run_clean(stem, 4, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("stem", EXPECTED)
def test_notebook_runs_on_8_ranks(stem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner who changes every `-n 4` to 8 still gets a notebook that runs clean. (3 ranks:
    the Chinese run below, whose code cells are these, byte for byte: tests/test_editions.py.)"""
    _run_clean(stem, 8, monkeypatch)


def test_rank_count_substitution_reaches_every_default_cell() -> None:
    nb = _read("02_point_to_point")
    total = sum(c.source.count("-n 4") for c in _code_cells(nb))
    assert with_rank_count(nb, 3) == total > 0
    sources = [c.source for c in _code_cells(nb)]
    assert not any("-n 4" in s for s in sources)
    assert any(s.startswith("%%dist -n 2") for s in sources), "a deliberate -n 2 stays"


@pytest.mark.slow
@pytest.mark.parametrize("stem", EXPECTED)
def test_chinese_notebook_runs_clean_on_3_ranks(stem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Chinese edition runs like the English one, and the kit answers in Chinese there. Run
    with every `-n 4` changed to 3, it is also the 3-rank run of every notebook's code."""
    nb = _run_clean(stem, 3, monkeypatch, NOTEBOOKS / "zh")
    shown = "".join(o.get("text", "") for c in _code_cells(nb) for o in c.outputs)
    assert "自测通过" in shown and "self-check passed" not in shown, "the self-check speaks Chinese"
    for cell in _code_cells(nb):
        for error in (o for o in cell.outputs if o.output_type == "error"):
            assert re.search(r"[\u4e00-\u9fff]", error.evalue), f"an English error in {stem}: {error.evalue}"


def test_the_by_hand_launcher_of_notebook_01_stops_the_others_when_one_fails() -> None:
    """Notebook 01 starts two plain processes per init method. When rank 0 cannot listen (another
    program took the port free_port() had found), rank 1 waited for it until the 120 s timeout and
    the notebook failed with TimeoutExpired (seen once in CI); now the other rank is stopped at once
    and the error is rank 0's own, which the demo recognises and retries with new ports."""
    source = next(c.source for c in _read("01_process_groups").cells if c.get("id") == "01-10")
    namespace: dict[str, object] = {}
    exec(source, namespace)  # noqa: S102 - the notebook's own code
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="address already in use"):
            namespace["launch"]([f"tcp://127.0.0.1:{port}"], timeout=60)  # type: ignore[operator]
