"""Faults in a real kernel: hangs, interrupts, crashes, a killed kernel. Each leaves no rank behind."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from kernel_session import HUB_FOLDER_AND_LAUNCHER, KernelSession
from procs import children, signal_pending, wait_gone

PIDS = "[h.pid for _, h in sorted(__import__('distlab.magic').magic.session().pool.handles.items())]"
LAUNCHER = "__import__('distlab.hub').hub.Hub.get().launcher.pid"


@pytest.fixture(scope="module")
def kernel() -> Iterator[KernelSession]:
    session = KernelSession()
    session.execute("%load_ext distlab")
    yield session
    session.shutdown()


def _ready_pids(kernel: KernelSession, ranks: int) -> list[int]:
    reply = kernel.execute(f"%%dist -n {ranks}\npass")
    assert reply.error is None, reply.traceback
    return kernel.value(PIDS)


def _next_cell_works(kernel: KernelSession, ranks: int) -> None:
    reply = kernel.execute("%%dist\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(int(t.item()))")
    assert reply.error is None, reply.traceback
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] {ranks}" for r in range(ranks)]


HANGS = {
    "both ranks receive first": (
        2, "t = torch.zeros(1)\ndist.recv(t, src=1 - rank)\n", "--timeout 3",
        ["the cell ran past its 3 s deadline", "--- ranks 0-1 ---", "waiting at cell line 2: dist.recv(t, src=1 - rank)"]),
    "broadcast against all_reduce": (
        4, "t = torch.zeros(1)\nif rank == 0:\n    dist.broadcast(t, src=0)\nelse:\n    dist.all_reduce(t)\n",
        "--timeout 3",
        ["--- rank 0 ---", "waiting at cell line 3: dist.broadcast(t, src=0)",
         "--- ranks 1-3 ---", "waiting at cell line 5: dist.all_reduce(t)"]),
    "one rank raises before all_reduce": (
        4, "t = torch.ones(1)\nif rank == 2:\n    raise RuntimeError('rank 2 gives up')\ndist.all_reduce(t)\n",
        "--timeout 120",
        ["rank 2 failed and ranks 0-1,3 hung", "RuntimeError: rank 2 gives up",
         "--- ranks 0-1,3 ---", "waiting at cell line 4: dist.all_reduce(t)"]),
}


@pytest.mark.parametrize("case", list(HANGS))
def test_a_hang_shows_every_ranks_stack_restarts_and_the_next_cell_works(kernel: KernelSession, case: str) -> None:
    ranks, body, option, expected = HANGS[case]
    old = _ready_pids(kernel, ranks)
    reply = kernel.execute(f"%%dist -n {ranks} {option}\n{body}")
    assert reply.error is not None and reply.error["ename"] == "RankTimeout"
    for text in expected:
        assert text in reply.traceback, text
    assert "Rank state was lost" in reply.traceback
    # the failure ended the cell, not the 120 s deadline: the report came right after the grace period
    assert reply.seconds < 30
    assert wait_gone(old) == []
    _next_cell_works(kernel, ranks)


def test_interrupt_stops_ranks_that_listen(kernel: KernelSession) -> None:
    old = _ready_pids(kernel, 2)
    kernel.execute("%%dist\nkept = 'yes'")
    reply = kernel.execute("%%dist\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)",
                           interrupt_on=("sleeping", 2))
    assert reply.error is not None and reply.error["ename"] == "CellInterrupted"
    assert "every rank stopped" in reply.traceback and "KeyboardInterrupt" in reply.traceback
    assert kernel.value(PIDS) == old  # they stopped by themselves: the pool and its variables survive
    assert kernel.value("%dist_pull kept") == ["yes", "yes"]


def test_an_interrupt_that_reaches_a_rank_before_its_cell_stops_the_cell_there(kernel: KernelSession) -> None:
    """The stop button pressed while the cell is still on its way to a rank: the signal comes
    first, when the rank is not yet in the cell. Made certain here by stopping rank 1 (SIGSTOP)
    until the kernel's SIGINT is pending on it. The rank must still stop the cell at once, and
    keep its variables, instead of running it until the grace ends and being killed."""
    old = _ready_pids(kernel, 2)
    kernel.execute("%%dist\nkept = 'yes'")
    os.kill(old[1], signal.SIGSTOP)

    def resume_once_signalled() -> None:
        try:
            assert signal_pending(old[1], signal.SIGINT), "the kernel never signalled rank 1"
        finally:
            os.kill(old[1], signal.SIGCONT)

    reply = kernel.execute("%%dist\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)",
                           interrupt_on=("sleeping", 1), after_interrupt=resume_once_signalled)
    assert reply.error is not None and reply.error["ename"] == "CellInterrupted"
    assert reply.traceback.splitlines()[0].endswith("interrupted: every rank stopped"), reply.traceback
    assert reply.stdout == "[rank 0] sleeping\n"  # rank 1 never began the cell
    assert kernel.value(PIDS) == old
    assert kernel.value("%dist_pull kept") == ["yes", "yes"]
    _next_cell_works(kernel, 2)


def test_interrupt_kills_ranks_stuck_in_a_collective(kernel: KernelSession) -> None:
    old = _ready_pids(kernel, 2)
    reply = kernel.execute("%%dist --timeout 300\nt = torch.zeros(1)\nprint('receiving', flush=True)\n"
                           "dist.recv(t, src=1 - rank)", interrupt_on=("receiving", 2))
    assert reply.error is not None and reply.error["ename"] == "CellInterrupted"
    assert "did not stop" in reply.traceback and "waiting at cell line 3" in reply.traceback
    assert reply.seconds < 30
    assert wait_gone(old) == []
    _next_cell_works(kernel, 2)


def test_an_interrupt_while_ranks_start_says_nothing_ran_and_the_next_cell_works(kernel: KernelSession) -> None:
    """The stop button pressed while the ranks are still starting (here: ranks another launcher
    should start, which never come) gives one line, not distlab's own wait in a traceback.
    (Ranks forked here go on starting: that line says the next cell waits for them.)"""
    reply = kernel.execute("%dist_start -n 2 --launcher external --iface lo",
                           interrupt_on=("waiting for 2 ranks", 1))
    assert reply.error is not None and reply.error["ename"] == "CellInterrupted", reply.traceback
    assert reply.traceback.strip() == ("CellInterrupted: interrupted while the ranks were starting: nothing ran, "
                                       "and nothing is left queued or running. The next cell starts them again."), \
        reply.traceback
    assert reply.stderr == ""
    assert kernel.execute("%dist_start -n 2 --launcher local").error is None
    _next_cell_works(kernel, 2)


def test_an_interrupt_during_a_restart_leaves_one_line_and_a_working_kernel(kernel: KernelSession) -> None:
    """A new world size stops the old ranks and starts new ones; the stop button pressed as soon
    as the restart is announced lands in the stop, the start or the cell: whichever, the cell
    ends in one distlab line (no frames of distlab's own code) and the next cell works. When it
    lands while the cell is on its way to a rank, the rank stops as it begins the cell: no rank
    runs on until it is killed."""
    _ready_pids(kernel, 2)
    reply = kernel.execute("%%dist -n 3\nimport time\ntime.sleep(60)",
                           interrupt_on=("distlab: restarting the pool with 3 ranks", 1))
    assert reply.error is not None and reply.error["ename"] == "CellInterrupted", reply.traceback
    assert "distlab/" not in reply.traceback and reply.stderr == "", reply.traceback
    said = reply.traceback.splitlines()[0]
    assert any(words in said for words in ("the old ranks were stopping", "the ranks were starting: nothing ran on them",
                                           "every rank stopped")), said
    _next_cell_works(kernel, 3)


CRASHES = {
    "os._exit(3)": ("import os\nos._exit(3)", "exited with code 3"),
    "SIGKILL": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
                "killed by SIGKILL\n(If no one killed it, the usual cause is Linux's out-of-memory killer"),
    "segfault": ("import ctypes\nctypes.string_at(0)", "killed by SIGSEGV"),
}


@pytest.mark.parametrize("case", list(CRASHES))
def test_a_crash_is_reported_with_its_exit_code_or_signal(kernel: KernelSession, case: str) -> None:
    body, expected = CRASHES[case]
    old = _ready_pids(kernel, 2)
    reply = kernel.execute(f"%%dist --ranks 1\n{body}")
    assert reply.error is not None and reply.error["ename"] == "RankError"
    assert "--- rank 1 ---" in reply.traceback and expected in reply.traceback
    assert wait_gone(old) == []
    _next_cell_works(kernel, 2)


def test_a_killed_launcher_is_named_and_the_next_cell_works(kernel: KernelSession) -> None:
    """The process that forks the ranks killed between cells: its ranks end with it, the next
    cell says so, and the one after runs on ranks a fresh launcher forked."""
    old = _ready_pids(kernel, 2)
    launcher = kernel.value(LAUNCHER)
    assert kernel.execute(f"import os, signal\nos.kill({launcher}, signal.SIGKILL)").error is None
    assert wait_gone([launcher, *old]) == []
    reply = kernel.execute("%%dist\nprint(rank)")
    assert reply.error is not None and reply.error["ename"] == "RankError"
    assert "the rank ended with its launcher (the process that forks the ranks)" in reply.traceback, reply.traceback
    assert reply.stderr == ""
    _next_cell_works(kernel, 2)
    assert kernel.value(LAUNCHER) != launcher


def test_a_crash_during_a_collective_fails_the_cell(kernel: KernelSession) -> None:
    old = _ready_pids(kernel, 4)
    reply = kernel.execute("%%dist\nimport os\nif rank == 1:\n    os._exit(5)\nt = torch.ones(1)\ndist.all_reduce(t)")
    assert reply.error is not None and reply.error["ename"] in ("RankError", "RankTimeout")
    assert "exited with code 5" in reply.traceback
    assert wait_gone(old) == []
    _next_cell_works(kernel, 4)


# processes a rank starts and leaves running, as a cell that starts a helper server would: one in
# the rank's process group, one in a session of its own, and a daemon whose parent has exited
START_SLEEPER = """%%dist
import subprocess, sys
SLEEP = [sys.executable, '-c', 'import time; time.sleep(300)']
DAEMON = ('import subprocess; print(subprocess.Popen(%r, start_new_session=True, '
          'stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)' % SLEEP)
sleeper = [subprocess.Popen(SLEEP).pid, subprocess.Popen(SLEEP, start_new_session=True).pid,
           int(subprocess.run([sys.executable, '-c', DAEMON], capture_output=True, text=True).stdout)]
"""


def _sleepers(kernel: KernelSession) -> list[int]:
    reply = kernel.execute(START_SLEEPER)
    assert reply.error is None, reply.traceback
    return [int(pid) for pids in kernel.value("%dist_pull sleeper") for pid in pids]


@pytest.mark.parametrize("how", ["SIGKILL", "shutdown"])
def test_no_rank_outlives_its_kernel(how: str) -> None:
    """Nor anything a rank started: each rank leads its own process group, ended with it, and what
    leaves the group (a new session, a daemon) comes back to the launcher, which ends it."""
    session = KernelSession()
    session.execute("%load_ext distlab")
    launcher = session.value(LAUNCHER)
    folder = session.value("__import__('distlab.hub').hub.Hub.get().dir")  # its socket, its ranks' files
    pids = _ready_pids(session, 4) + [launcher] + _sleepers(session)
    pids += children(launcher)  # the ranks and the tracker of the names they share
    if how == "SIGKILL":
        session.kill()
    else:
        session.shutdown()
    assert wait_gone(pids, within=5.0) == []
    assert not os.path.exists(folder)  # a killed kernel's too: its launcher, the last to go, removes it


def test_a_kernel_killed_right_after_load_ext_leaves_no_folder() -> None:
    """Its launcher, still importing torch, is the last of its processes and removes the kernel's
    folder (a SLURM kernel killed while its request was pending left it so)."""
    session = KernelSession()
    session.execute("%load_ext distlab")
    folder, launcher = session.value(HUB_FOLDER_AND_LAUNCHER)
    session.kill()
    assert wait_gone([launcher], within=10.0) == []
    assert not os.path.exists(folder)


def test_a_restart_ends_what_the_old_ranks_started(kernel: KernelSession) -> None:
    _ready_pids(kernel, 2)
    sleepers = _sleepers(kernel)
    assert len(sleepers) == 6 and wait_gone(sleepers, within=0.5) == sleepers  # running
    reply = kernel.execute("%%dist -n 3\nprint(rank)")
    assert reply.error is None, reply.traceback
    assert wait_gone(sleepers) == []
    _next_cell_works(kernel, 3)


# names in /dev/shm that outlive the process that made them unless someone unlinks them: the
# semaphores of a spawn Queue (a forkserver one too, Python 3.14's default) and a shared memory block
SHARE_NAMES = """%%dist
import multiprocessing as mp
from multiprocessing import shared_memory
queue = mp.get_context('spawn').Queue()
queue.put(rank)
assert queue.get() == rank
block = shared_memory.SharedMemory(create=True, size=4096)
shared = [queue._rlock._semlock.name, queue._sem._semlock.name, block.name]
"""


def _shared_names(kernel: KernelSession) -> list[str]:
    reply = kernel.execute(SHARE_NAMES)
    assert reply.error is None, reply.traceback
    assert reply.stderr == ""
    paths = []
    for names in kernel.value("%dist_pull shared"):
        semaphores, block = names[:2], names[2]
        paths += [f"/dev/shm/sem.{name.lstrip('/')}" for name in semaphores] + [f"/dev/shm/{block.lstrip('/')}"]
    assert all(os.path.exists(path) for path in paths), paths
    return paths


def _still_there(paths: list[str], within: float = 5.0) -> list[str]:
    """The paths that still exist after ``within`` seconds (polling; returns early when all are gone)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(os.path.exists(path) for path in paths):
        time.sleep(0.05)
    return [path for path in paths if os.path.exists(path)]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="names shared between processes live in /dev/shm on Linux")
@pytest.mark.parametrize("how", ["timeout", "restart"])
def test_names_that_ranks_share_are_unlinked_when_the_ranks_end(kernel: KernelSession, how: str) -> None:
    _ready_pids(kernel, 2)
    paths = _shared_names(kernel)
    if how == "timeout":  # the ranks are killed in the middle of a cell
        reply = kernel.execute("%%dist --timeout 2\nimport time\ntime.sleep(60)")
        assert reply.error is not None and reply.error["ename"] == "RankTimeout"
    else:
        reply = kernel.execute("%dist_restart")
        assert reply.error is None, reply.traceback
    assert _still_there(paths) == []
    _next_cell_works(kernel, 2)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="names shared between processes live in /dev/shm on Linux")
@pytest.mark.parametrize("how", ["SIGKILL", "shutdown"])
def test_names_that_ranks_share_do_not_outlive_the_kernel(how: str) -> None:
    session = KernelSession()
    session.execute("%load_ext distlab")
    _ready_pids(session, 2)
    paths = _shared_names(session)
    session.kill() if how == "SIGKILL" else session.shutdown()
    assert _still_there(paths) == []


def test_a_cell_that_closes_its_output_leaves_the_next_cell_working(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist -n 4\nimport os, sys\nif rank == 0:\n    os.close(1)\nif rank == 1:\n"
                           "    sys.stdout.close()\nif rank == 2:\n    sys.stderr = None\n")
    assert reply.error is None, reply.traceback
    reply = kernel.execute("%%dist\nimport sys\nprint('out', rank)\nprint('err', rank, file=sys.stderr)")
    assert reply.error is None, reply.traceback
    assert sorted(reply.stdout.splitlines()) == sorted([f"[rank {r}] out {r}" for r in range(4)]
                                                       + [f"[rank {r}] err {r}" for r in range(4)])


@pytest.mark.slow  # waits out the handshake deadline on purpose
def test_ranks_started_at_load_survive_a_learner_who_reads_first() -> None:
    import time

    from distlab.protocol import HANDSHAKE_TIMEOUT

    session = KernelSession()
    try:
        session.execute("%load_ext distlab")
        time.sleep(HANDSHAKE_TIMEOUT + 3)  # the kernel runs nothing while the learner reads
        reply = session.execute("%%dist\nprint(rank)")
        assert reply.error is None, reply.traceback
        assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] {r}" for r in range(4)]
    finally:
        session.shutdown()
