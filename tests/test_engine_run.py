"""distlab.run: the plain-Python entry point used by scripts, tests and the grader."""

from __future__ import annotations

import pytest
import torch
from procs import children, wait_gone

import distlab
from distlab.hub import Hub


def _all_reduce_rank_plus_one() -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor([dist.get_rank() + 1.0, 1.0])
    dist.all_reduce(t)
    return t.tolist()


def test_run_returns_each_ranks_value_in_rank_order() -> None:
    results = distlab.run(_all_reduce_rank_plus_one, world_size=3)
    assert results == [[6.0, 3.0]] * 3


def test_run_matches_torchs_collective_and_sends_closures_by_value() -> None:
    scale = 2.5  # captured by the closure: must travel by value

    def scaled_gather() -> torch.Tensor:
        import torch.distributed as dist

        mine = torch.full((2,), float(dist.get_rank()) * scale)
        out = [torch.empty(2) for _ in range(dist.get_world_size())]
        dist.all_gather(out, mine)
        return torch.stack(out)

    results = distlab.run(scaled_gather, world_size=4)
    expected = torch.tensor([[0.0, 0.0], [2.5, 2.5], [5.0, 5.0], [7.5, 7.5]])
    assert all(torch.equal(r, expected) for r in results)


def test_args_and_kwargs_reach_every_rank() -> None:
    def add(a: int, b: int = 0) -> int:
        import torch.distributed as dist

        return a + b + dist.get_rank()

    assert distlab.run(add, world_size=2, args=(10,), kwargs={"b": 5}) == [15, 16]


def test_a_failing_rank_raises_rank_error_with_its_traceback() -> None:
    def fail_on_one() -> None:
        import torch.distributed as dist

        if dist.get_rank() == 1:
            raise KeyError("missing")

    with pytest.raises(distlab.RankError) as info:
        distlab.run(fail_on_one, world_size=2)
    (failure,) = info.value.failures
    assert failure.rank == 1 and failure.exc_type == "KeyError"
    assert "raise KeyError" in failure.traceback


def _raise_feedback_or_an_imitation() -> None:
    import torch.distributed as dist

    from distlab.errors import SubmissionFailed

    class Imitation(Exception):
        pass

    Imitation.__name__ = Imitation.__qualname__ = "SubmissionFailed"
    if dist.get_rank() == 0:
        raise SubmissionFailed("world_size=2: raised ValueError")
    raise Imitation("looks like feedback")


def test_a_failure_s_kind_comes_from_the_rank_not_from_its_type_name() -> None:
    """The grader shows a harness verdict as it is, and anything else with its traceback: a
    submission's own exception named like the harness's must not pass for a verdict."""
    from distlab.protocol import FailureKind

    with pytest.raises(distlab.RankError) as info:
        distlab.run(_raise_feedback_or_an_imitation, world_size=2)
    failures = sorted(info.value.failures, key=lambda f: f.rank)
    assert [(f.exc_type, f.kind) for f in failures] == [
        ("SubmissionFailed", FailureKind.FEEDBACK), ("SubmissionFailed", FailureKind.RAISED)]


def test_a_hang_raises_rank_timeout_with_stacks_and_leaves_no_process() -> None:
    def both_receive_first() -> None:
        import torch
        import torch.distributed as dist

        buffer = torch.zeros(1)
        dist.recv(buffer, src=1 - dist.get_rank())  # each waits for the other: deadlock

    with pytest.raises(distlab.RankTimeout) as info:
        distlab.run(both_receive_first, world_size=2, timeout=2)
    assert set(info.value.stacks) == {0, 1}
    assert all("recv" in stack for stack in info.value.stacks.values())
    assert "ranks 0-1" in info.value.report


def test_a_stopped_rank_is_reported_as_stopped_and_replaced() -> None:
    """SIGSTOP (a stray Ctrl-Z, a debugger): the rank cannot dump its stack, so the report says
    what the operating system says of it, and the next cell runs on fresh ranks."""
    import os
    import signal

    from distlab.pool import Pool
    from distlab.sink import PrintSink

    class Quiet(PrintSink):
        def _write(self, rank: int, lines: list[str]) -> None:
            pass

    pool = Pool(2, "gloo", sink=Quiet())
    try:
        pool.run_cell("x = 1", "<warm>")
        stopped = pool.status()[1]["pid"]
        os.kill(stopped, signal.SIGSTOP)
        with pytest.raises(distlab.RankTimeout) as info:
            pool.run_cell("t = torch.ones(1)\ndist.all_reduce(t)", "<cell>", timeout=3)
        assert "the rank process is stopped (SIGSTOP" in info.value.report, info.value.report
        assert "dist.all_reduce(t)" in info.value.report  # the other rank waits in the collective
        assert wait_gone([stopped]) == []
        done = pool.run_cell("t = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())", "<next>")
        assert sorted(done) == [0, 1]
    finally:
        pool.stop()


def test_run_leaves_no_rank_behind() -> None:
    hub = Hub.get()
    before = set(children(hub.launcher.pid))
    distlab.run(_all_reduce_rank_plus_one, world_size=2)
    assert wait_gone(set(children(hub.launcher.pid)) - before) == []


@pytest.mark.parametrize("source, status, error", [
    ("x = rank", "finished", None),
    ("if rank == 1:\n    raise ValueError('no')", "failed", "RankError"),
    ("import os\nif rank == 1:\n    os._exit(3)", "lost", "RankError"),
    ("t = torch.zeros(1)\nif rank == 1:\n    raise ValueError('no')\ndist.all_reduce(t)", "hung", "RankTimeout"),
    ("t = torch.zeros(1)\ndist.recv(t, src=1 - rank)", "timed_out", "RankTimeout"),
])
def test_every_wait_ends_in_one_outcome_value(source: str, status: str, error: str | None) -> None:
    """The pool's wait returns what became of the task; the magic raises the error it renders to."""
    from distlab import protocol
    from distlab.pool import Pool

    pool = Pool(2, "gloo", eager_restart=False)
    try:
        outcome = pool.submit(lambda t: protocol.RunCell(t, source, "<cell>", False), None, timeout=3,
                              cell_lines={"<cell>": source.splitlines()})
        assert outcome.status == status
        assert type(outcome.error()).__name__ == str(error) if error else outcome.error() is None
        if status in ("hung", "timed_out"):
            assert sorted(outcome.stacks) == ([0] if status == "hung" else [0, 1])
            assert "Rank state was lost" in outcome.note  # and the pool was restarted
        if status == "lost":
            assert outcome.failures[0].rank == 1 and outcome.failures[0].exitcode == 3
            assert outcome.failures[0].kind is protocol.FailureKind.CRASHED
        if status == "finished":
            assert sorted(outcome.dones) == [0, 1]
        if status == "failed":
            assert [(f.rank, f.exc_type, f.kind) for f in outcome.failures] == [
                (1, "ValueError", protocol.FailureKind.RAISED)]
    finally:
        pool.stop()


def _environment_seen() -> tuple[str | None, str]:
    import os

    return os.environ.get("FOLLOW_RUN_SETTING"), os.getcwd()


def test_ranks_follow_the_callers_folder_and_environment_but_grading_ranks_do_not(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A grade must not depend on the folder or variables the notebook's kernel was left with."""
    from distlab.pool import Pool, values_of

    Hub.get()  # the launcher (and every rank) starts before the caller changes anything
    monkeypatch.setenv("FOLLOW_RUN_SETTING", "the caller's")
    monkeypatch.chdir(tmp_path)
    assert distlab.run(_environment_seen, world_size=2) == [("the caller's", str(tmp_path))] * 2
    grading = Pool(2, "gloo", confine_writes=True)
    try:
        seen = values_of(grading.call(_environment_seen))
    finally:
        grading.stop()
    assert all(value is None and folder != str(tmp_path) for value, folder in seen), seen
