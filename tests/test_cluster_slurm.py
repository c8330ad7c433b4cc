"""The same %%dist cells on a real two-node SLURM cluster (root only: `make test-cluster`).

tests/slurm_cluster.py brings up slurmctld, munged and one slurmd per node, each node in its own
network namespace on a private bridge. A real Jupyter kernel, on the host like a login node, runs
`%dist_start --launcher slurm --iface dl0`: srun places the ranks on both nodes and they join the
kernel's pool over TCP. Checked: ranks report two hosts and addresses, collectives and state work,
faults (a rank raises, a node's tasks are killed, a request SLURM refuses) fail the cell naming
rank and node while the next cell works, and a killed kernel leaves no task on any node and no job.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from kernel_session import KernelSession
from slurm_cluster import NODES, SlurmCluster, skip_reason

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

START = '%dist_start -n 4 --launcher slurm --iface dl0 --srun-args "--nodes=2 --ntasks-per-node=2"'


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    up = SlurmCluster().start()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(autouse=True)
def slurm_client(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel a test starts is a SLURM client of this cluster (SLURM_CONF)."""
    for name, value in cluster.env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def kernel(cluster: SlurmCluster) -> Iterator[KernelSession]:
    session = KernelSession()
    try:
        reply = session.execute("%load_ext distlab\n" + START, timeout=180)
        assert reply.error is None, reply.traceback + cluster.logs()
        yield session
    finally:
        session.shutdown()
        _wait_no_jobs(cluster)


def _squeue(cluster: SlurmCluster) -> str:
    return subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=10,
                          env=dict(os.environ, **cluster.env())).stdout.strip()


def _wait_no_jobs(cluster: SlurmCluster, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while _squeue(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)


def _wait_no_tasks(cluster: SlurmCluster, within: float = 10.0) -> dict[str, list[int]]:
    deadline = time.monotonic() + within
    while True:
        left = {node: cluster.tasks_on(node) for node in NODES}
        if not any(left.values()) or time.monotonic() > deadline:
            return {n: p for n, p in left.items() if p}
        time.sleep(0.1)


def test_a_cell_runs_on_four_ranks_over_two_nodes(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nimport os, socket\nt = torch.tensor([rank + 1.0])\ndist.all_reduce(t)\n"
                           "addr = os.popen('ip -4 -o addr show dl0').read().split()[3]\n"
                           "print(socket.gethostname(), addr, t.item(), local_rank)")
    assert reply.error is None, reply.traceback
    lines = sorted(reply.stdout.splitlines())  # "[rank R @NODE] HOST ADDR 10.0 LOCAL_RANK"
    assert len(lines) == 4, lines
    fields = [line.split()[2:] for line in lines]  # after "[rank R"
    assert {f[1] for f in fields} == set(NODES), lines  # two hosts ...
    assert {f[2] for f in fields} == {f"{a}/24" for a in NODES.values()}  # ... two addresses
    assert all(f[3] == "10.0" for f in fields)
    assert all(f[0] == f"@{f[1]}]" for f in fields), lines  # each line says which node printed it
    assert sorted(f[4] for f in fields) == ["0", "0", "1", "1"]  # local ranks from SLURM_LOCALID
    kernel.execute("%%dist\nkept = rank * 10")
    assert kernel.value("%dist_pull kept") == [0, 10, 20, 30]
    status = kernel.execute("%dist_status").stdout
    assert "dlnode1" in status and "dlnode2" in status, status


def test_a_rank_that_raises_fails_the_cell_naming_rank_and_node(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nif rank == 3:\n    raise ValueError('boom on three')\nt = torch.ones(1)\n"
                           "dist.all_reduce(t)", timeout=120)
    assert reply.error is not None and reply.error["ename"] in ("RankError", "RankTimeout")
    assert "boom on three" in reply.traceback and "rank 3" in reply.traceback
    assert "on node dlnode" in reply.traceback, reply.traceback
    after = kernel.execute("%%dist\nprint(rank)", timeout=180)
    assert after.error is None, after.traceback
    assert len([x for x in after.stdout.splitlines() if x.startswith("[rank ")]) == 4


def test_a_node_whose_tasks_are_killed_fails_the_cell_and_the_next_cell_works(
        kernel: KernelSession, cluster: SlurmCluster) -> None:
    import threading

    def kill_dlnode2_tasks_once_running() -> None:
        deadline = time.monotonic() + 60
        while len(cluster.tasks_on("dlnode2")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the cell is in its loop of all_reduces by now
        for pid in cluster.tasks_on("dlnode2"):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    killer = threading.Thread(target=kill_dlnode2_tasks_once_running, daemon=True)
    started = time.monotonic()
    killer.start()
    reply = kernel.execute("%%dist --timeout 120\nimport time\nfor _ in range(600):\n"
                           "    t = torch.ones(1)\n    dist.all_reduce(t)\n    time.sleep(0.1)", timeout=150)
    killer.join()
    assert reply.error is not None, reply.stdout
    assert time.monotonic() - started < 60  # noticed on its own connections, not SLURM's 30 s
    assert "dlnode2" in reply.traceback, reply.traceback
    after = kernel.execute("%%dist\nprint('back', rank)", timeout=180)
    assert after.error is None, after.traceback
    assert len([x for x in after.stdout.splitlines() if x.startswith("[rank ")]) == 4


def test_a_request_slurm_cannot_start_says_why_and_is_withdrawn_on_interrupt(cluster: SlurmCluster) -> None:
    session = KernelSession()
    try:
        reply = session.execute('%load_ext distlab\n%dist_start -n 6 --launcher slurm --iface dl0 '
                                '--srun-args "--nodes=3"', timeout=120,
                                interrupt_on=("SLURM has not started the ranks yet", 1))
        assert re.search(r"job \d+ pending \(\w+\)", reply.stdout), reply.stdout  # with SLURM's reason
        assert reply.error is not None and reply.error["ename"] == "KeyboardInterrupt"
        _wait_no_jobs(cluster, within=10.0)
        assert _squeue(cluster) == ""  # nothing left queued
        again = session.execute(START, timeout=180)  # and the kernel can go on
        assert again.error is None, again.traceback
    finally:
        session.shutdown()
        _wait_no_jobs(cluster)


def test_a_killed_kernel_leaves_no_task_on_any_node_and_no_job(cluster: SlurmCluster) -> None:
    session = KernelSession()
    reply = session.execute("%load_ext distlab\n" + START, timeout=180)
    assert reply.error is None, reply.traceback
    assert all(cluster.tasks_on(node) for node in NODES)
    session.kill()
    assert _wait_no_tasks(cluster, within=10.0) == {}
    _wait_no_jobs(cluster, within=10.0)
    assert _squeue(cluster) == ""


def test_a_kernel_killed_while_its_request_is_pending_leaves_nothing_queued(cluster: SlurmCluster) -> None:
    session = KernelSession()
    try:
        session.client.execute('%load_ext distlab\n%dist_start -n 6 --launcher slurm --iface dl0 '
                               '--srun-args "--nodes=3"')  # not waited for: it never finishes
        deadline = time.monotonic() + 60
        while not _squeue(cluster) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _squeue(cluster), "the request never reached SLURM"
        session.kill()  # the kernel dies while SLURM holds its request
        _wait_no_jobs(cluster, within=10.0)
        assert _squeue(cluster) == ""
    finally:
        with contextlib.suppress(Exception):
            session.shutdown()


def test_distlab_run_and_the_bench_place_their_ranks_on_the_cluster_too(kernel: KernelSession) -> None:
    reply = kernel.execute("import distlab\n\ndef host():\n    import socket\n    return socket.gethostname()\n\n"
                           "print(sorted(set(distlab.run(host, world_size=4))))", timeout=180)
    assert reply.error is None, reply.traceback
    assert reply.stdout.strip() == str(sorted(NODES))
    reply = kernel.execute("from distlab import bench\nrows = bench.sweep(['all_reduce'], '4K:16K', [4], iters=3, "
                           "progress=False)\nprint([r['size'] for r in rows], all(r['busbw'] > 0 for r in rows))",
                           timeout=300)
    assert reply.error is None, reply.traceback
    assert reply.stdout.strip().endswith("True"), reply.stdout


@pytest.mark.parametrize("how", ["shutdown", "restart"])
def test_a_kernel_shut_down_or_restarted_ends_the_step_on_every_node(
        how: str, cluster: SlurmCluster) -> None:
    session = KernelSession()
    try:
        reply = session.execute("%load_ext distlab\n" + START, timeout=180)
        assert reply.error is None, reply.traceback
        assert all(cluster.tasks_on(node) for node in NODES)
        if how == "restart":
            session.manager.restart_kernel(now=False)
        else:
            session.shutdown()
        assert _wait_no_tasks(cluster, within=10.0) == {}
        _wait_no_jobs(cluster, within=10.0)
        assert _squeue(cluster) == ""
    finally:
        with contextlib.suppress(Exception):
            session.shutdown()


def test_a_course_notebook_runs_headless_on_the_cluster(cluster: SlurmCluster) -> None:
    """Notebook 05 as a learner on the cluster runs it: only the start line names the launcher."""
    from pathlib import Path

    import nbformat
    from nbclient import NotebookClient

    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    nb = nbformat.read(notebooks / "05_reduce_all_reduce.ipynb", as_version=4)
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert setup.source == "%load_ext distlab\n%dist_start -n 4"
    setup.source = "%load_ext distlab\n" + START
    NotebookClient(nb, kernel_name="python3", timeout=300,
                   resources={"metadata": {"path": str(notebooks)}}).execute()
    shown = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "self-check passed" in shown and "@dlnode1]" in shown and "@dlnode2]" in shown
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not [o for o in cell.outputs if o.output_type == "error"], cell.source[:200]
    _wait_no_jobs(cluster)
