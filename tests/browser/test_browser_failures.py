"""What a learner sees in JupyterLab when ranks hang or when they press the stop button.

Both failures must end the cell with a visible report and leave the notebook usable: the
next `%%dist` cell runs on live ranks without restarting the kernel.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser

NEXT_CELL = "%%dist -n 2\nprint('alive', rank)"
# a learner has run cells before: the two ranks are up when the deadlock cell starts
WARM_UP = "%%dist -n 2\nprint('ready', rank)"


def test_deadlock_shows_hang_report_and_next_cell_runs(lab_ui, scratch_notebook):
    path = scratch_notebook(
        "deadlock",
        [
            "%load_ext distlab",
            WARM_UP,
            # both ranks receive first and nobody sends: a deadlock the deadline must end
            "%%dist -n 2 --timeout 3\nbuf = torch.zeros(1)\ndist.recv(buf, src=1 - rank)",
            NEXT_CELL,
        ],
    )
    nb = lab_ui.open(path)
    nb.run_cell(0)
    nb.run_cell(1)

    report = nb.run_cell(2, timeout_ms=60_000)
    nb.screenshot("deadlock_hang_report")
    assert "RankTimeout" in report, report
    # the report shows where each rank is stuck: the cell's own line, for both ranks
    assert "dist.recv(buf, src=1 - rank)" in report, report
    assert "ranks 0-1" in report or ("rank 0" in report and "rank 1" in report), report

    after = nb.run_cell(3, timeout_ms=60_000)
    nb.screenshot("deadlock_next_cell")
    assert "[rank 0] alive 0" in after and "[rank 1] alive 1" in after, after
    assert [i for i, _ in nb.error_outputs()] == [2], nb.error_outputs()
    lab_ui.assert_console_clean()


def test_stop_button_interrupts_ranks_and_next_cell_runs(lab_ui, scratch_notebook):
    path = scratch_notebook(
        "interrupt",
        [
            "%load_ext distlab",
            "%%dist -n 2\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)",
            NEXT_CELL,
        ],
    )
    nb = lab_ui.open(path)
    nb.run_cell(0)

    nb.run_cell(1, wait=False)
    nb.wait_output(1, "[rank 1] sleeping")  # both ranks are inside the long cell now
    nb.wait_output(1, "[rank 0] sleeping")
    nb.interrupt()
    # far sooner than the 60 s sleep: the ranks themselves were stopped
    nb.wait_cell_done(1, timeout_ms=20_000)
    stopped = nb.output_text(1)
    nb.screenshot("interrupt_stopped")
    assert "interrupt" in stopped.lower(), stopped

    # ranks that were still sleeping would hold this cell for the rest of the minute
    after = nb.run_cell(2, timeout_ms=20_000)
    nb.screenshot("interrupt_next_cell")
    assert "[rank 0] alive 0" in after and "[rank 1] alive 1" in after, after
    assert [i for i, _ in nb.error_outputs()] == [1], nb.error_outputs()
    lab_ui.assert_console_clean()


def test_a_progress_bar_is_one_line_per_rank_updated_in_place(lab_ui, scratch_notebook):
    """tqdm redraws its line with "\\r": the learner sees one bar per rank move and end at 100%."""
    path = scratch_notebook(
        "progress",
        [
            "%load_ext distlab",
            "%%dist -n 2\nfrom tqdm import tqdm\nimport time\n"
            "for step in tqdm(range(40), mininterval=0.05):\n    time.sleep(0.05)\nprint('after', rank)",
        ],
    )
    nb = lab_ui.open(path)
    nb.run_cell(0)
    nb.run_cell(1, wait=False)
    nb.wait_output(1, "[rank 1] ")  # the bars are on screen while the ranks work
    nb.wait_cell_done(1, timeout_ms=60_000)
    shown = nb.output_text(1)
    nb.screenshot("progress_bars")
    assert shown.count("40/40") == 2 and shown.count("it/s]") == 2, shown  # one finished bar per rank
    assert "[rank 0] after 0" in shown and "[rank 1] after 1" in shown, shown
    assert nb.error_outputs() == [], nb.error_outputs()
    lab_ui.assert_console_clean()


def test_a_live_picture_is_one_output_per_rank_and_later_prints_show_up(lab_ui, scratch_notebook, tmp_path):
    """What the learner sees in JupyterLab: `clear_output(wait=True); display(...)` in a loop
    leaves one picture per rank, the last one; and a line a rank's thread prints after the cell
    ended appears under it without running another cell."""
    go = tmp_path / "go"
    path = scratch_notebook(
        "live_picture",
        [
            "%load_ext distlab",
            "%%dist -n 2\nfrom IPython.display import display, clear_output, HTML\nimport os, threading, time\n"
            "for step in range(5):\n    clear_output(wait=True)\n"
            "    display(HTML(f\"<p class='live'>step {step} on {rank}</p>\"))\n"
            f"def later():\n    while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
            "    print('between cells', rank)\n"
            "threading.Thread(target=later, daemon=True).start()",
        ],
    )
    nb = lab_ui.open(path)
    nb.run_cell(0)
    nb.run_cell(1, timeout_ms=60_000)
    live = nb.cells.nth(1).locator("p.live").all_text_contents()
    assert sorted(live) == ["step 4 on 0", "step 4 on 1"], live
    go.write_text("")
    nb.wait_output(1, "[rank 1] between cells 1")
    nb.wait_output(1, "[rank 0] between cells 0")
    nb.screenshot("live_picture")
    assert nb.error_outputs() == [], nb.error_outputs()
    lab_ui.assert_console_clean()
