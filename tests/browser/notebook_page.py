"""Drive one notebook in JupyterLab the way a learner does: menus, Shift+Enter, the stop button.

Everything here goes through the visible UI (menu items, toolbar buttons, keyboard), so a test
that passes means a learner clicking the same things sees the same result. Assertions about
what the page shows live in the tests; this module only acts and reads.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from playwright.sync_api import Locator, Page

# The open notebook; hidden panels (other tabs) are skipped.
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
_NUMBERED = re.compile(r"^\[\d+\]:$")


class NotebookPage:
    """One notebook opened in its own fresh JupyterLab workspace in `page`."""

    def __init__(
        self, page: Page, url_for: Callable[[str], str], path: str, screenshot_dir: Path
    ) -> None:
        self.page = page
        self.path = path
        self._url_for = url_for
        self.screenshot_dir = screenshot_dir

    # -- opening -----------------------------------------------------------------------------

    def open(self, timeout_ms: int = 90_000) -> NotebookPage:
        """Open the notebook in an empty workspace and wait until its kernel is idle.

        A fresh workspace name means no tabs from an earlier test are restored (each restored
        notebook would start its own kernel and rank pool).
        """
        for attempt in (1, 2):
            workspace = f"t{uuid.uuid4().hex[:8]}"
            url = self._url_for(f"lab/workspaces/{workspace}/tree/{self.path}")
            self.page.goto(url)
            self.page.locator(f"{PANEL} .jp-Cell").first.wait_for(timeout=timeout_ms)
            try:
                self.wait_kernel_idle(timeout_ms)
                return self
            except AssertionError as shown:
                # JupyterLab's own "Error Loading Theme" when a CPU-starved server answered a
                # stylesheet request too late: the page is fine after a reload, so load it once more
                if attempt == 2 or "Error Loading Theme" not in str(shown):
                    raise
        return self

    def wait_kernel_idle(self, timeout_ms: int = 90_000) -> None:
        """Wait for the status bar to say the notebook's kernel is `Idle`.

        A notebook without kernelspec metadata would stop here on JupyterLab's "Select Kernel"
        dialog; the error then names the dialog instead of timing out silently.
        """
        self.page.wait_for_function(
            """() => {
                const d = document.querySelector('.jp-Dialog');
                if (d) return true;
                const s = document.querySelector('#jp-main-statusbar');
                return s && /\\|\\s*Idle/.test(s.innerText);
            }""",
            timeout=timeout_ms,
        )
        dialog = self.page.locator(".jp-Dialog")
        if dialog.count():
            raise AssertionError(f"{self.path}: JupyterLab shows a dialog: {dialog.inner_text()!r}")

    # -- cells -------------------------------------------------------------------------------

    @property
    def cells(self) -> Locator:
        return self.page.locator(f"{PANEL} .jp-Notebook .jp-Cell")

    def code_cell_indices(self) -> list[int]:
        classes = self.cells.evaluate_all("cs => cs.map(c => c.className)")
        return [i for i, cls in enumerate(classes) if "jp-CodeCell" in cls.split()]

    def find_cell(self, needle: str) -> int:
        """Index of the first code cell whose source contains `needle` (markdown may quote code)."""
        sources = self.cells.evaluate_all(
            """cs => cs.map(c => c.classList.contains('jp-CodeCell')
                ? [...c.querySelectorAll('.jp-InputArea-editor .cm-line')].map(l => l.textContent).join('\\n')
                : '')"""
        )
        for i, src in enumerate(sources):
            if needle in src:
                return i
        raise AssertionError(f"{self.path}: no cell contains {needle!r}")

    def prompt(self, index: int) -> str:
        return str(self.cells.nth(index).locator(".jp-InputPrompt").text_content()).strip()

    def output_text(self, index: int) -> str:
        """All text the cell's output area holds (stdout, stderr, errors, rich text).

        textContent, not innerText: JupyterLab skips rendering cells scrolled out of view
        (content-visibility), and innerText of an unrendered cell is empty.
        """
        area = self.cells.nth(index).locator(".jp-OutputArea")
        return str(area.text_content()) if area.count() else ""

    def error_outputs(self) -> list[tuple[int, str]]:
        """(cell index, text) of every stderr stream or error traceback the notebook shows.

        JupyterLab renders both with the stderr MIME type; the kit writes nothing to stderr
        when a cell succeeds, so any such output is a failure a learner would see.
        """
        found = self.cells.evaluate_all(
            """cs => cs.flatMap((c, i) => [...c.querySelectorAll(
                    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
                .map(o => [i, o.textContent]))"""
        )
        return [(int(i), str(text)) for i, text in found]

    def set_source(self, index: int, source: str) -> None:
        """Replace cell `index`'s code as a learner would: click in, select all, type.

        insert_text types the whole text in one input event, like a paste, so the editor
        adds no auto-indentation or closing brackets of its own.
        """
        editor = self.cells.nth(index).locator(".jp-InputArea-editor .cm-content")
        editor.scroll_into_view_if_needed()
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(source)
        self.page.keyboard.press("Escape")

    # -- running -----------------------------------------------------------------------------

    def select(self, index: int) -> None:
        """Make cell `index` the active cell in command mode (click its prompt, press Esc)."""
        cell = self.cells.nth(index)
        cell.scroll_into_view_if_needed()
        cell.locator(".jp-InputPrompt").click()
        self.page.keyboard.press("Escape")

    def run_cell(self, index: int, wait: bool = True, timeout_ms: int = 90_000) -> str:
        """Select cell `index`, press Shift+Enter; when `wait`, return its output once done."""
        self.select(index)
        self.page.keyboard.press("Shift+Enter")
        if not wait:
            return ""
        self.wait_cell_done(index, timeout_ms)
        return self.output_text(index)

    def wait_cell_running(self, index: int, timeout_ms: int = 30_000) -> None:
        self.page.wait_for_function(
            """([sel, i]) => {
                const c = document.querySelectorAll(sel)[i];
                return c && c.querySelector('.jp-InputPrompt').textContent.includes('*');
            }""",
            arg=[f"{PANEL} .jp-Notebook .jp-Cell", index],
            timeout=timeout_ms,
        )

    def wait_cell_done(self, index: int, timeout_ms: int = 90_000) -> None:
        """Wait until cell `index` shows an execution count (`[n]:`), i.e. it finished."""
        self.page.wait_for_function(
            """([sel, i]) => {
                const c = document.querySelectorAll(sel)[i];
                return c && /^\\[\\d+\\]:$/.test(c.querySelector('.jp-InputPrompt').textContent.trim());
            }""",
            arg=[f"{PANEL} .jp-Notebook .jp-Cell", index],
            timeout=timeout_ms,
        )

    def wait_output(self, index: int, needle: str, timeout_ms: int = 60_000) -> None:
        """Wait until cell `index` shows `needle` in its output."""
        self.page.wait_for_function(
            """([sel, i, needle]) => {
                const c = document.querySelectorAll(sel)[i];
                const o = c && c.querySelector('.jp-OutputArea');
                return !!o && o.textContent.includes(needle);
            }""",
            arg=[f"{PANEL} .jp-Notebook .jp-Cell", index, needle],
            timeout=timeout_ms,
        )

    def run_all(self, timeout_ms: int = 180_000, expected_failures: Iterable[int] = ()) -> None:
        """Run > Run All Cells, then wait until no cell is queued or running.

        JupyterLab stops a run-all at the first failing cell; the cells after it keep an
        empty prompt, which the caller sees through `prompt()` and `error_outputs()`. Cells
        in `expected_failures` (indices, tagged raises-exception) fail without stopping it.
        """
        code = self.code_cell_indices()
        self._run_from_menu("Run All Cells", code[0], code[-1], timeout_ms, expected_failures)

    def run_all_above(self, index: int, timeout_ms: int = 180_000) -> None:
        """Select cell `index`, Run > Run All Above Selected Cell, wait until they are done."""
        above = [i for i in self.code_cell_indices() if i < index]
        self.select(index)
        self._run_from_menu("Run All Above Selected Cell", above[0], above[-1], timeout_ms)

    def _run_from_menu(self, item: str, first: int, last: int, timeout_ms: int,
                       expected_failures: Iterable[int] = ()) -> None:
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.get_by_role("menuitem", name=item, exact=True).click()
        # done: nothing queued or running ('[*]'), the first cell has its count, and either every
        # later cell has one too or the last numbered cell shows an error (Run All stopped there).
        # JupyterLab starts queued cells one by one, so "no '[*]'" alone can hold between two cells,
        # and right after a cell that fails on purpose its error is the last one shown while the
        # next cell has not started yet: that is not a stop (on a loaded machine the gap is long).
        code = self.code_cell_indices()
        allowed = [code.index(i) for i in expected_failures if i in code]
        self.page.wait_for_function(
            """([sel, first, end, allowed]) => {
                const cells = [...document.querySelectorAll(sel)];
                const ps = cells.map(c => c.querySelector('.jp-InputPrompt').textContent.trim());
                if (ps.length === 0 || ps.some(p => p.includes('*'))) return false;
                const numbered = ps.map(p => /^\\[\\d+\\]:$/.test(p));
                if (!numbered[first]) return false;
                const last = numbered.lastIndexOf(true);
                if (numbered.slice(first, end + 1).every(Boolean)) return true;
                if (allowed.includes(last)) return false;
                return cells[last].querySelector(
                    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]') !== null;
            }""",
            arg=[f"{PANEL} .jp-Notebook .jp-Cell.jp-CodeCell", code.index(first), code.index(last), allowed],
            timeout=timeout_ms,
        )
        self.wait_kernel_idle(timeout_ms)

    def interrupt(self) -> None:
        """Press the toolbar's stop button (Interrupt the kernel)."""
        self.page.locator(
            f"{PANEL} .jp-NotebookPanel-toolbar jp-button[data-command='notebook:interrupt-kernel']"
        ).click()

    def unrun_cells(self) -> list[int]:
        """Code cells without an execution count: never run, or skipped after a failure."""
        return [i for i in self.code_cell_indices() if not _NUMBERED.match(self.prompt(i))]

    # -- pictures ----------------------------------------------------------------------------

    def screenshot(self, name: str) -> Path:
        """Save the whole page as <screenshot_dir>/<name>.png and return the path."""
        path = self.screenshot_dir / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path
