"""`make lab` is the learner's one command: it must serve the course, safely, and stop on Ctrl-C.

One real `make lab` (LAB_PORT=0, a token, --no-browser) serves every test here, with one
kernel running `%%dist` ranks in it, as after a learner's first cells. The last test stops it
with Ctrl-C (SIGINT to make's process group, as a terminal sends it) and checks that the
server, the kernel and every rank are gone.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.labserver import REPO, LabServer, group_alive, port_is_free, start_lab, stop_lab
from jupyter_client.blocking import BlockingKernelClient
from procs import listening_addresses, parent, wait_gone

pytestmark = pytest.mark.slow  # a real `make lab` server per module: make test, not make check

NOTIFICATION_PLUGIN = "@jupyterlab/apputils-extension:notification"


def descendants(root: int) -> list[int]:
    """Every live process below `root` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(parent(int(entry)), []).append(int(entry))
            except OSError:  # exited while we looked
                continue
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    server = start_lab(tmp_path_factory.mktemp("make-lab") / "lab.log")
    try:
        yield server
    finally:
        stop_lab(server)  # a no-op once the Ctrl-C test has stopped it


@pytest.fixture(scope="module")
def rank_output(lab: LabServer) -> Iterator[str]:
    """Start a kernel in the lab and run a `%%dist -n 2` cell in it; yields what it printed."""
    kernel_id = lab.api("POST", "api/kernels", {"name": "python3"})["id"]
    client = BlockingKernelClient()
    client.load_connection_file(str(lab.runtime_dir / f"kernel-{kernel_id}.json"))
    client.start_channels(hb=False)  # the server, not this test, watches the heartbeat
    printed: list[str] = []

    def collect(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append("\n".join(msg["content"]["traceback"]))

    try:
        client.wait_for_ready(timeout=120)
        for code in ("%load_ext distlab", "%%dist -n 2\nprint('ready', rank)"):
            client.execute_interactive(code, timeout=120, output_hook=collect)
        yield "".join(printed)
    finally:
        client.stop_channels()


def test_serves_the_course_notebooks(lab: LabServer) -> None:
    listing = lab.api("GET", "api/contents/notebooks")
    names = {item["name"] for item in listing["content"]}
    assert "00_welcome.ipynb" in names, sorted(names)


def test_opens_on_the_welcome_notebook(lab: LabServer) -> None:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as redirect:
        opener.open(lab.url(""), timeout=10)
    assert redirect.value.code in (301, 302, 303, 307)
    location = redirect.value.headers["Location"].split("?")[0]
    assert location.endswith("/lab/tree/notebooks/00_welcome.ipynb"), location


def test_needs_the_token(lab: LabServer) -> None:
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{lab.base_url}/api/contents/notebooks", timeout=10)
    assert denied.value.code in (401, 403)


def test_does_not_ask_about_jupyter_news(lab: LabServer) -> None:
    # JupyterLab pops up "Would you like to get notified about official Jupyter news?" over
    # the first notebook unless fetchNews is decided; the kit decides it (jupyter_config/).
    schema = lab.api("GET", f"lab/api/settings/{NOTIFICATION_PLUGIN}")["schema"]["properties"]
    assert schema["fetchNews"]["default"] == "false"
    assert schema["checkForUpdates"]["default"] is False


INSTRUCTOR_SCREENS = ("formgrader", "assignment-list", "course-list", "create-assignment")


def test_shows_validate_but_not_the_instructor_screens(lab: LabServer) -> None:
    # the learner's lab has nbgrader's Validate button; the formgrader and the assignment and
    # course lists would look for a course the learner does not have (python -m grader is the
    # instructor's path), so they are switched off, in the page and on the server
    with urllib.request.urlopen(lab.url("lab/tree/notebooks/00_welcome.ipynb"), timeout=30) as page:
        html = page.read().decode()
    data = html.split('id="jupyter-config-data" type="application/json">', 1)[1].split("</script>", 1)[0]
    disabled = json.loads(data)["disabledExtensions"]
    assert {f"@jupyter/nbgrader:{screen}" for screen in INSTRUCTOR_SCREENS} <= set(disabled), disabled
    assert "@jupyter/nbgrader:validate-assignment" not in disabled
    for handler in ("formgrader", "assignments", "courses"):
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(lab.url(handler), timeout=10)
        assert missing.value.code == 404, handler
    log = Path(lab.log_path).read_text(errors="replace")
    assert "No nbgrader_config.py" not in log and "server_extensions.formgrader" not in log, log


def test_a_kernel_in_the_lab_runs_ranks(rank_output: str) -> None:
    assert "[rank 0] ready 0" in rank_output and "[rank 1] ready 1" in rank_output, rank_output


def test_listens_on_loopback_only(lab: LabServer, rank_output: str) -> None:
    # the server, the kernel and the ranks: every TCP socket they listen on is on 127.0.0.1
    addresses = {pid: listening_addresses(pid) for pid in descendants(lab.proc.pid)}
    everything = [a for found in addresses.values() for a in found]
    assert f"127.0.0.1:{lab.port}" in everything, addresses
    assert all(a.startswith("127.0.0.1:") for a in everything), addresses


def test_ctrl_c_stops_server_kernel_and_ranks(lab: LabServer, rank_output: str) -> None:
    started = descendants(lab.proc.pid)  # make's shell, the server, the kernel, its ranks
    os.killpg(lab.proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends to make's group
    returncode = lab.proc.wait(timeout=60)
    # make re-raises the SIGINT it got, like any program stopped by Ctrl-C
    assert returncode in (-signal.SIGINT, 128 + signal.SIGINT), returncode
    left = wait_gone(started, within=20)
    assert not left, f"still running after Ctrl-C: {left}"
    deadline = time.monotonic() + 5
    while group_alive(lab.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(lab.proc.pid)
    assert port_is_free(lab.port)
    log = Path(lab.log_path).read_text(errors="replace")
    assert "Traceback" not in log, log


@pytest.mark.parametrize("how", [["LANG=zh"], ["EDITION=zh"], ["LANG=zh_CN.UTF-8"]])
def test_make_lab_lang_zh_opens_the_chinese_edition(how: list[str]) -> None:
    """`make lab LANG=zh` opens notebooks/zh/ with the kit speaking Chinese; English is the default."""
    import subprocess

    def dry_run(*args: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
        return subprocess.run(["make", "--no-print-directory", "-n", "-C", str(REPO), "lab", *args],
                              capture_output=True, text=True, check=True, env=env, timeout=60).stdout

    chinese, english = dry_run(*how), dry_run()
    assert "/lab/tree/notebooks/zh/00_welcome.ipynb" in chinese and "DISTLAB_LANG=zh" in chinese
    assert "/lab/tree/notebooks/00_welcome.ipynb" in english and "DISTLAB_LANG" not in english
    assert (REPO / "notebooks" / "zh" / "00_welcome.ipynb").is_file()


def test_make_lab_lang_zh_serves_the_chinese_welcome_and_a_chinese_kit(tmp_path: Path) -> None:
    """A real `make lab LANG=zh`: it opens on notebooks/zh/00_welcome.ipynb, and a kernel it starts
    anywhere has DISTLAB_LANG=zh (so the kit speaks Chinese), while LANG is a valid locale."""
    server = start_lab(tmp_path / "lab.log", make_args=("LANG=zh",))
    try:
        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: object, **kwargs: object) -> None:
                return None

        with pytest.raises(urllib.error.HTTPError) as redirect:
            urllib.request.build_opener(NoRedirect).open(server.url(""), timeout=10)
        location = redirect.value.headers["Location"].split("?")[0]
        assert location.endswith("/lab/tree/notebooks/zh/00_welcome.ipynb"), location
        environ = (Path("/proc") / str(_jupyter_pid(server)) / "environ").read_bytes().split(b"\0")
        assert b"DISTLAB_LANG=zh" in environ and b"LANG=zh" not in environ
    finally:
        stop_lab(server)


def _jupyter_pid(server: LabServer) -> int:
    """The jupyter server process: make's child running `-m jupyterlab`."""
    for pid in descendants(server.proc.pid):
        try:
            argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
            if argv[1:3] == [b"-m", b"jupyterlab"]:  # not the shell make runs it from
                return pid
        except OSError:
            continue
    raise AssertionError("no jupyterlab process under make")
