"""Fixtures for the browser suite: one `make lab` and one headless Chromium for all its tests.

Why a real browser: the kit lives in JupyterLab (widgets, the stop button, nbgrader's lab
extension), and only a browser shows what a learner sees. Chromium is Debian's package
(`apt-get install chromium`); Playwright never downloads one. Without it the suite is skipped.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest

from browser.labserver import SCRATCH, SCREENSHOTS, LabServer, start_lab, stop_lab
from browser.notebook_page import NotebookPage

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]
SKIP_REASON = "needs Debian's Chromium at /usr/bin/chromium: apt-get install chromium"
# The lab extensions the kit needs, as they name themselves in console messages.
KIT_EXTENSIONS = ("jupyter-widgets", "jupyterlab-manager", "ipywidgets", "widget", "nbgrader")

_HERE = Path(__file__).resolve().parent


_skipped: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if CHROMIUM.exists():
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)
            _skipped.append(item.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # `pytest -q` hides skip reasons; say once, in every run, why the browser suite did not run
    if _skipped:
        terminalreporter.write_line(f"{len(_skipped)} browser tests skipped: {SKIP_REASON}", yellow=True)


@pytest.fixture(scope="package")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """`make lab` on a free port with a token, served from the repo, stopped by its pgid.

    Settings that only the tests need go to a temporary user-settings dir: autosave is off,
    so running course notebooks in the browser never writes outputs into the repo.
    """
    # screenshots and consoles of this run only: stale pictures would mislead
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)
    base = tmp_path_factory.mktemp("lab")
    user_settings = base / "user-settings"
    docmanager = user_settings / "@jupyterlab" / "docmanager-extension"
    docmanager.mkdir(parents=True)
    (docmanager / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    workspaces = base / "workspaces"
    workspaces.mkdir()
    # opening a notebook writes a checkpoint next to it; an absolute checkpoint dir keeps
    # them out of the repo
    checkpoints = base / "checkpoints"
    server = start_lab(
        base / "lab.log",
        lab_flags=(
            f"--LabApp.user_settings_dir={user_settings} --LabApp.workspaces_dir={workspaces} "
            f"--FileCheckpoints.checkpoint_dir={checkpoints}"
        ),
    )
    try:
        yield server
    finally:
        try:
            server.shutdown_kernels()
        finally:
            stop_lab(server)
            # keep the server log next to the screenshots for a failed CI run
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(server.log_path, SCREENSHOTS / "lab.log")


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class LabUI:
    """A fresh browser page on the lab, plus what its console logs."""

    page: Any
    server: LabServer
    console: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)

    def open(self, path: str) -> NotebookPage:
        """Open the notebook at `path` (relative to the repo) and wait for an idle kernel."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        return NotebookPage(self.page, self.server.url, path, SCREENSHOTS).open()

    def assert_console_clean(self) -> None:
        """The browser console shows no error at all.

        The kit's lab extensions (ipywidgets' manager, nbgrader's) log here when they break;
        with a clean console today, any error is news, so none is allowed. Errors naming a
        kit extension are listed first.
        """
        kit = [m for m in self.console_errors if any(x in m.lower() for x in KIT_EXTENSIONS)]
        other = [m for m in self.console_errors if m not in kit]
        assert not self.console_errors, (
            "browser console errors\n from the kit's extensions:\n  " + "\n  ".join(kit)
            + "\n others:\n  " + "\n  ".join(other)
        )


@pytest.fixture
def lab_ui(lab: LabServer, browser: Any, request: pytest.FixtureRequest) -> Iterator[LabUI]:
    """A new page (own context, 1400x900) whose kernels are shut down after the test.

    The page's console goes to artifacts/screenshots/<test>.console.log for diagnosis.
    """
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    ui = LabUI(page=page, server=lab)

    def on_console(msg: Any) -> None:
        where = msg.location.get("url", "") if msg.location else ""
        line = f"console.{msg.type}: {msg.text} ({where})"
        ui.console.append(line)
        if msg.type == "error":
            ui.console_errors.append(line)

    def on_page_error(exc: Any) -> None:
        ui.console.append(f"uncaught: {exc}")
        ui.console_errors.append(f"uncaught: {exc}")

    page.on("console", on_console)
    page.on("pageerror", on_page_error)
    try:
        yield ui
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        try:  # the page as the test left it: the first thing to look at when one fails
            page.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.last.png"))
        finally:
            context.close()
            lab.shutdown_kernels()
        (SCREENSHOTS / f"{request.node.name}.console.log").write_text("\n".join(ui.console) + "\n")


@pytest.fixture
def scratch_notebook() -> Any:
    """Write a notebook of code cells under artifacts/browser/ and return its served path."""

    def write(name: str, cells: list[str]) -> str:
        SCRATCH.mkdir(parents=True, exist_ok=True)
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
        }
        nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
        nbformat.write(nb, SCRATCH / f"{name}.ipynb")
        return f"artifacts/browser/{name}.ipynb"

    return write
