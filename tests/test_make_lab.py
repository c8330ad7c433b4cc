"""`make lab` is the learner's one command: it must serve the course, safely, and stop on Ctrl-C.

One real `make lab` (LAB_PORT=0, a token, --no-browser) serves every test here; the last test
stops it with Ctrl-C (SIGINT to make's process group, as a terminal would send it).
"""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser.labserver import LabServer, group_alive, port_is_free, start_lab, stop_lab

NOTIFICATION_PLUGIN = "@jupyterlab/apputils-extension:notification"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    server = start_lab(tmp_path_factory.mktemp("make-lab") / "lab.log")
    try:
        yield server
    finally:
        stop_lab(server)  # a no-op once the Ctrl-C test has stopped it


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


def test_listens_on_loopback_only(lab: LabServer) -> None:
    # Linux routes all of 127/8 to lo: a server bound to every interface would answer on
    # 127.0.0.2 too; one bound to 127.0.0.1 refuses it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        assert sock.connect_ex(("127.0.0.2", lab.port)) != 0


def test_does_not_ask_about_jupyter_news(lab: LabServer) -> None:
    # JupyterLab pops up "Would you like to get notified about official Jupyter news?" over
    # the first notebook unless fetchNews is decided; the kit decides it (jupyter_config/).
    schema = lab.api("GET", f"lab/api/settings/{NOTIFICATION_PLUGIN}")["schema"]["properties"]
    assert schema["fetchNews"]["default"] == "false"
    assert schema["checkForUpdates"]["default"] is False


def test_ctrl_c_stops_server_and_frees_port(lab: LabServer) -> None:
    os.killpg(lab.proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends to make's group
    returncode = lab.proc.wait(timeout=30)
    # make re-raises the SIGINT it got, like any program stopped by Ctrl-C
    assert returncode in (-signal.SIGINT, 128 + signal.SIGINT), returncode
    deadline = time.monotonic() + 10
    while group_alive(lab.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(lab.proc.pid), "processes of `make lab` outlived Ctrl-C"
    assert port_is_free(lab.port)
    log = Path(lab.log_path).read_text(errors="replace")
    assert "Traceback" not in log, log
