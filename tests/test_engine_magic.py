"""The %%dist magic in a real Jupyter kernel: what a learner sees when things go right."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_session import KernelSession
from procs import children, cmdline, listening_addresses, parent, wait_gone

PIDS = "[h.pid for _, h in sorted(__import__('distlab.magic').magic.session().pool.handles.items())]"


@pytest.fixture(scope="module")
def kernel() -> Iterator[KernelSession]:
    session = KernelSession()
    reply = session.execute("%load_ext distlab")
    assert reply.error is None and reply.stderr == ""
    yield session
    session.shutdown()


def test_first_cell_runs_on_four_labelled_ranks(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist -n 4\nt = torch.tensor([rank + 1.0])\ndist.all_reduce(t)\nprint(t.item())")
    assert reply.error is None, reply.traceback
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] 10.0" for r in range(4)]
    assert reply.stderr == ""


def test_rank_names_exist_and_variables_persist(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nmine = (rank, world_size, local_rank, str(device), dist.is_initialized())")
    assert reply.error is None, reply.traceback
    reply = kernel.execute("%%dist\nprint(mine)")
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] ({r}, 4, {r}, 'cpu', True)" for r in range(4)]


def test_last_expression_is_shown_per_rank(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nrank * 100")
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] {r * 100}" for r in range(4)]
    reply = kernel.execute("%%dist\nshown = rank * 100  # a comment\nshown  # ends in a comment")
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] {r * 100}" for r in range(4)]
    reply = kernel.execute("%%dist\nrank * 100;  # a semicolon hides it, as in a notebook")
    assert reply.error is None and reply.stdout == "", reply.traceback
    # a line the cell left open ends before the value, which Jupyter shows apart from the stream
    reply = kernel.execute("%%dist\nimport sys\nsys.stdout.write('no newline')")
    assert sorted(reply.stdout.splitlines()) == sorted([f"[rank {r}] no newline" for r in range(4)]
                                                       + [f"[rank {r}] 10" for r in range(4)]), reply.stdout


def test_pull_and_push(kernel: KernelSession) -> None:
    kernel.execute("%%dist\nsquare = rank ** 2")
    assert kernel.value("%dist_pull square") == [0, 1, 4, 9]
    assert kernel.value("%dist_pull square --ranks 1,3") == [1, 9]
    kernel.execute("offset = 7")
    reply = kernel.execute("%dist_push offset")
    assert reply.error is None, reply.traceback
    reply = kernel.execute("%%dist\nprint(offset + rank)")
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] {7 + r}" for r in range(4)]


def test_pull_brings_instances_of_classes_defined_in_a_cell(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nfrom dataclasses import dataclass\n@dataclass\nclass Stats:\n    rank: int\n"
                           "    def double(self):\n        return 2 * self.rank\nstats = Stats(rank)")
    assert reply.error is None, reply.traceback
    reply = kernel.execute("pulled = %dist_pull stats\nprint([(type(s).__name__, s.double()) for s in pulled])")
    assert reply.error is None, reply.traceback
    assert reply.stdout.strip() == str([("Stats", 2 * r) for r in range(4)])


def test_a_value_the_kernel_cannot_rebuild_is_a_clear_error_and_the_pool_goes_on(
        kernel: KernelSession, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "only_on_ranks.py").write_text("class Box:\n    pass\n")
    reply = kernel.execute(f"%%dist\nimport sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
                           "import only_on_ranks\nbox = only_on_ranks.Box()\nsys.path.pop(0)")
    assert reply.error is None, reply.traceback
    reply = kernel.execute("%dist_pull box")
    assert reply.error is not None and reply.error["ename"] == "TransferFailed"
    assert "rank 0's value cannot be rebuilt in the kernel (ModuleNotFoundError" in reply.traceback
    assert "distlab/pool.py" not in reply.traceback  # the learner's news, not the kit's internals
    assert reply.stderr == ""
    assert kernel.value("%dist_pull rank") == [0, 1, 2, 3]


def test_values_that_do_not_pickle_fail_clearly_both_ways(kernel: KernelSession) -> None:
    reply = kernel.execute("g = (i for i in range(3))\n%dist_push g")
    assert reply.error is not None and reply.error["ename"] == "TransferFailed"
    assert "the value of 'g' cannot be sent to the ranks (TypeError: cannot pickle 'generator' object)" in reply.traceback
    assert "cloudpickle" not in reply.traceback
    kernel.execute("%%dist\nimport threading\nlock = threading.Lock()")
    reply = kernel.execute("%dist_pull lock")
    assert reply.error is not None and reply.error["ename"] == "RankError"
    assert "--- ranks 0-3 ---" in reply.traceback
    assert "TransferFailed: the value of 'lock' cannot be sent to the kernel (TypeError: cannot pickle" in reply.traceback
    assert "cloudpickle" not in reply.traceback and reply.stderr == ""
    assert kernel.value("%dist_pull rank") == [0, 1, 2, 3]


def test_an_exception_whose_str_fails_is_reported_and_the_rank_lives_on(kernel: KernelSession) -> None:
    pids = kernel.value(PIDS)
    reply = kernel.execute("%%dist\nclass Odd(Exception):\n    def __str__(self):\n        raise ValueError\n"
                           "if rank == 0:\n    raise Odd()")
    assert reply.error is not None and "rank 0: Odd: <exception str() failed>" in reply.traceback
    assert "at cell line 5: raise Odd()" in reply.traceback
    assert kernel.value(PIDS) == pids  # not a crash: no restart, the ranks keep their variables


TORCHRUN_SCRIPT = """import os
import torch
import torch.distributed as dist

def main():
    dist.init_process_group(backend="gloo"{extra})
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    print(f"rank {{rank}}/{{world}} local {{os.environ['LOCAL_RANK']}}: {{t.item()}}")
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_a_script_written_for_torchrun_runs_as_a_cell_twice(kernel: KernelSession) -> None:
    for _ in range(2):  # it destroys the group at the end: the next run joins a fresh one
        reply = kernel.execute("%%dist -n 4\n" + TORCHRUN_SCRIPT.format(extra=""))
        assert reply.error is None, reply.traceback
        assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] rank {r}/4 local {r}: 6.0" for r in range(4)]
        assert reply.stderr == ""
    # the rest of what torchrun gives its workers, read by code that checks where it runs (Lightning)
    reply = kernel.execute("%%dist -n 4\nimport os\nprint(dist.is_torchelastic_launched(), *(os.environ[name] for name "
                           "in ('GROUP_RANK', 'ROLE_RANK', 'ROLE_WORLD_SIZE', 'TORCHELASTIC_RESTART_COUNT')))")
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] True 0 {r} 4 0" for r in range(4)], reply.traceback


SPAWN_SCRIPT = """
import os, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def demo_basic(rank, world_size, scale):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = DDP(torch.nn.Linear(3, 1))
    model(torch.ones(2, 3) * (rank + 1)).sum().backward()
    print(f"rank {{rank}} of {{dist.get_world_size()}} grad {{model.module.weight.grad.sum().item() * scale:.1f}}")
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(demo_basic, args=({n}, 10), nprocs={n}, join=True)
"""


def test_a_script_written_for_mp_spawn_runs_its_function_on_the_ranks(kernel: KernelSession) -> None:
    """PyTorch's DDP tutorial: mp.spawn of a function defined in the cell. A spawned child could
    not import it; the ranks run it themselves, and DDP averages the gradients across them."""
    reply = kernel.execute("%%dist -n 2\n" + SPAWN_SCRIPT.format(n=2))
    assert reply.error is None and reply.stderr == "", reply.traceback
    lines = sorted(line for line in reply.stdout.splitlines() if "grad" in line)
    assert lines == ["[rank 0] rank 0 of 2 grad 90.0", "[rank 1] rank 1 of 2 grad 90.0"], reply.stdout
    assert "mp.spawn runs demo_basic(rank, ...) on this cell's 2 ranks" in reply.stdout
    reply = kernel.execute("%%dist -n 2\n" + SPAWN_SCRIPT.format(n=4))
    assert reply.error is not None and "%%dist -n 4" in reply.traceback and "could not import" in reply.traceback


def test_mp_start_processes_runs_a_cells_function_on_the_ranks_too(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist -n 2\nimport torch.multiprocessing as mp\ndef work(r, n):\n"
                           "    t = torch.ones(1) * r\n    dist.all_reduce(t)\n    print('work', r, n, t.item())\n"
                           "mp.start_processes(work, args=(2,), nprocs=2, start_method='spawn')")
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert sorted(line for line in reply.stdout.splitlines() if "work " in line) == [
        "[rank 0] work 0 2 1.0", "[rank 1] work 1 2 1.0"]
    assert "mp.start_processes runs work(rank, ...) on this cell's 2 ranks" in reply.stdout


PROCESS_SCRIPT = """import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def run(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)
    else:
        dist.recv(tensor=tensor, src=0)
    print('Rank ', rank, ' has data ', tensor[0].item())

def init_process(rank, size, fn, backend='gloo'):
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = '29500'
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)

if __name__ == "__main__":
    world_size = {n}
    processes = []
    mp.set_start_method("spawn")
    for rank in range(world_size):
        p = mp.Process(target=init_process, args=(rank, world_size, run))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
        assert p.exitcode == 0
"""


def test_the_tutorial_that_starts_its_ranks_with_mp_process_runs_on_the_ranks(kernel: KernelSession) -> None:
    """"Writing Distributed Applications with PyTorch", as published: it sets the spawn start
    method and starts one mp.Process per rank. Each rank runs its own share, twice in a row, and
    hears that the loop left ``rank`` at 1 on rank 0."""
    replies = [kernel.execute("%%dist -n 2\n" + PROCESS_SCRIPT.format(n=2)) for _ in range(2)]
    for reply in replies:
        assert reply.error is None and reply.stderr == "", reply.traceback
        lines = reply.stdout.splitlines()
        assert "[rank 0] Rank  0  has data  1.0" in lines and "[rank 1] Rank  1  has data  1.0" in lines, lines
        assert "mp.Process runs init_process(rank, ...) on this cell's 2 ranks" in reply.stdout
    assert "[rank 0] distlab: this cell set rank = 1 on rank 0" in replies[0].stdout
    assert "[rank 1] distlab: this cell set" not in replies[0].stdout  # there rank is still 1
    reply = kernel.execute("%%dist -n 2\nrank = dist.get_rank()\nprint('fixed', rank)")
    assert sorted(reply.stdout.splitlines()) == ["[rank 0] fixed 0", "[rank 1] fixed 1"], reply.stdout
    reply = kernel.execute("%%dist -n 2\n" + PROCESS_SCRIPT.format(n=4))
    assert reply.error is not None and "%%dist -n 4" in reply.traceback, reply.traceback
    reply = kernel.execute("%%dist -n 2\nimport multiprocessing as mp\ndef work(q):\n    print('child of', q)\n"
                           "p = mp.get_context('spawn').Process(target=work, args=(f'rank {dist.get_rank()}',))\n"
                           "p.start()\np.join()\nprint('exit', p.exitcode)")  # not one per rank: a real child
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert sorted(reply.stdout.splitlines()) == ["[rank 0] child of rank 0", "[rank 0] exit 0",
                                                 "[rank 1] child of rank 1", "[rank 1] exit 0"]
    reply = kernel.execute("%%dist -n 2\nimport multiprocessing as mp\nmp.set_start_method('fork')")
    assert reply.error is not None and "context has already been set" in reply.traceback  # a change still fails


def test_processes_a_cell_spawns_get_its_functions_and_classes(kernel: KernelSession) -> None:
    """A spawned child is a new Python that cannot import a cell: a spawn Pool hung, a DataLoader
    whose workers spawn (macOS's default) died with "Can't get attribute". They get them by value. (The spawn Pool sets
    the rank's default start method, as it would in a script: so this runs after the tutorial.)"""
    reply = kernel.execute(
        "%%dist -n 2\nimport multiprocessing\nfrom torch.utils.data import Dataset, DataLoader\nme = dist.get_rank()\n"
        "class Box:\n    def __init__(self, v):\n        self.v = v\n"
        "def boxed(x):\n    return Box(x + me)\n"
        "class Squares(Dataset):\n    def __len__(self):\n        return 4\n"
        "    def __getitem__(self, i):\n        return torch.tensor([i * i + me])\n"
        "with multiprocessing.get_context('spawn').Pool(1) as pool:\n    out = pool.map(boxed, [10])\n"
        "print([b.v for b in out], isinstance(out[0], Box))\n"
        "loader = DataLoader(Squares(), batch_size=2, num_workers=1, multiprocessing_context='spawn')\n"
        "print([batch.view(-1).tolist() for batch in loader])", timeout=180)
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert sorted(reply.stdout.splitlines()) == [
        "[rank 0] [10] True", "[rank 0] [[0, 1], [4, 9]]", "[rank 1] [11] True", "[rank 1] [[1, 2], [5, 10]]"]
    # with no spawned child about, a function goes by name as before: not with the 4 MB it reads
    reply = kernel.execute("%%dist -n 2\nfrom multiprocessing.reduction import ForkingPickler\n"
                           "big = torch.zeros(1 << 20)\ndef reads_big(i):\n    return big[i]\n"
                           "print(len(ForkingPickler.dumps(reads_big)) < 1000, len(ForkingPickler.dumps(lambda: big)) > 1e6)")
    assert sorted(reply.stdout.splitlines()) == ["[rank 0] True True", "[rank 1] True True"], reply.traceback


def test_a_start_method_python_fixed_on_first_use_gives_way_to_the_one_a_cell_sets(kernel: KernelSession) -> None:
    """A Queue, a Pool or a DataLoader in one cell fixes the default start method for good; a
    script in a later cell that sets its own must still run, as it would in a fresh process."""
    reply = kernel.execute("%%dist -n 3\nimport multiprocessing as mp\nq = mp.Queue()\nbefore = mp.get_start_method()\n"
                           "mp.set_start_method('spawn')\nmp.set_start_method('spawn')\n"
                           "print(before, mp.get_start_method())")
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert sorted(line for line in reply.stdout.splitlines() if line.startswith("[rank")) == [
        f"[rank {r}] fork spawn" for r in range(3)]
    reply = kernel.execute("%%dist -n 3\nmp.set_start_method('fork')")  # a cell's own choice stands
    assert reply.error is not None and "context has already been set" in reply.traceback


@pytest.mark.parametrize("destroyed_on", ["", " --ranks 0,2"])
def test_after_a_cell_destroys_the_group_any_ranks_run_on_a_fresh_one(kernel: KernelSession, destroyed_on: str) -> None:
    kernel.execute("%%dist -n 4\nkept = rank * 10")
    reply = kernel.execute(f"%%dist{destroyed_on}\ndist.destroy_process_group()")
    assert reply.error is None, reply.traceback
    reply = kernel.execute("%%dist --ranks 1 --timeout 20\nprint(dist.get_world_size())")
    assert reply.error is None, reply.traceback
    assert reply.stdout.splitlines() == ["[rank 1] 4"]
    reply = kernel.execute("%%dist --timeout 20\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(int(t.item()), kept)")
    assert reply.error is None, reply.traceback
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] 4 {r * 10}" for r in range(4)]  # no restart


def test_code_that_makes_its_own_rendezvous_runs_on_loopback(kernel: KernelSession) -> None:
    """rpc.init_rpc and init_process_group() after a destroy make their own env:// rendezvous:
    they get a fresh corner of the ranks' own store, and nothing listens beyond loopback."""
    reply = kernel.execute(
        "%%dist -n 2 --timeout 60\nimport os, warnings\nwarnings.simplefilter('ignore')\n"
        "import torch.distributed.rpc as rpc\nrpc.init_rpc(f'worker{rank}', rank=rank, world_size=world_size)\n"
        "me = os.getpid()")
    assert reply.error is None, reply.traceback
    for pid in kernel.value("%dist_pull me"):
        addresses = listening_addresses(pid)
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
    reply = kernel.execute(
        "%%dist --timeout 60\nif rank == 0:\n    print(rpc.rpc_sync('worker1', torch.add, args=(torch.ones(2), 3)).tolist())\n"
        "rpc.shutdown()\n"
        "for _ in range(2):\n    dist.destroy_process_group()\n    dist.init_process_group('gloo')\n"
        "    t = torch.ones(1)\n    dist.all_reduce(t)\n    print(int(t.item()))")
    assert reply.error is None, reply.traceback
    assert sorted(reply.stdout.splitlines()) == ["[rank 0] 2", "[rank 0] 2", "[rank 0] [4.0, 4.0]", "[rank 1] 2", "[rank 1] 2"]
    reply = kernel.execute("%%dist --ranks 1\nprint(dist.get_world_size())")
    assert reply.stdout.splitlines() == ["[rank 1] 2"]


def test_a_script_asking_for_another_world_size_is_told_why_it_runs_on_the_pool(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist -n 4\n" + TORCHRUN_SCRIPT.format(extra=", world_size=2"))
    assert reply.error is None, reply.traceback
    notes = [line for line in reply.stdout.splitlines() if "init_process_group call was skipped" in line]
    assert notes == ["[rank 0] distlab: the ranks already form a process group (4 ranks, gloo), so this "
                     "init_process_group call was skipped and its world_size=2 does not apply. Run the cell "
                     "with %%dist -n N --backend B to change them."]


def test_ranks_option_runs_only_the_listed_ranks(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist --ranks 0,2\nprint('here')")
    assert sorted(reply.stdout.splitlines()) == ["[rank 0] here", "[rank 2] here"]


def test_a_collective_on_some_ranks_says_the_others_do_not_run_the_cell(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist --ranks 0 --timeout 2\nt = torch.ones(1)\ndist.all_reduce(t)")
    assert reply.error is not None and reply.error["ename"] == "RankTimeout" and reply.stderr == ""
    assert "Only rank 0 ran this cell (--ranks)" in reply.traceback and "ranks 1-3" in reply.traceback
    assert "dist.new_group" in reply.traceback
    reply = kernel.execute("%%dist --ranks 0 --timeout 2\nimport time\ntime.sleep(5)")  # no collective: no hint
    assert reply.error is not None and "--ranks)" not in reply.traceback
    reply = kernel.execute("%%dist\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())")
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] 4.0" for r in range(4)], reply.traceback


@pytest.mark.parametrize("line", ["-n 0", "-n abc", "--backend foo", "--ranks 9", "--ranks x", "--timeout -1",
                                  "--timeout nan", "--bogus"])
def test_bad_options_give_one_usage_line_and_leave_the_pool_alone(kernel: KernelSession, line: str) -> None:
    kernel.execute("%%dist\nkeep = 'still here'")
    before = kernel.value(PIDS)
    reply = kernel.execute(f"%%dist {line}\nprint('must not run')")
    assert reply.error is not None and reply.error["ename"] == "UsageError"
    assert "must not run" not in reply.stdout
    assert len(reply.error["evalue"].strip().splitlines()) == 1
    assert len(reply.stderr.strip().splitlines()) == 1  # IPython prints a UsageError as one line
    assert kernel.value(PIDS) == before
    assert kernel.value("%dist_pull keep") == ["still here"] * 4


@pytest.mark.parametrize("line", ["--launcher slurm --iface nosuch0", "--launcher external --iface 10.255.0.0/16",
                                  "--launcher slurm --iface 10.0.0.0/99"])
def test_a_wrong_network_for_the_cluster_is_one_usage_line_and_the_pool_keeps_running(
        kernel: KernelSession, line: str) -> None:
    """A mistyped --iface used to be remembered: every later cell failed with it until the learner
    chose another launcher. It is checked before anything changes."""
    kernel.execute("%%dist\nkeep = 'still here'")
    before = kernel.value(PIDS)
    reply = kernel.execute(f"%dist_start {line}")
    assert reply.error is not None and reply.error["ename"] == "UsageError", reply.traceback
    assert "--iface" in reply.error["evalue"] and len(reply.stderr.strip().splitlines()) == 1, reply.stderr
    assert kernel.value(PIDS) == before
    assert kernel.value("%dist_pull keep") == ["still here"] * 4


def test_a_new_world_size_restarts_the_pool_and_says_so(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist -n 2\nprint(world_size)")
    assert "restarting the pool with 2 ranks (gloo); it had 4 (gloo)" in reply.stdout
    assert sorted(line for line in reply.stdout.splitlines() if line.startswith("[rank")) == [
        "[rank 0] 2", "[rank 1] 2"]
    reply = kernel.execute("%%dist -n 4\nprint(world_size)")
    assert "restarting the pool with 4 ranks" in reply.stdout


def test_status_lists_every_rank(kernel: KernelSession) -> None:
    kernel.execute("%%dist -n 4\npass")
    reply = kernel.execute("%dist_status")
    assert "4 ranks, backend gloo" in reply.stdout
    for pid in kernel.value(PIDS):
        assert f"pid {pid}, idle" in reply.stdout


def test_an_exception_fails_the_cell_with_rank_and_line(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist -n 4\nx = 1\nif rank > 0:\n    y = x / 0\n")
    assert reply.error is not None and reply.error["ename"] == "RankError"
    text = reply.traceback
    assert "3 of 4 ranks failed" in text
    assert "--- ranks 1-3 ---" in text and text.count("ZeroDivisionError: division by zero") == 2  # title + once
    assert "at cell line 3: y = x / 0" in text
    assert "distlab/worker.py" not in text and "distlab/pool.py" not in text
    reply = kernel.execute("%%dist\nprint('next')")
    assert reply.error is None and reply.stdout.count("next") == 4


IPYTHON_CELL = """%%dist
%matplotlib inline
t = torch.ones(1000)
%timeit dist.all_reduce(t)
if rank == 0:
    %timeit -n 5 -r 2 sum(range(100))
def doubled(x):
    y = 2 * x
    result = %time y + 0
    return result
value = doubled(rank)
listed = !echo rank {rank} of $world_size
!echo shell says {rank}
"""


def test_ipython_lines_in_a_cell_run_on_every_rank_as_in_a_notebook(kernel: KernelSession) -> None:
    """%timeit, %time, %matplotlib and !commands, pasted from a one-process notebook, do on each
    rank what they do in a notebook; %timeit of a collective picks one loop count for all ranks."""
    reply = kernel.execute(IPYTHON_CELL)
    assert reply.error is None, reply.traceback
    assert reply.stderr == ""
    timed = re.findall(r"\[rank (\d)\] .* per loop \(mean ± std\. dev\. of (\d) runs, ([\d,]+) loops? each\)",
                       reply.stdout)
    collective = [t for t in timed if t[1] == "7"]
    assert sorted(r for r, _, _ in collective) == ["0", "1", "2", "3"], reply.stdout
    assert len({loops for _, _, loops in collective}) == 1, f"ranks chose different loop counts: {collective}"
    assert [t for t in timed if t[1] == "2"] == [("0", "2", "5")], reply.stdout
    assert reply.stdout.count("Wall time: ") == 4 and reply.stdout.count("CPU times: user ") == 4
    assert kernel.value("%dist_pull value") == [0, 2, 4, 6]
    assert kernel.value("%dist_pull listed") == [[f"rank {r} of 4"] for r in range(4)]
    assert "[rank 2] shell says 2" in reply.stdout
    reply = kernel.execute("%%dist\nprint('next', rank)")
    assert reply.error is None and reply.stdout.count("next") == 4


def test_timeit_of_ranks_that_time_a_collective_differently_still_agrees_on_the_loops(
        kernel: KernelSession) -> None:
    """Rank 0 takes 0.25 s a loop, the others 1 ms: each alone would choose 1 and 1,000 loops,
    call the collective a different number of times and hang. They agree on the slowest's."""
    reply = kernel.execute("%%dist --timeout 20\nimport time\nt = torch.ones(4)\n"
                           "%timeit -r 2 dist.all_reduce(t, async_op=True); time.sleep(0.25 if rank == 0 else 0.001)\n"
                           "dist.barrier()\nprint('agreed', rank)")
    assert reply.error is None, reply.traceback
    assert reply.stdout.count("(mean ± std. dev. of 2 runs, 1 loop each)") == 4, reply.stdout
    assert reply.stdout.count("agreed") == 4


TRAIN_PY = """import argparse, sys
import torch, torch.distributed as dist
from helper import SCALE  # a module beside the script, as `torchrun train.py` finds it

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    t = torch.ones(1) * args.scale * SCALE
    dist.all_reduce(t)
    print("total", dist.get_rank(), t.item(), sys.argv[1:])
    dist.destroy_process_group()
    return t.item()

if __name__ == "__main__":
    result = main()
    sys.exit(0)
"""

SPAWN_PY = """import torch, torch.distributed as dist, torch.multiprocessing as mp

def work(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.tensor([rank])
    dist.all_reduce(t)
    print("spawned", rank, t.item())

if __name__ == "__main__":
    mp.spawn(work, args=(4,), nprocs=4)
"""


def test_run_starts_a_script_on_every_rank_as_torchrun_would(kernel: KernelSession, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN_PY)
    (tmp_path / "helper.py").write_text("SCALE = 2\n")
    (tmp_path / "spawn.py").write_text(SPAWN_PY)
    assert kernel.execute("%%dist\nimport sys\nargv_before = list(sys.argv)").error is None
    reply = kernel.execute(f"%%dist\n%run {tmp_path / 'train.py'} --scale 3")
    assert reply.error is None, reply.traceback
    for rank in range(4):
        assert f"[rank {rank}] total {rank} 24.0 ['--scale', '3']" in reply.stdout, reply.stdout
    assert kernel.value("%dist_pull result") == [24.0] * 4  # the script's names are the cell's
    reply = kernel.execute(f"%%dist\n%run {tmp_path / 'spawn.py'}")
    assert reply.error is None, reply.traceback
    assert "[rank 3] spawned 3 6" in reply.stdout, reply.stdout
    reply = kernel.execute(f"%%dist\n%run {tmp_path / 'absent.py'}")
    assert reply.error is not None and "No such file or directory" in reply.traceback
    assert kernel.execute("%%dist\nargv_after = list(sys.argv)").error is None
    assert kernel.value("%dist_pull argv_after") == kernel.value("%dist_pull argv_before")  # the rank's own again


def test_env_cd_and_pwd_lines_act_on_each_ranks_own_environment_and_folder(kernel: KernelSession,
                                                                           tmp_path: Path) -> None:
    """Pasted notebook code sets a variable with ``%env`` or moves with ``%cd``: on a rank they act
    as IPython's would, on that rank, with ``{rank}`` filled in; the kernel's next change wins."""
    for rank in range(4):
        (tmp_path / f"r{rank}").mkdir()
    before = kernel.execute("%%dist\nimport os\nfolder_before = os.getcwd()")
    assert before.error is None, before.traceback
    reply = kernel.execute(f"%%dist\n%env DEMO_SEED={{rank * 10}}\n%cd -q {tmp_path}/r{{rank}}\n"
                           "here = %pwd\nseed = %env DEMO_SEED\n"
                           "print(os.path.basename(here), seed, os.environ['DEMO_SEED'])")
    assert reply.error is None and reply.stderr == "", reply.traceback
    for rank in range(4):
        assert f"[rank {rank}] env: DEMO_SEED={rank * 10}\n" in reply.stdout, reply.stdout
        assert f"[rank {rank}] r{rank} {rank * 10} {rank * 10}\n" in reply.stdout, reply.stdout
    reply = kernel.execute("%%dist\n%env NOT_SET_ANYWHERE")
    assert reply.error is not None and "Environment does not have key: NOT_SET_ANYWHERE" in reply.traceback
    back = kernel.execute("%%dist\n%cd -\nos.environ.pop('DEMO_SEED')\nfolder_after = os.getcwd()")
    assert back.error is None, back.traceback
    assert kernel.value("%dist_pull folder_after") == kernel.value("%dist_pull folder_before")
    assert f"[rank 2] {kernel.value('%dist_pull folder_before')[2]}\n" in back.stdout, back.stdout


def test_a_cell_timed_whole_with_time_keeps_its_line_numbers(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\n%%time\nx = sum(range(10))\nx + rank")
    assert reply.error is None, reply.traceback
    assert reply.stdout.count("Wall time: ") == 4
    assert kernel.value("%dist_pull x") == [45] * 4
    reply = kernel.execute("%%dist\n%%time\ny = 1\nz = y / 0")
    assert reply.error is not None and "at cell line 3: z = y / 0" in reply.traceback, reply.traceback


@pytest.mark.parametrize(("line", "said"), [
    ("%who", "%who runs in the kernel, not on the ranks: put it in a cell of its own. On the ranks a cell may use "
             "%time, %timeit, %run, %env, %cd, %pwd, %matplotlib and !commands."),
    ("dist.all_reduce?", "dist.all_reduce? runs in the kernel, not on the ranks"),
    ("%pip install nothing-here", "%pip install nothing-here runs in the kernel, not on the ranks: put it in a "
                                  "cell of its own. The ranks use the kernel's Python"),
    ("%timeit -x 1", "%timeit on the ranks takes -n, -r, -p, -q and -o, not -x"),
])
def test_what_only_the_kernel_can_do_fails_saying_so(kernel: KernelSession, line: str, said: str) -> None:
    reply = kernel.execute(f"%%dist\nx = 1\n{line}")
    assert reply.error is not None and f"at cell line 2: {line}" in reply.traceback, reply.traceback
    assert "4 of 4 ranks failed (rank 0: UsageError: " in reply.traceback and said in reply.traceback
    reply = kernel.execute("%%dist\nx = (1,\n")  # a cell that is neither Python nor IPython: Python's error
    assert reply.error is not None and "SyntaxError" in reply.traceback and "UsageError" not in reply.traceback


def test_a_syntax_error_below_an_ipython_line_is_shown_where_it_is(kernel: KernelSession) -> None:
    """A magic inside an expression is not IPython either: the error names that line, not the
    ``%env`` line above it (which alone made the cell not Python)."""
    reply = kernel.execute("%%dist\n%env SOME_SETTING=1\nx = 1\nprint(x, %pwd)")
    assert reply.error is not None and "SyntaxError" in reply.traceback, reply.traceback
    assert "at cell line 3: print(x, %pwd)" in reply.traceback and "at cell line 1" not in reply.traceback
    reply = kernel.execute("%%dist\n\n%time x = 1\ny = x / 0")  # IPython drops leading blank lines: they count
    assert reply.error is not None and "at cell line 3: y = x / 0" in reply.traceback, reply.traceback
    reply = kernel.execute("%%dist\n%%time\nx = (1,\n")  # IPython's rewrite changes the line count: Python's error
    assert reply.error is not None and "SyntaxError" in reply.traceback, reply.traceback


def test_display_of_a_figure_shows_an_image(kernel: KernelSession) -> None:
    reply = kernel.execute(
        "%%dist --ranks 0\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, 1])\n"
        "display(fig)\nplt.close(fig)")
    assert reply.error is None, reply.traceback
    assert any("image/png" in out["data"] for out in reply.outputs)
    assert reply.stderr == ""


RICH_CELL = """%%dist
from IPython.display import display, HTML
import numpy as np
display(HTML(f"<b>html of {rank}</b>"))
handle = display(HTML("first"), display_id=True)
handle.update(HTML(f"<i>updated on {rank}</i>"))
class Table:
    def _repr_html_(self):
        return np.str_(f"<table><td>{rank}</td></table>")  # a numpy string, as libraries return
    def _repr_json_(self):
        return {"rank": np.int64(rank), "scale": np.float32(0.5)}
Table()
"""


def test_ipython_display_and_rich_values_show_as_in_a_notebook(kernel: KernelSession) -> None:
    """``IPython.display.display`` printed ``<IPython.core.display.HTML object>`` on a rank, and a
    representation holding numpy values broke the cell with distlab's own traceback."""
    reply = kernel.execute(RICH_CELL)
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert "IPython.core.display.HTML object" not in reply.stdout
    html = [str(out["data"].get("text/html")) for out in reply.outputs]
    for r in range(4):
        assert f"<b>html of {r}</b>" in html and f"<i>updated on {r}</i>" in html, html
        assert f"<i>updated on {r}</i>" in [str(out["data"].get("text/html")) for out in reply.shown()]
        assert f"<table><td>{r}</td></table>" in html, html
        assert {"rank": r, "scale": 0.5} in [out["data"].get("application/json") for out in reply.outputs]
    reply = kernel.execute("%%dist\ntorch.arange(3) * rank")  # text alone stays a labelled line
    assert all(f"[rank {r}] tensor([0, {r}, {2 * r}])" in reply.stdout for r in range(4)), reply.stdout


LIVE_CELL = """%%dist
from IPython.display import display, clear_output, update_display, HTML
display(HTML(f"<p>gone {rank}</p>"))
clear_output()  # clears what this rank displayed in this cell
for step in range(5):
    clear_output(wait=True)
    display(HTML(f"<p>step {step} on {rank}</p>"))
display(HTML("<p>loss ?</p>"), display_id="loss")  # every rank has its own "loss"
update_display(HTML(f"<p>loss {rank}.5</p>"), display_id="loss")
print("done", rank)
"""


def test_display_updates_and_clear_output_act_in_place_per_rank(kernel: KernelSession) -> None:
    """A live picture in a training loop (``clear_output(wait=True); display(...)``) added one
    output per step on each rank and wrote escape codes; ``update_display`` added one more."""
    reply = kernel.execute(LIVE_CELL)
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert "\x1b" not in reply.stdout, repr(reply.stdout)
    shown = [str(out["data"].get("text/html", "")) for out in reply.shown()]
    for r in range(4):
        assert [text for text in shown if text.endswith(f" on {r}</p>")] == [f"<p>step 4 on {r}</p>"], shown
        assert f"<p>loss {r}.5</p>" in shown and f"<p>gone {r}</p>" not in shown, shown
        labels = [out["data"].get("text/plain") for out in reply.shown()]
        assert labels.count(f"[rank {r}] display:") == 2, labels  # the step and the loss; gone's went with it
        assert f"[rank {r}] done {r}" in reply.stdout
    assert "<p>loss ?</p>" not in shown, shown
    reply = kernel.execute('%%dist\ndisplay(HTML(f"<p>old {rank}</p>"))\nclear_output(wait=True)\n'
                           'display(HTML(f"<p>new {rank}</p>"), display_id="mine")')  # an id of one's own
    shown = [str(out["data"].get("text/html", "")) for out in reply.shown()]
    assert all(f"<p>new {r}</p>" in shown and f"<p>old {r}</p>" not in shown for r in range(4)), shown


def test_a_message_the_kernel_refuses_is_named_and_the_cell_goes_on(kernel: KernelSession) -> None:
    reply = kernel.execute(
        "%%dist\nimport numpy as np\nfrom distlab.protocol import Display\n"
        "from distlab import rank_display\n"  # the rank's own channel, as display uses it
        "send = rank_display.current_display._send\n"
        "send(Display(rank, {'text/plain': np.float32(1.5)}, {}))\nprint('still here', rank)")
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert all(f"[rank {r}] still here {r}" in reply.stdout for r in range(4)), reply.stdout
    assert "the kernel refused a message from rank" in reply.stdout


def test_what_ranks_print_between_cells_shows_as_it_comes(kernel: KernelSession, tmp_path) -> None:
    """A thread a cell leaves running on the ranks: its lines waited for the next ``%%dist`` cell
    and then looked as if that cell had printed them. They show under the cell run last, as a
    kernel thread's prints do, once the thread prints (after the test creates a file)."""
    go = tmp_path / "go"
    reply = kernel.execute(
        "%%dist\nimport os, threading, time\n"
        "def later():\n"
        f"    while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        "    print('between cells', rank)\n"
        "threading.Thread(target=later, daemon=True).start()\nprint('cell ends', rank)")
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert "between cells" not in reply.stdout
    go.write_text("")
    later = kernel.stdout_after(reply, lambda text: text.count("between cells") == 4, timeout=60)
    assert all(f"[rank {r}] between cells {r}" in later for r in range(4)), later
    reply = kernel.execute("%%dist\nprint('next', rank)")
    assert reply.error is None and "between cells" not in reply.stdout, reply.stdout  # shown once


def test_a_rank_printing_without_pause_between_cells_leaves_the_kernel_answering(kernel: KernelSession) -> None:
    """The kernel reads between-cell output in its own event loop, a batch at a time: read to the
    end, a printer faster than the kernel would keep it from ever taking the next cell. (Here the
    kernel outpaces 4 printing ranks, so this guards the behaviour rather than the batch size.)"""
    reply = kernel.execute("%%dist\nimport threading\n_flooding = True\n"
                           "def flood():\n    i = 0\n    while _flooding:\n        print('flood', i); i += 1\n"
                           "_flood = threading.Thread(target=flood, daemon=True)\n_flood.start()")
    assert reply.error is None, reply.traceback
    assert kernel.execute("print('the kernel answers')", timeout=60).stdout == "the kernel answers\n"
    reply = kernel.execute("%%dist\n_flooding = False\n_flood.join()\nprint('stopped', rank)", timeout=60)
    assert reply.error is None, reply.traceback
    assert all(f"[rank {r}] stopped {r}" in reply.stdout for r in range(4)), reply.stdout[-2000:]


def test_stderr_and_warnings_from_ranks_are_labelled_on_stdout(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nimport sys, warnings\nprint('to stderr', file=sys.stderr)\n"
                           "warnings.warn('careful')")
    assert reply.error is None and reply.stderr == ""
    for r in range(4):
        assert f"[rank {r}] to stderr" in reply.stdout
        assert "careful" in reply.stdout


def test_a_progress_bar_is_one_live_line_per_rank(kernel: KernelSession) -> None:
    """tqdm rewrites its line with "\\r": each rank gets one output updated in place, ending on
    the finished bar, and no stream line per update (a training loop would print hundreds)."""
    reply = kernel.execute("%%dist\nfrom tqdm import tqdm\nimport time\n"
                           "for i in tqdm(range(30), mininterval=0.01): time.sleep(0.02)\nprint('after', rank)")
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert "it/s" not in reply.stdout and "%|" not in reply.stdout
    bars: dict[str, list[str]] = {}
    for output in reply.outputs:
        bars.setdefault(output["transient"]["display_id"], []).append(output["data"]["text/plain"])
    assert len(bars) == 4, bars
    for texts in bars.values():
        rank = texts[0].split("]")[0] + "]"
        assert all(text.startswith(rank) for text in texts)
        assert "30/30" in texts[-1], texts  # it ends on the finished bar
        # how often it moved depends on the machine's load: the kernel shows at most 10 redraws a second
    for r in range(4):
        assert f"[rank {r}] after" in reply.stdout


def test_notebook_widgets_on_a_rank_say_why_and_a_notebook_bar_is_a_live_line(kernel: KernelSession) -> None:
    """A widget's model lives on the rank, where no browser reaches it: its view showed as a broken
    widget ("model not found"), and ``tqdm.notebook``'s bar (a widget) never moved."""
    reply = kernel.execute("%%dist\nimport ipywidgets, time\ndisplay(ipywidgets.IntSlider(value=rank))\n"
                           "from tqdm.notebook import tqdm, trange\n"
                           "for i in tqdm(range(30), mininterval=0.01): time.sleep(0.01)\nprint('after', rank)")
    assert reply.error is None and reply.stderr == "", reply.traceback
    views = [out for out in reply.outputs if "application/vnd.jupyter.widget-view+json" in out["data"]]
    assert views == [], views
    texts = [str(out["data"].get("text/plain", "")) for out in reply.shown()]
    for r in range(4):
        assert any(f"IntSlider(value={r})" in t and "cannot reach the browser" in t for t in texts), texts
        assert any(t.startswith(f"[rank {r}]") and "30/30" in t for t in texts), texts  # tqdm's text bar
        assert f"[rank {r}] after {r}" in reply.stdout


def test_input_on_a_rank_says_why_it_cannot_read(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nname = input('your name? ')")
    assert reply.error is not None and reply.stderr == ""
    assert "no keyboard" in reply.traceback and "%dist_push" in reply.traceback
    assert "distlab/" not in reply.traceback, reply.traceback  # the cell's line is the last frame shown
    reply = kernel.execute("%%dist\ntry:\n    x = input()\nexcept EOFError:\n    x = 'default'\nprint(x)")
    assert reply.error is None, reply.traceback  # code that expects EOF still gets an EOFError
    assert all(f"[rank {r}] default" in reply.stdout for r in range(4))


def test_a_script_whose_argparse_finds_no_arguments_says_how_to_give_them(kernel: KernelSession) -> None:
    """A training script pasted into a cell parses its command line, which a rank does not have:
    the failure says so and how to pass the arguments; the way it names works."""
    defaults = kernel.execute("%%dist\nimport argparse, sys\np = argparse.ArgumentParser()\n"
                              "p.add_argument('--lr', type=float, default=0.1)\nprint(p.parse_args().lr, sys.argv[1:])")
    assert defaults.error is None, defaults.traceback  # no arguments at all: the defaults hold
    assert sorted(defaults.stdout.splitlines()) == [f"[rank {r}] 0.1 []" for r in range(4)], defaults.stdout
    parser = ("import argparse, sys\np = argparse.ArgumentParser()\n"
              "p.add_argument('--lr', type=float, required=True)\n")
    reply = kernel.execute(f"%%dist\n{parser}args = p.parse_args()")
    assert reply.error is not None and reply.stderr == ""
    assert "SystemExit: 2" in reply.traceback and "parse_args([" in reply.traceback, reply.traceback
    assert "the following arguments are required: --lr" in reply.stdout
    reply = kernel.execute(f"%%dist\n{parser}sys.argv, kept = ['train.py', '--lr', '0.1'], sys.argv\n"
                           "print(p.parse_args().lr)\nsys.argv = kept")
    assert reply.error is None, reply.traceback
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] 0.1" for r in range(4)]


def test_ranks_follow_the_kernels_folder_import_path_and_environment(kernel: KernelSession, tmp_path) -> None:
    """``%cd``, ``%env`` and a module written beside the notebook hold in a ``%%dist`` cell as in
    any cell; what a rank's own cell set stays until the kernel changes the same thing."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "follow_helper.py").write_text("VALUE = 7\nclass Point:\n    x = 3\n")
    setup = kernel.execute(f"import os, sys\n_before = os.getcwd()\nos.chdir({str(tmp_path)!r})\n"
                           "sys.path.append(__import__('pathlib').Path('lib'))\n"  # a Path, as people write
                           "os.environ['FOLLOW_SETTING'] = 'from the kernel'")
    assert setup.error is None, setup.traceback
    try:  # pushed before any cell ran there: the ranks unpickle it in the kernel's folder and path
        pushed = kernel.execute("sys.path.append('lib')\nimport follow_helper\npoint = follow_helper.Point()\n%dist_push point")
        assert pushed.error is None and pushed.stderr == "", pushed.traceback
        show = "%%dist\nimport os, follow_helper\nprint(os.getcwd(), follow_helper.VALUE, os.environ.get('FOLLOW_SETTING'))"
        reply = kernel.execute(show)
        assert reply.error is None and reply.stderr == "", reply.traceback
        assert all(f"[rank {r}] {tmp_path} 7 from the kernel" in reply.stdout for r in range(4)), reply.stdout
        assert kernel.execute("%%dist\nprint(point.x)").stdout.count("] 3\n") == 4
        own = kernel.execute("%%dist\nos.chdir('lib'); os.environ['FOLLOW_SETTING'] = f'own {rank}'")
        assert own.error is None, own.traceback
        reply = kernel.execute(show)
        assert all(f"[rank {r}] {tmp_path / 'lib'} 7 own {r}" in reply.stdout for r in range(4)), reply.stdout
        again = kernel.execute("del os.environ['FOLLOW_SETTING']\nos.chdir('lib')")
        assert again.error is None, again.traceback
        reply = kernel.execute(show)
        assert all(f"[rank {r}] {tmp_path / 'lib'} 7 None" in reply.stdout for r in range(4)), reply.stdout
    finally:
        kernel.execute("os.chdir(_before)\nsys.path[:] = [p for p in sys.path if str(p) != 'lib']\n"
                       "os.environ.pop('FOLLOW_SETTING', None)")


def test_autoreload_in_the_kernel_reloads_edited_modules_on_the_ranks(kernel: KernelSession, tmp_path) -> None:
    """``%autoreload 2`` in a normal cell: a module edited beside the notebook is reloaded on the
    ranks before the next ``%%dist`` cell, as in the kernel (the ranks live on, so without this
    they ran the old code until a restart), and a function imported from it runs its new body."""
    module = tmp_path / "edited_helper.py"
    module.write_text("VALUE = 1\ndef double(x):\n    return 2 * x\n")
    setup = kernel.execute(f"import sys\nsys.path.append({str(tmp_path)!r})\n%load_ext autoreload\n%autoreload 2")
    assert setup.error is None, setup.traceback
    try:
        first = kernel.execute("%%dist\nimport edited_helper\nfrom edited_helper import double\n"
                               "print(edited_helper.VALUE, double(rank))")
        assert first.error is None and first.stderr == "", first.traceback
        assert all(f"[rank {r}] 1 {2 * r}" in first.stdout for r in range(4)), first.stdout
        module.write_text("VALUE = 2\ndef double(x):\n    return 20 * x\n")
        later = os.stat(module).st_mtime + 2
        os.utime(module, (later, later))  # a later time than the import saw, whatever the clock's grain
        second = kernel.execute("%%dist\nprint(edited_helper.VALUE, double(rank))")
        assert second.error is None and second.stderr == "", second.traceback
        assert all(f"[rank {r}] 2 {20 * r}" in second.stdout for r in range(4)), second.stdout
        off = kernel.execute("%autoreload 0")
        assert off.error is None, off.traceback
        module.write_text("VALUE = 3\ndef double(x):\n    return 0\n")
        os.utime(module, (later + 2, later + 2))
        third = kernel.execute("%%dist\nprint(edited_helper.VALUE)")
        assert all(f"[rank {r}] 2" in third.stdout for r in range(4)), third.stdout  # off: as in the kernel
    finally:
        kernel.execute(f"%autoreload 0\nsys.path[:] = [p for p in sys.path if p != {str(tmp_path)!r}]")


def test_syncbatchnorm_on_cpu_ranks_says_what_to_use_instead(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nbn = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.BatchNorm1d(3))\n"
                           "bn(torch.randn(4, 3, device=device))")
    assert reply.error is not None and reply.stderr == ""
    assert "SyncBatchNorm runs on GPUs only" in reply.traceback and "all_reduce" in reply.traceback
    assert "This rank has no GPU to use" not in reply.traceback  # moving to `device` would not help


@pytest.mark.parametrize("line", ["breakpoint()", "import pdb; pdb.set_trace()"])
def test_a_debugger_on_a_rank_says_why_it_cannot_stop(kernel: KernelSession, line: str) -> None:
    reply = kernel.execute(f"%%dist\nx = rank\n{line}\nprint('after', x)")
    assert reply.error is not None and reply.stderr == ""
    assert "cannot stop a rank" in reply.traceback and "%dist_pull" in reply.traceback
    reply = kernel.execute("%%dist\nprint('next', x)")
    assert reply.error is None, reply.traceback
    assert all(f"[rank {r}] next {r}" in reply.stdout for r in range(4))


FORK_CELL = """%%dist
import os, sys
pid = os.fork()
if pid == 0:
    print("child of", rank)
    if rank == 1:
        raise ValueError("the child fails")
    sys.exit(3)
_, status = os.waitpid(pid, 0)
print("parent", rank, "child exit", os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_in_a_cell_ends_there_and_the_rank_goes_on(kernel: KernelSession) -> None:
    """A forked child runs the rest of the cell and ends, as in a script: it must not go back to
    the rank's loop, where it would answer for its rank and read its next task."""
    reply = kernel.execute(FORK_CELL)
    assert reply.error is None and reply.stderr == "", reply.traceback
    lines = reply.stdout.splitlines()
    for r in range(4):
        assert f"[rank {r}] child of {r}" in lines, lines
        assert f"[rank {r}] parent {r} child exit {1 if r == 1 else 3}" in lines, lines
    assert "[rank 1] ValueError: the child fails" in lines, lines  # the child's traceback, as Python prints it
    reply = kernel.execute("%%dist\nt = torch.tensor([rank + 1.0])\ndist.all_reduce(t)\nprint('sum', t.item())")
    assert reply.error is None, reply.traceback
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] sum 10.0" for r in range(4)]
    reply = kernel.execute("%%dist\nimport multiprocessing as mp\nwith mp.get_context('fork').Pool(2) as p:\n"
                           "    print(p.map(abs, [-1, -2, -3]))")
    assert reply.error is None, reply.traceback
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] [1, 2, 3]" for r in range(4)]


@pytest.mark.parametrize("line", ['x = torch.ones(2).to(f"cuda:{rank}")',
                                  'dist.destroy_process_group()\ndist.init_process_group("nccl")',
                                  'from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n'
                                  'FSDP(torch.nn.Linear(2, 2))'])
def test_code_written_for_gpus_on_a_cpu_machine_gets_a_hint(kernel: KernelSession, line: str) -> None:
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    reply = kernel.execute("%%dist\n" + line)
    assert reply.error is not None and reply.stderr == ""
    assert 'init_process_group("gloo")' in reply.traceback and "variable device" in reply.traceback
    assert "FSDP takes device_id=device" in reply.traceback
    reply = kernel.execute("%%dist\nprint(dist.get_backend(), device)")  # the pool goes on, on its group
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] gloo cpu" for r in range(4)], reply.traceback


def test_names_a_cell_deleted_are_back_in_the_next(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\ndel rank, world_size, device, dist")
    assert reply.error is None, reply.traceback
    reply = kernel.execute("%%dist\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(rank, world_size, device, t.item())")
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] {r} 4 cpu 4.0" for r in range(4)], reply.traceback


def test_a_cell_that_lowered_the_open_file_limit_is_named_when_a_later_one_fails(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nimport os, resource\n_old_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
                           "resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir('/proc/self/fd')) + 3, "
                           "_old_nofile[1]))")
    assert reply.error is None, reply.traceback
    reply = kernel.execute("%%dist\n_files = [open(os.devnull) for _ in range(50)]")
    assert reply.error is not None and reply.stderr == ""
    assert "Too many open files" in reply.traceback
    assert "RLIMIT_NOFILE" in reply.traceback and "%dist_restart" in reply.traceback
    reply = kernel.execute("%%dist\nresource.setrlimit(resource.RLIMIT_NOFILE, _old_nofile)\n"
                           "t = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())")
    assert sorted(reply.stdout.splitlines()) == [f"[rank {r}] 4.0" for r in range(4)], reply.traceback


def test_top_level_await_runs_on_one_loop_per_rank(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nimport asyncio\nasync def twice(x):\n    await asyncio.sleep(0.01)\n"
                           "    return 2 * x\nlater = asyncio.ensure_future(twice(rank))\nawait twice(rank)")
    assert reply.error is None, reply.traceback
    assert all(f"[rank {r}] {2 * r}" in reply.stdout for r in range(4))
    reply = kernel.execute("%%dist\nprint('later', await later)")  # a task from the cell before
    assert reply.error is None, reply.traceback
    assert all(f"[rank {r}] later {2 * r}" in reply.stdout for r in range(4))
    reply = kernel.execute("%%dist\nprint('run', asyncio.run(twice(rank)))")  # its own loop, then unset
    assert reply.error is None, reply.traceback
    reply = kernel.execute("%%dist\nagain = asyncio.ensure_future(twice(rank))\nprint('again', await again)")
    assert reply.error is None and reply.stderr == "", reply.traceback
    assert all(f"[rank {r}] again {2 * r}" in reply.stdout for r in range(4))


def test_ten_megabytes_of_output_do_not_block_and_keep_the_end(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist\nfor i in range(100_000):\n    print(f'{i:>6}', 'x' * 92)\nprint('done', rank)")
    assert reply.error is None, reply.traceback
    lines = reply.stdout.splitlines()
    for r in range(4):
        mine = [line for line in lines if line.startswith(f"[rank {r}] ")]
        assert mine[0] == f"[rank {r}]      0 " + "x" * 92  # the head, from the first line on
        assert mine[-1] == f"[rank {r}] done {r}"  # and the end: the last lines are never dropped
        assert mine[-2] == f"[rank {r}]  99999 " + "x" * 92
        notes = [line for line in mine if "more characters of output were not shown" in line]
        assert len(notes) == 1
        left_out = int(notes[0].split("... ")[1].split()[0])
        kept = sum(len(line) - len(f"[rank {r}] ") + 1 for line in mine if line not in notes)
        assert kept + left_out == 100_000 * 100 + len(f"done {r}\n")  # every character shown or counted
    assert kernel.execute("%%dist\nprint('after')").stdout.count("after") == 4


def _launchers(kernel_pid: int) -> list[int]:
    return [p for p in children(kernel_pid) if cmdline(p)[1:3] == ["-m", "distlab.launcher"]]


def test_the_kernel_never_imports_torch_or_forks_ranks(kernel: KernelSession) -> None:
    assert kernel.value("'torch' in __import__('sys').modules") is False
    launcher = kernel.value("__import__('distlab.hub').hub.Hub.get().launcher.pid")
    assert parent(launcher) == kernel.pid
    assert cmdline(launcher)[0] == kernel.value("__import__('sys').executable")
    assert cmdline(launcher)[1:] == ["-m", "distlab.launcher", kernel.value("__import__('distlab.hub').hub.Hub.get().dir")]
    # %load_ext started it before the magics were imported, and the hub adopted it: no second one
    assert _launchers(kernel.pid) == [launcher]
    for pid in kernel.value(PIDS):
        assert parent(pid) == launcher


def test_loading_the_extension_again_keeps_one_launcher() -> None:
    session = KernelSession()
    try:
        for line in ("%load_ext distlab", "%reload_ext distlab"):
            reply = session.execute(f"{line}\n%dist_start")
            assert reply.error is None, reply.traceback
        assert _launchers(session.pid) == [session.value("__import__('distlab.hub').hub.Hub.get().launcher.pid")]
    finally:
        session.shutdown()


def test_every_listening_port_is_loopback(kernel: KernelSession) -> None:
    kernel.execute("%%dist\nt = torch.ones(1)\ndist.all_reduce(t)")
    pids = kernel.value(PIDS)
    addresses = [a for pid in pids for a in listening_addresses(pid)]
    assert addresses, "rank 0 hosts the TCPStore"
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses


def test_the_control_channel_drops_a_client_without_the_key(kernel: KernelSession) -> None:
    path = kernel.value("__import__('distlab.hub').hub.Hub.get().path")
    import os
    import stat

    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    from distlab import protocol

    with pytest.raises((protocol.HandshakeFailed, EOFError, OSError)):
        protocol.connect(path, b"not the key" * 3)
    reply = kernel.execute("%%dist\nprint('still fine')")
    assert reply.stdout.count("still fine") == 4


def test_two_kernels_run_pools_at_the_same_time(kernel: KernelSession) -> None:
    other = KernelSession()
    try:
        other.execute("%load_ext distlab")
        first = other.execute("%%dist -n 2\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())")
        second = kernel.execute("%%dist\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())")
        assert first.error is None and second.error is None
        assert first.stdout.count("2.0") == 2 and second.stdout.count("4.0") == 4
    finally:
        other.shutdown()


def test_a_function_defined_in_the_notebook_runs_with_distlab_run(kernel: KernelSession) -> None:
    kernel.execute("import distlab\ndef where():\n    import torch.distributed as dist\n    return dist.get_rank()")
    assert kernel.value("distlab.run(where, world_size=3)") == [0, 1, 2]
    reply = kernel.execute("def broken():\n    return 1 / 0\ndistlab.run(broken, world_size=2)")
    assert reply.error["ename"] == "RankError"
    assert "return 1 / 0" in reply.traceback  # the notebook's own source line, shipped with the function




def test_start_stop_and_restart(kernel: KernelSession) -> None:
    kernel.execute("%%dist -n 4\npass")
    old = kernel.value(PIDS)
    reply = kernel.execute("%dist_stop")
    assert "pool stopped" in reply.stdout
    assert wait_gone(old) == []
    assert "no pool" in kernel.execute("%dist_status").stdout
    reply = kernel.execute("%dist_start -n 3")
    assert "3 ranks ready (gloo)" in reply.stdout
    kernel.execute("%%dist\nmarker = rank")
    started = kernel.value(PIDS)
    assert len(started) == 3
    reply = kernel.execute("%dist_restart")
    assert "3 fresh ranks" in reply.stdout
    assert set(kernel.value(PIDS)).isdisjoint(started) and wait_gone(started) == []
    reply = kernel.execute("%dist_pull marker")
    assert reply.error is not None and "marker" in reply.traceback  # rank state is gone after a restart
    kernel.execute("%%dist -n 4\npass")


def test_c_level_writes_and_unfinished_lines_arrive_before_the_cell_ends(kernel: KernelSession) -> None:
    reply = kernel.execute("%%dist -n 4\nimport os\nos.write(1, b'from C\\n')\nprint('no newline', end='')")
    assert reply.error is None, reply.traceback
    for r in range(4):
        assert f"[rank {r}] from C" in reply.stdout and f"[rank {r}] no newline" in reply.stdout
