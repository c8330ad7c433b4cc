"""Ranks started by someone else's launcher: `python -m distlab.join` over TCP, as on a cluster.

On a cluster the kernel cannot fork ranks on other hosts; srun (or torchrun, mpirun, ssh) starts
`python -m distlab.join` once per rank, and each connects back to the kernel on the interface the
user named. Here every process runs on this machine on loopback, started by the test as an outside
launcher would (with RANK / WORLD_SIZE / LOCAL_RANK, as torchrun sets them). What a class relies
on: cells and collectives run on joined ranks exactly as on forked ones, output says which host
printed it, a hang is reported with each rank's line, the secret never shows on a command line,
a peer without it is dropped before anything is unpickled, and no rank outlives its kernel.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import wait_gone

from distlab import protocol
from distlab.cluster import ClusterLaunch
from distlab.errors import PoolDied, RankTimeout
from distlab.pool import Pool

WORLD = 3
pytestmark = pytest.mark.slow  # real rank processes over TCP: make test, not make check


def _join_env(note: str) -> dict[str, str]:
    """The environment the printed command gives every rank (what the user's launcher passes on)."""
    line = next(x for x in note.splitlines() if x.strip().startswith("env "))
    env = dict(os.environ)
    for item in shlex.split(line.strip())[1:]:
        if "=" not in item:
            break
        name, value = item.split("=", 1)
        env[name] = value
    return env


def _launch(env: dict[str, str], world: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-m", "distlab.join"],
                             env=dict(env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r)),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for r in range(world)]


class Quiet:
    nodes: dict[int, str] = {}

    def __init__(self) -> None:
        self.lines: list[str] = []

    def output(self, rank: int, stream: str, text: str) -> None:
        node = self.nodes.get(rank, "")
        self.lines += [f"[rank {rank} @{node}] {x}" for x in text.splitlines()]

    def display(self, rank: int, data: dict[str, object], metadata: dict[str, object],
                display_id: str | None = None, update: bool = False) -> None:
        pass


@pytest.fixture
def joined(request: pytest.FixtureRequest) -> Iterator[tuple[Pool, Quiet, list[subprocess.Popen[bytes]]]]:
    """Ranks that joined over the interface named as ``lo`` (or, as a parameter, as its subnet)."""
    sink = Quiet()
    iface = getattr(request, "param", "lo")
    pool = Pool(WORLD, "gloo", sink=sink, cluster=ClusterLaunch("external", iface), eager_restart=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        pool.start()
    procs = _launch(_join_env(printed.getvalue()), WORLD)
    try:
        pool.ensure_ready()
        yield pool, sink, procs
    finally:
        pool.stop()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# a subnet: for clusters whose nodes name one network differently (eth0 here, ens3 there)
@pytest.mark.parametrize("joined", ["lo", "127.0.0.0/8"], ids=["by-name", "by-subnet"], indirect=True)
def test_joined_ranks_run_cells_and_collectives_and_say_where(joined) -> None:  # type: ignore[no-untyped-def]
    pool, sink, _ = joined
    pool.run_cell("t = torch.tensor([rank + 1.0])\ndist.all_reduce(t)\nprint(t.item(), local_rank)", "<c1>")
    host = socket.gethostname()
    assert sorted(sink.lines) == [f"[rank {r} @{host}] 6.0 {r}" for r in range(WORLD)]
    sink.lines.clear()
    pool.run_cell("import os\nprint(os.environ['GLOO_SOCKET_IFNAME'])", "<ifname>")  # this host's name for it
    assert sorted(sink.lines) == [f"[rank {r} @{host}] lo" for r in range(WORLD)]
    pool.run_cell("kept = rank * 10", "<c2>")  # state stays on the ranks from cell to cell
    assert pool.pull("kept") == [0, 10, 20]
    gathered = pool.call(_all_gather_ranks)
    assert [pickle.loads(gathered[r].value) for r in range(WORLD)] == [[0, 1, 2]] * WORLD
    assert [row["node"] for row in pool.status()] == [host] * WORLD


def _all_gather_ranks() -> list[int]:
    import torch
    import torch.distributed as dist

    out = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.tensor([float(dist.get_rank())]))
    return [int(t.item()) for t in out]


def test_a_hang_names_each_ranks_line_and_ends_the_ranks(joined) -> None:  # type: ignore[no-untyped-def]
    pool, _, procs = joined
    with pytest.raises(RankTimeout) as hung:
        pool.run_cell("t = torch.zeros(1)\ndist.recv(t, src=(rank + 1) % world_size)", "<hang>", timeout=3)
    assert "waiting at cell line 2: dist.recv" in hung.value.report
    assert wait_gone([p.pid for p in procs], within=10.0) == []  # asked to exit on their control line


def test_the_stop_button_reaches_joined_ranks(joined) -> None:  # type: ignore[no-untyped-def]
    """Ranks on other hosts cannot be signalled by pid: the interrupt travels on their control line."""
    import threading

    from distlab.errors import CellInterrupted

    pool, sink, procs = joined
    pool.run_cell("kept = 'yes'", "<keep>")

    pressed: list[float] = []

    def press_stop_once_all_sleep() -> None:
        deadline = time.monotonic() + 100
        while sum("sleeping" in line for line in sink.lines) < WORLD:
            if time.monotonic() > deadline:
                return  # never pressed: the assertion below says so
            time.sleep(0.01)
        pressed.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)  # what the notebook's stop button does to the kernel

    # SIGINT raises KeyboardInterrupt here, as in a kernel (an earlier test's browser may have
    # left another handler installed in this process)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=press_stop_once_all_sleep, daemon=True).start()
    try:
        pool.run_cell("import time\nprint('sleeping', flush=True)\ntime.sleep(150)", "<sleep>", timeout=200)
    except CellInterrupted as stopped:
        assert "every rank stopped" in str(stopped)
    else:
        pytest.fail(f"the cell was not interrupted; stop pressed at {pressed}, rank output {sink.lines}")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert pool.pull("kept") == ["yes"] * WORLD  # they stopped by themselves: state survives


def test_the_secret_is_never_on_a_command_line_and_only_the_user_reads_it(joined) -> None:  # type: ignore[no-untyped-def]
    pool, _, procs = joined
    key = pool.hub.key.hex()
    for proc in procs:
        assert key not in (Path("/proc") / str(proc.pid) / "cmdline").read_text()
    key_file = Path.home() / ".distlab" / f"{pool.pool_id}.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key_file.read_text() == key


def test_a_key_folder_the_nodes_share_can_replace_the_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a cluster whose nodes do not see the kernel's home, DISTLAB_KEY_DIR names a folder they do."""
    monkeypatch.setenv("DISTLAB_KEY_DIR", str(tmp_path / "shared"))
    sink = Quiet()
    pool = Pool(2, "gloo", sink=sink, cluster=ClusterLaunch("external", "lo"), eager_restart=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        pool.start()
    env = _join_env(printed.getvalue())
    key_file = Path(env["DISTLAB_KEY_FILE"])
    assert key_file.parent == tmp_path / "shared" and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    procs = _launch(env, 2)
    try:
        pool.ensure_ready()
        pool.run_cell("print(rank)", "<c>")
        assert sorted(sink.lines) == [f"[rank {r} @{socket.gethostname()}] {r}" for r in range(2)]
    finally:
        pool.stop()
        assert wait_gone([p.pid for p in procs], within=10.0) == []
        for proc in procs:
            proc.wait()


def test_the_kernel_listens_on_the_named_interface_only(joined) -> None:  # type: ignore[no-untyped-def]
    pool, _, _ = joined
    address = pool.hub.listen_tcp("127.0.0.1")
    assert address.startswith("127.0.0.1:")
    assert pool.hub._tcp is not None and pool.hub._tcp.getsockname()[0] == "127.0.0.1"


def test_a_peer_without_the_key_is_dropped_before_anything_is_unpickled(joined, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pool, _, _ = joined
    address = pool.hub.listen_tcp("127.0.0.1")
    with pytest.raises(protocol.HandshakeFailed):
        protocol.connect(address, b"not the key" * 3)
    # a peer that skips the handshake and sends a pickle that would run code gets nowhere
    marker = tmp_path / "pwned"
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as raw:
        payload = pickle.dumps(_Evil(str(marker)))
        raw.sendall(len(payload).to_bytes(4, "big") + payload)
        raw.settimeout(10)
        with contextlib.suppress(OSError):
            while raw.recv(4096):
                pass  # the hub sends its challenge, gets nonsense, and closes
    assert not marker.exists()
    pool.run_cell("pass", "<after>")  # and the pool still works


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.path}",))


KERNEL = textwrap.dedent("""
    import contextlib, io, sys, time
    from distlab.cluster import ClusterLaunch
    from distlab.pool import Pool
    pool = Pool({world}, "gloo", cluster=ClusterLaunch("external", "lo"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        pool.start()
    print(printed.getvalue(), flush=True)
    pool.ensure_ready()
    pool.run_cell("pass", "<c>")
    print("READY", flush=True)
    time.sleep(600)
""")


def test_no_joined_rank_outlives_a_killed_kernel() -> None:
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL.format(world=WORLD)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        assert kernel.stdout is not None
        note = "".join(iter(kernel.stdout.readline, "\n"))  # the printed command, then a blank line
        procs = _launch(_join_env(note), WORLD)
        assert kernel.stdout.readline().strip() == "READY"
        os.killpg(kernel.pid, signal.SIGKILL)  # the kernel dies without any goodbye
        kernel.wait()
        assert wait_gone([p.pid for p in procs], within=10.0) == []
        # nor does what a joined rank keeps on its host: its stack file is unlinked once open
        assert [p.pid for p in procs if os.path.exists(os.path.join(tempfile.gettempdir(), f"distlab-{p.pid}.stack"))] == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(kernel.pid, signal.SIGKILL)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_every_launcher_s_rank_variables_are_read(tmp_path: Path) -> None:
    from distlab import join

    assert join._first({"SLURM_PROCID": "5", "RANK": "1"}, join._RANK_VARS) == "5"
    assert join._first({"OMPI_COMM_WORLD_RANK": "2"}, join._RANK_VARS) == "2"
    assert join._first({"PMI_SIZE": "8"}, join._SIZE_VARS) == "8"
    assert join._first({"SLURM_NTASKS_PER_NODE": "4(x2)"}, join._LOCAL_SIZE_VARS) == "4"
    assert join.interface_address("lo") == "127.0.0.1"
    assert join.local_interface("lo") == join.local_interface("127.0.0.0/8") == ("lo", "127.0.0.1")
    for wrong, said in (("203.0.113.77/32", "no network interface of"), ("10.0.0.0/99", "neither an interface name"),
                        ("nosuchif0", "no network interface nosuchif0 .* give its subnet")):
        with pytest.raises(PoolDied, match=said):
            join.local_interface(wrong)
    key = tmp_path / "k"
    key.write_text("ab" * 32)
    assert join.read_key({"DISTLAB_KEY_FILE": str(key)}) == bytes.fromhex("ab" * 32)
    with pytest.raises(PoolDied, match="key file .*/gone.key is not here.* DISTLAB_KEY_DIR"):  # a home the node lacks
        join.read_key({"DISTLAB_KEY_FILE": str(tmp_path / "gone.key")})


def test_nccl_on_a_node_without_enough_gpus_says_why_and_falls_back_to_gloo() -> None:
    """NCCL refuses two ranks on one GPU; the nodes count their GPUs, and every rank moves to gloo."""
    sink = Quiet()
    pool = Pool(2, "nccl", sink=sink, cluster=ClusterLaunch("external", "lo"), eager_restart=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        pool.start()
    procs = _launch(dict(_join_env(printed.getvalue()), CUDA_VISIBLE_DEVICES=""), 2)
    try:
        told = io.StringIO()
        with contextlib.redirect_stdout(told):
            pool.ensure_ready()
        host = socket.gethostname()
        assert "NCCL needs one GPU per rank" in told.getvalue(), told.getvalue()
        assert f"{host}: 2 ranks, 0 GPUs" in told.getvalue() and "use gloo instead" in told.getvalue()
        assert pool.backend == "gloo"
        pool.run_cell("t = torch.ones(1)\ndist.all_reduce(t)\nprint(dist.get_backend(), t.item(), device)", "<c>")
        assert sorted(sink.lines) == [f"[rank {r} @{host}] gloo 2.0 cpu" for r in range(2)]
    finally:
        pool.stop()
        assert wait_gone([p.pid for p in procs], within=10.0) == []
        for proc in procs:
            proc.wait()
