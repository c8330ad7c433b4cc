"""Engine pieces that need no processes: messages, handshake, rank lists, backend choice, reports."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import socket

import pytest

from distlab import protocol
from distlab.backends import resolve_backend, visible_gpu_count
from distlab.errors import BackendUnavailable, RankError, RankTimeout
from distlab.protocol import Done, Output, RankFailure, RunCell
from distlab.report import format_failures, parse_ranks, rank_label, stack_frames
from distlab.sink import PrintSink


def test_messages_round_trip() -> None:
    failure = RankFailure(1, "ValueError", "boom", "Traceback...", "<dist cell 1>", 3, "raise ValueError")
    for message in (RunCell(7, "print(1)", "<dist cell 1>", True), Output(2, "stdout", "hi\n"),
                    Done(1, 7, failure, b"\x80", None, 0.5)):
        assert protocol.decode(protocol.encode(message)) == message


def test_decoder_refuses_anything_but_messages() -> None:
    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError, match="refused"):
        protocol.decode(pickle.dumps(Evil()))


def _pair() -> tuple[protocol.Connection, protocol.Connection]:
    a, b = socket.socketpair()
    return protocol.Connection(a.detach()), protocol.Connection(b.detach())


def test_handshake_accepts_the_right_key_and_rejects_a_wrong_one() -> None:
    import threading

    key = os.urandom(32)
    for client_key, ok in ((key, True), (os.urandom(32), False)):
        server, client = _pair()
        outcome: list[BaseException | None] = []

        def serve(server: protocol.Connection, outcome: list[BaseException | None]) -> None:
            try:
                protocol.server_handshake(server, key, timeout=5)
                outcome.append(None)
            except protocol.HandshakeFailed as exc:
                outcome.append(exc)

        thread = threading.Thread(target=serve, args=(server, outcome))
        thread.start()
        if ok:
            protocol.client_handshake(client, client_key, timeout=5)
        else:
            with pytest.raises((protocol.HandshakeFailed, EOFError, OSError)):
                protocol.client_handshake(client, client_key, timeout=2)
        thread.join()
        assert (outcome[0] is None) == ok
        server.close()
        client.close()


def test_rank_lists() -> None:
    assert parse_ranks("0,2", 4) == (0, 2)
    assert parse_ranks("1-3", 4) == (1, 2, 3)
    assert parse_ranks("3, 0-1", 4) == (0, 1, 3)
    for bad in ("9", "a", "2-1", "0;1", "__import__('os')"):
        with pytest.raises(ValueError):
            parse_ranks(bad, 4)
    assert rank_label([1, 2, 3]) == "ranks 1-3"
    assert rank_label([0, 2, 3, 5]) == "ranks 0,2-3,5"
    assert rank_label([4]) == "rank 4"


def test_ranks_are_placed_by_the_host_they_run_on() -> None:
    """Joined ranks learn LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK from this count: srun's
    cyclic order (a, b, a, b) and an uneven 2 + 1 both come out as torchrun would number them."""
    from distlab.pool import placement

    assert placement({0: "a", 1: "b", 2: "a", 3: "b"}) == {0: (0, 0, 2), 1: (1, 0, 2), 2: (0, 1, 2), 3: (1, 1, 2)}
    assert placement({2: "n2", 0: "n1", 1: "n1"}) == {0: (0, 0, 2), 1: (0, 1, 2), 2: (1, 0, 1)}


def test_backend_selection() -> None:
    assert resolve_backend("gloo", 4, gpus=8) == "gloo"
    assert resolve_backend("auto", 4, gpus=0) == "gloo"
    assert resolve_backend("auto", 4, gpus=2) == "gloo"
    assert resolve_backend("auto", 4, gpus=4) == "nccl"
    assert resolve_backend("nccl", 2, gpus=2) == "nccl"
    with pytest.raises(BackendUnavailable, match="one GPU per rank.*--backend gloo"):
        resolve_backend("nccl", 4, gpus=1)
    with pytest.raises(ValueError, match="unknown backend"):
        resolve_backend("mpi!", 2, gpus=0)


def test_visible_gpus_respect_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("distlab.backends._physical_gpus", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert visible_gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpu_count() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,-1,2")
    assert visible_gpu_count() == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpu_count() == 4


def test_identical_failures_are_shown_once() -> None:
    failures = [RankFailure(r, "ZeroDivisionError", "division by zero", "Traceback\nZeroDivisionError", "<c>", 1,
                            "x = 1/0") for r in (1, 2, 3)]
    failures.insert(0, RankFailure(0, "ValueError", "other", "Traceback\nValueError: other", "<c>", 2, "raise"))
    text = format_failures(failures)
    assert text.count("ZeroDivisionError") == 1
    assert "--- ranks 1-3 ---" in text and "--- rank 0 ---" in text
    assert "at cell line 1: x = 1/0" in text


def test_errors_pickle_and_render() -> None:
    failure = RankFailure(2, "KeyError", "'x'", "Traceback\nKeyError: 'x'", "<c>", 4, "d['x']")
    error = RankError.from_failures([failure], 4)
    copy = pickle.loads(pickle.dumps(error))
    assert copy.failures == [failure] and str(copy) == str(error)
    assert "1 of 4 ranks failed" in str(error)
    assert any("cell line 4" in line for line in error._render_traceback_())
    timeout = RankTimeout.hung("stuck", {0: "Stack (most recent call first):\n"}, [failure])
    copy_t = pickle.loads(pickle.dumps(timeout))
    assert isinstance(copy_t, TimeoutError) and copy_t.stacks == timeout.stacks


def test_stack_frames_pick_the_main_thread_and_drop_distlab_frames() -> None:
    dump = (
        "Thread 0x00007f01 (most recent call first):\n"
        '  File "/x/distlab/rank_io.py", line 40 in run\n'
        '  File "/usr/lib/python3.11/threading.py", line 975 in run\n'
        "\n"
        "Current thread 0x00007f00 (most recent call first):\n"
        '  File "/t/torch/distributed/distributed_c10d.py", line 2799 in recv\n'
        '  File "<dist cell 3>", line 2 in <module>\n'
        '  File "/x/distlab/worker.py", line 170 in _run_cell\n'
        '  File "/x/distlab/launcher.py", line 90 in spawn\n'
    )
    frames = stack_frames(dump)
    assert [f[0] for f in frames] == ["<dist cell 3>", "/t/torch/distributed/distributed_c10d.py"]


def test_carriage_returns_end_as_the_line_a_notebook_would_show() -> None:
    """PrintSink (distlab.run, the grader) prints a rewritten line once, as it ended; "\\r\\n"
    ends a line; a chunk boundary anywhere changes nothing."""
    text = "before\r\n\rstep 1\rstep 2\rstep 3\nplain\nlast\rfinal"
    for cut in range(len(text) + 1):
        sink, out = PrintSink(), io.StringIO()
        with contextlib.redirect_stdout(out):
            sink.begin()
            sink.output(0, "stderr", text[:cut])
            sink.output(0, "stderr", text[cut:])
            sink.end()
        assert out.getvalue() == "[rank 0] before\n[rank 0] step 3\n[rank 0] plain\n[rank 0] final\n", cut


def test_an_interrupt_says_whether_the_ranks_had_their_grace() -> None:
    """Pressed once, stuck ranks get a grace before they are killed; pressed twice, they are
    killed at once, and the message must not claim they were given the grace."""
    from distlab.pool import INTERRUPT_GRACE, Outcome

    stuck = {0: "", 1: ""}
    once = Outcome("interrupted", 2, {}, [], stuck).error()
    twice = Outcome("interrupted", 2, {}, [], stuck, pressed_twice=True).error()
    assert str(once) == f"interrupted; ranks 0-1 did not stop within {INTERRUPT_GRACE:.0f} s and were killed"
    assert str(twice) == "interrupted twice; ranks 0-1 were killed at once"
    one = Outcome("interrupted", 3, {}, [], {2: ""}).error()  # one rank: "was", not "were"
    assert str(one) == f"interrupted; rank 2 did not stop within {INTERRUPT_GRACE:.0f} s and was killed"
    assert str(Outcome("interrupted", 3, {}, [], {2: ""}, pressed_twice=True).error()) == \
        "interrupted twice; rank 2 was killed at once"


def test_the_stop_button_waits_while_a_task_goes_out_and_is_handed_on() -> None:
    """A press while a task's bytes are written must not cut the write (half a message in a
    rank's channel): it is noted, handed on, and the stop button works as before afterwards."""
    import signal

    from distlab.pool import stop_button_held

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a kernel (a test worker may differ)
    try:
        with stop_button_held() as pressed:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            written = True
        assert written and pressed == [True, True]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)


THREADS = """import os
from distlab.worker import threads_per_rank
for name in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
    os.environ.pop(name, None)
host = len(os.sched_getaffinity(0))
said = [threads_per_rank(1) == host, threads_per_rank(2 * host)]
os.environ["SLURM_CPUS_PER_TASK"] = "5"
said.append(threads_per_rank(1))
os.environ["OMP_NUM_THREADS"] = "3"
said.append(threads_per_rank(1))
del os.environ["OMP_NUM_THREADS"], os.environ["SLURM_CPUS_PER_TASK"]
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
said.append(threads_per_rank(1) if host > 1 else "bound")
print(*said)
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_each_rank_uses_the_cpus_it_is_given() -> None:
    """A share of the CPUs the process may use (its cpuset, not the whole machine); what the user
    asked for when they did: srun's --cpus-per-task, OMP_NUM_THREADS above all."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", THREADS], capture_output=True, text=True, timeout=60, check=True)
    # all CPUs for one rank, one thread each for many, --cpus-per-task, OMP_NUM_THREADS, bound to one CPU
    assert done.stdout.split() == ["True", "1", "5", "3", "1" if len(os.sched_getaffinity(0)) > 1 else "bound"]


def test_a_rank_that_fails_before_it_reaches_the_kernel_is_heard_through_the_launchers_log() -> None:
    """Its line names the rank and why; a pool reads only its own generation's lines."""
    log = "".join([
        "some warning the launcher printed\n",
        protocol.early_failure("p1", 2, 0, OSError("this machine gave the grading ranks no network of their own")),
        protocol.early_failure("p1", 1, 1, MemoryError()),  # an older generation of the same pool
        protocol.early_failure("p10", 2, 1, RuntimeError("another pool's")),
        protocol.early_failure("p1", 2, 1, OSError("the first rank could not make the ranks' own network")),
    ])
    assert protocol.early_failures(log, "p1", 2) == [
        "rank 0 could not start: OSError: this machine gave the grading ranks no network of their own",
        "rank 1 could not start: OSError: the first rank could not make the ranks' own network"]
    assert protocol.early_failures(log, "p1", 1) == ["rank 1 could not start: MemoryError"]
    assert protocol.early_failures("", "p1", 2) == []


def test_a_machine_that_cannot_fork_is_told_to_use_wsl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows has no fork, which the launcher needs: the extension and distlab.run say so and
    what to do, instead of a launcher that dies unexplained. (Windows does not run here: os.fork
    is taken away for the test.)"""
    from IPython.core.error import UsageError

    import distlab
    from distlab import prestart
    from distlab.errors import PoolDied

    monkeypatch.delattr(os, "fork")
    with pytest.raises(UsageError, match="Windows cannot fork a process. Run JupyterLab in WSL"):
        distlab.load_ipython_extension(None)
    with pytest.raises(PoolDied, match="Run JupyterLab in WSL"):
        prestart.take()
