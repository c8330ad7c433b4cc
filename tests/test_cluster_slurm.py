"""The same %%dist cells on a real two-node SLURM cluster (root only: `make test-cluster`).

tests/slurm_cluster.py brings up slurmctld, munged and one slurmd per node, each node in its own
network namespace on a private bridge. A real Jupyter kernel, on the host like a login node, runs
`%dist_start --launcher slurm --iface 10.213.0.0/24` (the nodes name that network dl0 and dlx2):
srun places the ranks on both nodes and they join the kernel's pool over TCP. Checked: ranks report two hosts and addresses, collectives and state work,
faults (a rank raises, a node's tasks are killed, a request SLURM refuses) fail the cell naming
rank and node while the next cell works, and a killed kernel leaves no task on any node and no job.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_session import HUB_FOLDER_AND_LAUNCHER, AsyncUnixSocketKernelManager, KernelSession
from procs import wait_gone
from slurm_cluster import LOOP_CELL, NETWORK, NODE_IFACES, NODES, SlurmCluster, skip_reason, when_every_rank_is_looping

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

START = f'%dist_start -n 4 --launcher slurm --iface {NETWORK} --srun-args "--nodes=2 --ntasks-per-node=2"'


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
        assert "ranks 0-1 on node dlnode1; ranks 2-3 on node dlnode2" in reply.stdout, reply.stdout
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
                           "iface = os.environ['GLOO_SOCKET_IFNAME']\n"
                           "addr = os.popen(f'ip -4 -o addr show {iface}').read().split()[3]\n"
                           "print(socket.gethostname(), addr, t.item(), local_rank, iface)")
    assert reply.error is None, reply.traceback
    lines = sorted(reply.stdout.splitlines())  # "[rank R @NODE] HOST ADDR 10.0 LOCAL_RANK"
    assert len(lines) == 4, lines
    fields = [line.split()[2:] for line in lines]  # after "[rank R"
    assert {f[1] for f in fields} == set(NODES), lines  # two hosts ...
    assert {f[2] for f in fields} == {f"{a}/24" for a in NODES.values()}  # ... two addresses
    assert all(f[3] == "10.0" for f in fields)
    assert all(f[0] == f"@{f[1]}]" for f in fields), lines  # each line says which node printed it
    assert sorted(f[4] for f in fields) == ["0", "0", "1", "1"]  # local ranks from SLURM_LOCALID
    assert {(f[1], f[5]) for f in fields} == set(NODE_IFACES.items())  # each node's own name for the network
    kernel.execute("%%dist\nkept = rank * 10")
    assert kernel.value("%dist_pull kept") == [0, 10, 20, 30]
    status = kernel.execute("%dist_status").stdout
    assert "dlnode1" in status and "dlnode2" in status, status
    traced = kernel.execute("%%dist --trace\nt = torch.ones(4)\ndist.all_reduce(t)")
    assert traced.error is None, traced.traceback
    tables = "".join(str(o.get("data", {}).get("text/html", "")) for o in traced.outputs)
    assert "<caption>rank 0 @dlnode1</caption>" in tables and "<caption>rank 3 @dlnode2</caption>" in tables


def test_ranks_placed_unevenly_know_how_many_share_their_node(cluster: SlurmCluster) -> None:
    """srun puts 3 ranks on 2 nodes as 2 + 1, and no SLURM variable says "1" on the second node
    unless --ntasks-per-node was given (and in an allocation made with it, the variable says the
    allocation's 2). Code that sizes its threads or its GPU groups by LOCAL_WORLD_SIZE needs the truth."""
    session = KernelSession()
    try:
        start = session.execute(f'%load_ext distlab\n%dist_start -n 3 --launcher slurm --iface {NETWORK} '
                                f'--srun-args "--nodes=2"', timeout=180)
        assert start.error is None, start.traceback + cluster.logs()
        assert "ranks 0-1 on node dlnode1; rank 2 on node dlnode2" in start.stdout, start.stdout
        reply = session.execute("%%dist\nimport os\nprint(*(os.environ[v] for v in "
                                "('LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK')), local_rank)")
        assert reply.error is None, reply.traceback
        assert sorted(reply.stdout.splitlines()) == ["[rank 0 @dlnode1] 0 2 0 0", "[rank 1 @dlnode1] 1 2 0 1",
                                                     "[rank 2 @dlnode2] 0 1 1 0"], reply.stdout
    finally:
        session.shutdown()
        _wait_no_jobs(cluster)


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
        kernel: KernelSession, cluster: SlurmCluster, tmp_path: Path) -> None:
    kernel.execute(f"%%dist\nMARKS = {str(tmp_path)!r}")
    started = time.monotonic()
    killer = when_every_rank_is_looping(tmp_path, lambda: cluster.kill_tasks("dlnode2"))
    reply = kernel.execute(LOOP_CELL, timeout=150)
    killer.join()
    assert reply.error is not None, reply.stdout
    assert time.monotonic() - started < 60  # noticed on its own connections, not SLURM's 30 s
    assert "dlnode2" in reply.traceback, reply.traceback
    after = kernel.execute("%%dist\nprint('back', rank)", timeout=180)
    assert after.error is None, after.traceback
    assert len([x for x in after.stdout.splitlines() if x.startswith("[rank ")]) == 4


def test_a_node_that_crashes_mid_cell_fails_it_naming_the_node_and_the_next_cell_runs(
        kernel: KernelSession, cluster: SlurmCluster, tmp_path: Path) -> None:
    """Power lost on dlnode2 (its slurmd and every task killed): the kernel sees its connections to
    ranks 2-3 close, long before SLURM's 30 s. While the node is down the next cell says the
    allocation lost it and can be interrupted; once the node is back, the next cell runs."""
    kernel.execute(f"%%dist\nMARKS = {str(tmp_path)!r}")
    started = time.monotonic()
    fault = when_every_rank_is_looping(tmp_path, lambda: cluster.crash_node("dlnode2"))
    reply = kernel.execute(LOOP_CELL, timeout=150)
    fault.join()
    assert reply.error is not None, reply.stdout
    assert time.monotonic() - started < 30, reply.traceback
    assert "ranks 2-3 on node dlnode2" in reply.traceback, reply.traceback
    assert "lost its connection to the rank" in reply.traceback, reply.traceback
    try:
        # While the node is down, cells fail or wait, naming it: srun's launch on dlnode2 fails
        # until SLURM marks the node down (SlurmdTimeout, 30 s here); then the request waits and
        # the cell says the allocation lost the node, until interrupted.
        for _attempt in range(4):
            waiting = kernel.execute("%%dist\nprint(rank)", timeout=180,
                                     interrupt_on=("the allocation lost node dlnode2", 1))
            assert waiting.error is not None, waiting.stdout
            assert "dlnode2" in waiting.stdout + waiting.traceback, waiting.stdout + waiting.traceback
            if waiting.error["ename"] == "KeyboardInterrupt":
                break
        assert "the allocation lost node dlnode2 (Not responding)" in waiting.stdout, waiting.stdout
        _wait_no_jobs(cluster, within=10.0)
        assert _squeue(cluster) == ""  # the interrupted request was withdrawn
    finally:
        cluster.restart_node("dlnode2")
    after = kernel.execute("%%dist\nprint('back', rank)", timeout=240)
    assert after.error is None, after.traceback + cluster.logs()
    assert sorted(x.split("] ")[1] for x in after.stdout.splitlines() if x.startswith("[rank ")) == [
        "back 0", "back 1", "back 2", "back 3"]


def test_a_network_cut_mid_cell_fails_it_naming_the_node_and_the_cut_off_ranks_exit(
        kernel: KernelSession, cluster: SlurmCluster, tmp_path: Path) -> None:
    """dlnode2's cable unplugged: no FIN ever arrives, so only the kit's own keepalive on its
    connections notices. The cell fails naming the node, the cut-off ranks end themselves (they
    lost their kernel), and once the cable is back the next cell runs."""
    kernel.execute(f"%%dist\nMARKS = {str(tmp_path)!r}")
    cut_off = cluster.joined_ranks_on("dlnode2")
    assert len(cut_off) == 2
    started = time.monotonic()
    fault = when_every_rank_is_looping(tmp_path, lambda: cluster.cut("dlnode2"))
    try:
        reply = kernel.execute(LOOP_CELL, timeout=150)
        fault.join()
        failed_after = time.monotonic() - started
        assert reply.error is not None, reply.stdout
        assert failed_after < 60, reply.traceback  # ~10 s of keepalive, within the cell's 120 s deadline
        assert "dlnode2" in reply.traceback and "rank 2" in reply.traceback.replace("ranks 2", "rank 2"), \
            reply.traceback
        assert wait_gone(cut_off, within=30.0) == []  # cut off from the kernel, they exit
    finally:
        cluster.reconnect("dlnode2")
    after = kernel.execute("%%dist\nprint('back', rank)", timeout=240)
    assert after.error is None, after.traceback + cluster.logs()
    assert len([x for x in after.stdout.splitlines() if x.startswith("[rank ")]) == 4


def test_a_request_slurm_cannot_start_says_why_and_is_withdrawn_on_interrupt(cluster: SlurmCluster) -> None:
    session = KernelSession()
    try:
        reply = session.execute(f'%load_ext distlab\n%dist_start -n 6 --launcher slurm --iface {NETWORK} '
                                '--srun-args "--nodes=3"', timeout=120,
                                interrupt_on=("SLURM has not started the ranks yet", 1))
        assert re.search(r"job \d+ pending \(\w+\)", reply.stdout), reply.stdout  # with SLURM's reason
        assert reply.error is not None and reply.error["ename"] == "CellInterrupted", reply.traceback
        assert "nothing is left queued or running" in reply.traceback  # one line, not distlab's own frames
        _wait_no_jobs(cluster, within=10.0)
        assert _squeue(cluster) == ""  # nothing left queued
        again = session.execute(START, timeout=180)  # and the kernel can go on
        assert again.error is None, again.traceback
    finally:
        session.shutdown()
        _wait_no_jobs(cluster)


def test_an_interface_name_one_node_lacks_is_named_with_the_node(cluster: SlurmCluster) -> None:
    """dl0 exists on the kernel's host and on dlnode1, not on dlnode2 (it calls the network dlx2)."""
    session = KernelSession()
    try:
        reply = session.execute('%load_ext distlab\n%dist_start -n 4 --launcher slurm --iface dl0 '
                                '--srun-args "--nodes=2 --ntasks-per-node=2"', timeout=180)
        assert reply.error is not None
        assert "dlnode2 has no network interface dl0" in reply.traceback and "subnet" in reply.traceback, \
            reply.traceback
        again = session.execute(f"%dist_start -n 4 --launcher slurm --iface {NETWORK} "
                                '--srun-args "--nodes=2 --ntasks-per-node=2"', timeout=180)
        assert again.error is None, again.traceback
    finally:
        session.shutdown()
        _wait_no_jobs(cluster)


def test_a_killed_kernel_leaves_no_task_on_any_node_and_no_job(cluster: SlurmCluster) -> None:
    session = KernelSession()
    reply = session.execute("%load_ext distlab\n" + START, timeout=180)
    assert reply.error is None, reply.traceback
    assert all(cluster.tasks_on(node) for node in NODES)
    folder, launcher = session.value(HUB_FOLDER_AND_LAUNCHER)
    session.kill()
    assert _wait_no_tasks(cluster, within=10.0) == {}
    _wait_no_jobs(cluster, within=10.0)
    assert _squeue(cluster) == ""
    assert wait_gone([launcher], within=10.0) == []
    assert not os.path.exists(folder)  # nothing of the kernel left in /tmp either


def test_a_kernel_killed_while_its_request_is_pending_leaves_nothing_queued(cluster: SlurmCluster) -> None:
    session = KernelSession()
    try:
        session.execute("%load_ext distlab")
        folder, launcher = session.value(HUB_FOLDER_AND_LAUNCHER)
        session.client.execute(f'%dist_start -n 6 --launcher slurm --iface {NETWORK} '
                               '--srun-args "--nodes=3"')  # not waited for: it never finishes
        deadline = time.monotonic() + 60
        while not _squeue(cluster) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _squeue(cluster), "the request never reached SLURM"
        session.kill()  # the kernel dies while SLURM holds its request
        _wait_no_jobs(cluster, within=10.0)
        assert _squeue(cluster) == ""
        assert wait_gone([launcher], within=10.0) == []
        assert not os.path.exists(folder)  # its launcher, the last to go, removed it
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
                   kernel_manager_class=AsyncUnixSocketKernelManager,
                   resources={"metadata": {"path": str(notebooks)}}).execute()
    shown = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "self-check passed" in shown and "@dlnode1]" in shown and "@dlnode2]" in shown
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not [o for o in cell.outputs if o.output_type == "error"], cell.source[:200]
    _wait_no_jobs(cluster)


def test_a_kernel_whose_allocation_a_step_holds_still_gets_its_ranks(
        cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """JupyterLab started with ``srun --pty`` runs in a step that holds its allocation's CPUs, and
    since Slurm 20.11 a step waits for CPUs another step holds: the ranks never started."""
    env = dict(os.environ, **cluster.env())
    granted = subprocess.run(["salloc", "--no-shell", "--nodes=2", "--ntasks-per-node=4"], env=env,
                             capture_output=True, text=True, timeout=60)
    job = re.search(r"Granted job allocation (\d+)", granted.stderr)
    assert job is not None, granted.stderr
    holder = subprocess.Popen(["srun", f"--jobid={job[1]}", "--nodes=2", "--ntasks-per-node=4", "sleep", "600"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    session: KernelSession | None = None
    try:
        deadline = time.monotonic() + 60
        while f"{job[1]}.0" not in subprocess.run(["squeue", "-h", "-s", "-o", "%i"], env=env, capture_output=True,
                                                  text=True, timeout=10).stdout:
            assert time.monotonic() < deadline, "the step holding every CPU did not start"
            time.sleep(0.1)
        monkeypatch.setenv("SLURM_JOB_ID", job[1])  # the kernel runs inside the allocation
        session = KernelSession()
        start = session.execute("%load_ext distlab\n" + START, timeout=180)
        assert start.error is None, start.traceback + cluster.logs()
        reply = session.execute("%%dist\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())")
        assert reply.error is None, reply.traceback
        assert sorted(reply.stdout.splitlines()) == [f"[rank {r} @dlnode{1 + r // 2}] 4.0" for r in range(4)]
    finally:
        if session is not None:
            session.shutdown()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGTERM)
        holder.wait(timeout=30)
        subprocess.run(["scancel", job[1]], env=env, capture_output=True, timeout=30)
        _wait_no_jobs(cluster)


def test_a_kernel_in_a_job_that_exports_no_environment_still_gets_its_ranks(
        cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel in a batch job started with ``sbatch --export=NONE`` (or a list, as JupyterHub's
    batchspawner does) inherits SLURM_EXPORT_ENV, and srun inside it passes that on: the ranks
    started without the variables that say where the kernel is, and never joined."""
    monkeypatch.setenv("SLURM_EXPORT_ENV", "NONE")
    session = KernelSession()
    try:
        start = session.execute("%load_ext distlab\n" + START, timeout=180)
        assert start.error is None, start.traceback + cluster.logs()
        reply = session.execute("%%dist\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())")
        assert reply.error is None, reply.traceback
        assert sorted(reply.stdout.splitlines()) == [f"[rank {r} @dlnode{1 + r // 2}] 4.0" for r in range(4)]
    finally:
        session.shutdown()
        _wait_no_jobs(cluster)
