"""The course notebooks as a learner meets them in JupyterLab: run everything, read the output."""

from __future__ import annotations

import nbformat
import pytest

from browser.labserver import REPO

pytestmark = pytest.mark.browser

WELCOME = "notebooks/00_welcome.ipynb"
WELCOME_ZH = "notebooks/zh/00_welcome.ipynb"
COMPOSING = "notebooks/09_composing.ipynb"


def tagged_cells(path: str, tag: str) -> set[int]:
    """Indices of the cells of `path` carrying `tag` (the browser shows cells in file order)."""
    nb = nbformat.read(REPO / path, as_version=4)
    return {i for i, cell in enumerate(nb.cells) if tag in cell.metadata.get("tags", [])}


def test_welcome_runs_on_four_ranks_without_errors(lab_ui):
    nb = lab_ui.open(WELCOME)
    nb.run_all(expected_failures=tagged_cells(WELCOME, "raises-exception"))

    unrun = nb.unrun_cells()
    assert not unrun, f"Run All stopped before cells {unrun}: {nb.error_outputs()}"
    outputs = "".join(nb.output_text(i) for i in nb.code_cell_indices())
    for rank in range(4):
        assert f"[rank {rank}]" in outputs, f"no output labelled [rank {rank}]"
    # only the cell that shows a failing rank on purpose (tagged raises-exception) may show one
    expected_failures = tagged_cells(WELCOME, "raises-exception")
    shown = {i for i, _ in nb.error_outputs()}
    assert shown <= expected_failures, nb.error_outputs()

    # the kit answers JupyterLab's "official Jupyter news?" question for the learner
    assert not nb.page.get_by_text("official Jupyter news").count(), "news pop-up shown"

    hello = nb.find_cell("hello from rank")
    nb.cells.nth(hello).scroll_into_view_if_needed()
    nb.screenshot("welcome_ran_all")
    lab_ui.assert_console_clean()


def test_the_chinese_welcome_runs_and_the_kit_answers_in_chinese(lab_ui):
    """Opened from the English `make lab`: the kernel starts in notebooks/zh/ and speaks Chinese."""
    nb = lab_ui.open(WELCOME_ZH)
    expected_failures = tagged_cells(WELCOME_ZH, "raises-exception")
    nb.run_all(expected_failures=expected_failures)

    unrun = nb.unrun_cells()
    assert not unrun, f"Run All stopped before cells {unrun}: {nb.error_outputs()}"
    outputs = "".join(nb.output_text(i) for i in nb.code_cell_indices())
    assert "[rank 3]" in outputs and "自测通过" in outputs, outputs[-500:]
    shown = nb.error_outputs()
    assert {i for i, _ in shown} == expected_failures, shown
    assert all("个失败" in text for _, text in shown), shown  # "1 of 4 ranks failed", in Chinese
    assert nb.page.get_by_text("核心思想").count(), "the Chinese prose is shown"
    nb.screenshot("welcome_zh_ran_all")
    lab_ui.assert_console_clean()


def test_ring_stepper_steps_change_the_picture(lab_ui):
    nb = lab_ui.open(COMPOSING)
    # read top-down up to the stepper and run it; the cells after it are not needed here
    at = nb.find_cell("ring_stepper(")
    nb.run_all_above(at)
    nb.run_cell(at)
    assert not nb.error_outputs(), nb.error_outputs()

    cell = nb.cells.nth(at)
    stepper = cell.locator(".jp-OutputArea .widget-vbox").first
    stepper.wait_for()
    stepper.scroll_into_view_if_needed()
    picture = stepper.locator(".widget-html-content")
    readout = stepper.locator(".widget-readout")
    forward = stepper.locator("button[title='next step']")
    back = stepper.locator("button[title='previous step']")

    # the slider's range is the number of recorded ring steps
    last = int(float(str(stepper.locator(".noUi-handle").get_attribute("aria-valuemax"))))
    assert last >= 2, "the ring stepper has fewer than two steps"
    assert readout.text_content() == "0"
    seen = [picture.inner_html()]
    shots = [stepper.screenshot(path=str(nb.screenshot_dir / "ring_stepper_step0.png"))]
    for step in range(1, last + 1):
        forward.click()
        # the kernel re-renders the picture and sends it back; wait for the new one
        nb.page.wait_for_function(
            "([el, old]) => el.innerHTML !== old", arg=[picture.element_handle(), seen[-1]]
        )
        assert readout.text_content() == str(step)
        seen.append(picture.inner_html())
        shots.append(stepper.screenshot(path=str(nb.screenshot_dir / f"ring_stepper_step{step}.png")))
    assert len(set(seen)) == len(seen), "two steps show the same picture"
    assert len(set(shots)) == len(shots), "two steps look the same on screen"

    back.click()
    nb.page.wait_for_function(
        "([el, old]) => el.innerHTML === old", arg=[picture.element_handle(), seen[-2]]
    )
    assert readout.text_content() == str(last - 1)
    nb.screenshot("ring_stepper")
    lab_ui.assert_console_clean()
