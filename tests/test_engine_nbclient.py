"""Headless: the magic behaves under nbclient (as nbconvert and nbgrader run it) as in JupyterLab."""

from __future__ import annotations

import nbformat
import pytest
from kernel_session import AsyncUnixSocketKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def _notebook(*sources: str) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    return notebook


def _run(notebook: nbformat.NotebookNode, timeout: int = 120) -> NotebookClient:
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            kernel_manager_class=AsyncUnixSocketKernelManager)
    client.execute()
    return client


def _streams(cell: nbformat.NotebookNode, name: str) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == name)


def test_successful_cells_write_labelled_stdout_and_no_stderr() -> None:
    notebook = _notebook(
        "%load_ext distlab",
        "%%dist -n 2\nimport warnings\nt = torch.ones(3)\ndist.all_reduce(t)\nprint(t.tolist())",
        "%%dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(torch.nn.Linear(4, 1))\nmodel(torch.ones(2, 4)).sum().backward()\n"
        "print(model.module.weight.grad.tolist())",
    )
    _run(notebook)
    for cell in notebook.cells:
        assert _streams(cell, "stderr") == ""
        assert not [o for o in cell.outputs if o.output_type == "error"]
    assert sorted(_streams(notebook.cells[1], "stdout").splitlines()) == [
        "[rank 0] [2.0, 2.0, 2.0]", "[rank 1] [2.0, 2.0, 2.0]"]
    assert _streams(notebook.cells[2], "stdout").count("[[2.0, 2.0, 2.0, 2.0]]") == 2


def test_a_failing_rank_fails_the_notebook_run() -> None:
    notebook = _notebook("%load_ext distlab", "%%dist -n 2\nif rank == 1:\n    raise ValueError('bad rank')",
                         "print('never reached')")
    with pytest.raises(CellExecutionError) as info:
        _run(notebook)
    assert "RankError" in str(info.value) and "bad rank" in str(info.value)
    assert notebook.cells[2].outputs == []


def test_torchrun_style_code_runs_unchanged() -> None:
    script = (
        "%%dist -n 2\n"
        "import os\n"
        "def main():\n"
        "    dist.init_process_group('gloo')  # already done by distlab: harmless\n"
        "    r = int(os.environ['RANK'])\n"
        "    t = torch.tensor([r + 1.0])\n"
        "    dist.all_reduce(t)\n"
        "    print(os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'], t.item())\n"
        "    dist.destroy_process_group()\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    notebook = _notebook("%load_ext distlab", script, "%%dist\nprint(dist.get_world_size())")
    _run(notebook)
    out = _streams(notebook.cells[1], "stdout")
    assert "[rank 0] 2 0 3.0" in out and "[rank 1] 2 1 3.0" in out
    assert sorted(_streams(notebook.cells[2], "stdout").splitlines()) == ["[rank 0] 2", "[rank 1] 2"]
