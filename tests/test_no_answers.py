"""No graded answer ships to students, and grading ranks cannot reach the instructor's.

- The wheel students install (``pip install`` of the project; ``make lab`` installs the same
  tree) holds no function that any exercise asks for: not by name, not renamed (the body of
  every reference answer in solutions/ is compared with every function in the wheel).
- A submission that imports the reference code or reads the solution notebook earns nothing,
  and its feedback says why; the same submission without the protection would earn full marks.
- The ring the notebooks replay is a committed recording that still matches the reference.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from distlab import confine, private_network
from distlab.grading.catalog import ENTRIES
from distlab.grading.extract import solution_source

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"


def _function_bodies(tree: ast.AST) -> dict[str, str]:
    """name -> normalised dump of the body (no docstring), for every function in ``tree``."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]  # a docstring does not make a different answer
            found[node.name] = ast.dump(ast.Module(body=body, type_ignores=[]), annotate_fields=False)
    return found


def _reference_bodies() -> dict[str, str]:
    """Every function each exercise's answer cell defines, from its nbgrader source (the instructor's answer)."""
    bodies = {}
    for known in ENTRIES:
        nb = json.loads((SOLUTIONS / known.assignment / f"{known.assignment}.ipynb").read_text())
        tree = ast.parse(solution_source(nb, known.solution_ids))
        top = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert known.function in top, known
        bodies.update({name: body for name, body in _function_bodies(tree).items() if name in top})
    return bodies


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(REPO)], check=True, capture_output=True, text=True)
    (built,) = out.glob("distlab-*.whl")
    return built


def test_the_wheel_holds_no_graded_function(wheel: Path) -> None:
    references = _reference_bodies()
    assert len(references) >= len(ENTRIES) >= 7
    names = set(references)
    with zipfile.ZipFile(wheel) as archive:
        files = archive.namelist()
        assert {f.split("/", 1)[0] for f in files if not f.startswith("distlab-")} == {"distlab"}
        modules = [f for f in files if f.endswith(".py")]
        assert len(modules) > 20
        for name in modules:
            bodies = _function_bodies(ast.parse(archive.read(name)))
            assert not names & set(bodies), f"{name} defines {sorted(names & set(bodies))}"
            for function, body in references.items():
                copies = [own for own, other in bodies.items() if other == body]
                assert not copies, f"{name}: {copies} is the reference answer to {function}, renamed"


def test_the_check_would_see_an_answer_in_the_package() -> None:
    """The two checks above can fail: a graded function, as the old package had it, is found."""
    references = _reference_bodies()
    planted = (SOLUTIONS / "ex2_ring_all_reduce" / "ex2_ring_all_reduce.ipynb").read_text()
    source = solution_source(json.loads(planted), ("ring_all_reduce",)).replace("def ring_all_reduce", "def helper")
    bodies = _function_bodies(ast.parse(source))
    assert bodies["helper"] == references["ring_all_reduce"]


def _one_batch(source: str) -> str:
    """The feedback for one case of exercise 1 on two fresh grading ranks ("" when it passed)."""
    from distlab.grading import runner
    from distlab.grading.ex1_all_reduce_rs_ag import EXERCISE
    from distlab.grading.spec import Batch, Part, Submission

    batch = Batch.of(2, EXERCISE.parts[0].batches[0].cases[0])
    submission = Submission(EXERCISE.function, EXERCISE.setup_source, source)
    return runner.run_batch(EXERCISE, submission, Part("any", "one case", (batch,)), batch, 20.0) or ""


def _grade(source: str, protected: tuple[str, ...]) -> list[tuple[str, bool, str]]:
    from distlab.grading.session import GradingSession

    session = GradingSession(20.0, "", protected)
    result = session.grade("ex1_all_reduce_rs_ag", source)
    return [(p.part, p.passed, p.message) for p in result.parts]


READ_SOLUTION = f'''import json

with open({str(SOLUTIONS / "ex1_all_reduce_rs_ag" / "ex1_all_reduce_rs_ag.ipynb")!r}) as handle:
    cells = json.load(handle)["cells"]
exec("".join(next(c["source"] for c in cells if c.get("id") == "all_reduce_rs_ag")))
'''


@pytest.mark.slow
def test_grading_ranks_cannot_read_the_solutions() -> None:
    unprotected = _grade(READ_SOLUTION, ())
    assert all(passed for _, passed, _ in unprotected), unprotected  # the attack works without the guard
    protected = _grade(READ_SOLUTION, (str(SOLUTIONS), str(REPO / "grader")))
    assert not any(passed for _, passed, _ in protected)
    assert "read the instructor's files" in protected[0][2]


READ_SOLUTION_IN_CPP = f'''import json, os, torch

path = {str(SOLUTIONS / "ex1_all_reduce_rs_ag" / "ex1_all_reduce_rs_ag.ipynb")!r}
raw = torch.from_file(path, size=os.path.getsize(path), dtype=torch.uint8)  # C++ opens it: no audit event
cells = json.loads(bytes(raw.tolist()))["cells"]
exec("".join(next(c["source"] for c in cells if c.get("id") == "all_reduce_rs_ag")))
'''


@pytest.mark.slow
@pytest.mark.skipif(not confine.available(), reason="this kernel does not enforce Landlock (Linux 5.13+)")
def test_grading_ranks_cannot_read_the_solutions_from_cpp() -> None:
    """The audit hook only sees Python's opens; the kernel refuses C++'s too (Landlock)."""
    unprotected = _grade(READ_SOLUTION_IN_CPP, ())
    assert all(passed for _, passed, _ in unprotected), unprotected  # the attack works without it
    protected = _grade(READ_SOLUTION_IN_CPP, (str(SOLUTIONS), str(REPO / "grader")))
    assert not any(passed for _, passed, _ in protected)
    assert "Permission denied" in protected[0][2], protected[0][2]


@pytest.mark.slow
def test_grading_ranks_cannot_import_the_reference_or_run_programs() -> None:
    imported = _grade("from grader.reference import all_reduce_rs_ag\n", ())
    assert not any(passed for _, passed, _ in imported)
    assert "import the instructor's reference code (grader.reference)" in imported[0][2]
    shelled = _grade("import subprocess\nsubprocess.run(['true'])\n", ())
    assert "start other programs" in shelled[0][2]
    forked = _grade("import os\ndef all_reduce_rs_ag(tensor, op=None, group=None):\n"
                    "    if os.fork() == 0:\n        os._exit(0)\n", ())
    assert not any(passed for _, passed, _ in forked)
    assert "start other programs (os.fork)" in forked[0][2], forked[0][2]


# Routes Python raises no audit event for. The sandbox replaces them with refusals that say why;
# a submission that makes itself fresh copies of the modules (importlib) meets the kernel instead.
UNAUDITED = """import importlib.util, multiprocessing, os, sys
from multiprocessing import util

def _fresh(name):
    return importlib.util.module_from_spec(importlib.util.find_spec(name))

def all_reduce_rs_ag(tensor, op=None, group=None):
    {attack}
    raise RuntimeError("ESCAPED")
"""
ATTACKS = {
    "spawn": ('p = multiprocessing.get_context("spawn").Process(target=print)\n    p.start()\n    p.join()',
              "start other programs (_posixsubprocess.fork_exec)"),
    "pidfd": ("import signal\n    signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 0)",
              "signal other processes (signal.pidfd_send_signal)"),
    "fresh fork_exec": ('sys.modules["_posixsubprocess"] = _fresh("_posixsubprocess")\n'
                        '    util.spawnv_passfds(b"/bin/true", [b"true"], ())', "Operation not permitted"),
    "fresh pidfd": ('_fresh("_signal").pidfd_send_signal(os.pidfd_open(os.getppid()), 0)', "Operation not permitted"),
    # a grader run as root may raise a hard limit: the rank's memory and file-size limits must hold
    "limits": ("import resource\n    resource.setrlimit(resource.RLIMIT_DATA, resource.getrlimit(resource.RLIMIT_DATA))",
               "change their resource limits (resource.setrlimit)"),
    "fresh limits": ('_fresh("resource").prlimit(0, 2, (-1, -1))', "change their resource limits (resource.prlimit)"),
}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's refusals (Landlock, seccomp) are Linux's")
def test_grading_ranks_start_no_program_and_signal_no_one_by_routes_without_an_audit_event() -> None:
    """multiprocessing's spawn starts a fresh Python without the audit hook (which could then
    kill the grader); pidfd_send_signal kills without os.kill. Both fail, in words where Python
    can say it, and by the kernel where the submission got past Python. So does lifting the
    rank's limits (root may raise a hard limit), through any copy of the resource module."""
    for name, (attack, refused) in ATTACKS.items():
        graded = _grade(UNAUDITED.format(attack=attack), ())
        assert not any(passed for _, passed, _ in graded), name
        assert refused in graded[0][2] and "ESCAPED" not in graded[0][2], (name, graded[0][2])


FORBIDDEN_PROCESSES = r'''
import ctypes, os, signal, socket, subprocess, sys, threading
import torch
from distlab import confine

libc = ctypes.CDLL(None, use_errno=True)


def call(name, *args):
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), name)
    return 1

desktop = socket.socket(socket.AF_UNIX)  # an abstract socket from outside, as D-Bus or an X server has
desktop.bind(f"\0distlab-test-{os.getpid()}")
desktop.listen(1)
own = sys.argv[1]  # the test's tmp_path: a confined process cannot remove a folder in /tmp
assert confine.confine([], [own]) and confine.forbid_new_processes()
said = []
for name, attempt in (("fork", os.fork), ("program", lambda: subprocess.run(["true"])),
                      ("pidfd", lambda: signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 0)),
                      ("kill", lambda: os.kill(os.getppid(), 0) if confine.signals_scoped() else 1 / 0),
                      ("abstract", lambda: socket.socket(socket.AF_UNIX).connect(f"\0distlab-test-{os.getpid()}")
                       if confine.signals_scoped() else 1 / 0),
                      ("unshare", lambda: call("unshare", 0x40000000)),  # a new network namespace
                      ("setns", lambda: call("setns", os.open("/proc/self/ns/net", os.O_RDONLY), 0))):
    try:
        if attempt() == 0:
            os._exit(0)  # a child that got through
        said.append(name + ":allowed")
    except (OSError, ZeroDivisionError) as refused:
        said.append(f"{name}:{type(refused).__name__}")
threads = [threading.Thread(target=lambda: said.append("thread")) for _ in range(3)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
torch.set_num_threads(2)
said.append(str(int(torch.ones(512, 512).mm(torch.ones(512, 512))[0, 0])))
print(" ".join(said))
'''


@pytest.mark.skipif(not confine.available(), reason="this kernel does not enforce Landlock (Linux 5.13+)")
def test_a_confined_rank_starts_threads_but_no_process_and_signals_no_one_outside(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", FORBIDDEN_PROCESSES, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    scoped = "PermissionError" if confine.signals_scoped() else "ZeroDivisionError"  # Linux < 6.12: no scopes
    assert done.stdout.split() == ["fork:PermissionError", "program:PermissionError", "pidfd:PermissionError",
                                   f"kill:{scoped}", f"abstract:{scoped}", "unshare:PermissionError",
                                   "setns:PermissionError", "thread", "thread", "thread", "512"], done.stdout


def _own_address() -> str | None:
    """This machine's address on its way out, if it has one (a UDP connect sends nothing)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only the route is looked up
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


CONNECT_OUT = """import datetime, socket
import torch.distributed as dist
def all_reduce_rs_ag(tensor, op=None, group=None):
    said = []
    try:
        socket.socket()
    except OSError as refused:
        said.append(f"python: {{refused}}")
    for address in {addresses!r}:  # torch's own connections, made in C++
        try:
            dist.TCPStore(address[0], address[1], is_master=False, timeout=datetime.timedelta(seconds=2))
            said.append(f"REACHED {{address}}")
        except Exception as refused:
            said.append(f"{{address[0]}}: {{type(refused).__name__}}")
    raise RuntimeError("; ".join(said))
"""


@pytest.mark.slow
@pytest.mark.skipif(not private_network.works_here(), reason="this machine gives no process a network namespace")
def test_grading_ranks_reach_each_other_and_no_server_on_the_machine_or_beyond() -> None:
    """A submission opens no socket of its own, and torch's sockets (made in C++) see only the
    ranks' own loopback: not a server on the grader's 127.0.0.1 (a Jupyter server, the grader's
    store), not one on the machine's own address."""
    servers = []
    for host in ("127.0.0.1", _own_address()):
        if host is None:
            continue
        server = socket.socket()
        server.bind((host, 0))
        server.listen(8)
        server.setblocking(False)
        servers.append(server)
    try:
        addresses = [server.getsockname() for server in servers]
        message = _one_batch(CONNECT_OUT.format(addresses=addresses))
        assert message and "REACHED" not in message, message
        assert "python: the grader does not let submissions open sockets" in message, message
        assert all(f"{host}: DistNetworkError" in message for host, _ in addresses), message
        for server in servers:
            with pytest.raises(BlockingIOError):
                server.accept()  # no connection ever arrived
    finally:
        for server in servers:
            server.close()


# each rank leaves its tensor in its own folder, then tries to take the other's, or to open a socket
SIDE_CHANNELS = """import os, re, socket, tempfile
def all_reduce_rs_ag(tensor, op=None, group=None):
    me, own = dist.get_rank(), tempfile.gettempdir()
    torch.save(tensor, os.path.join(own, "mine"))  # in its own folder: allowed
    stack = None  # and in its stack file, through the descriptor faulthandler holds open
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(f"-{me}.stack"):
                stack = os.readlink(f"/proc/self/fd/{fd}")
                os.write(int(fd), b"12345678")
        except OSError:
            pass
    dist.barrier()
    theirs = os.path.join(re.sub(r"-[0-9]+$", f"-{1 - me}", own), "mine")
    said = [f"own folder {own != os.path.dirname(theirs)}", f"stack {stack is not None}"]
    for how, read, path in (("python", torch.load, theirs),
                            ("c++", lambda path: torch.from_file(path, size=8, dtype=torch.uint8), theirs),
                            ("stack", lambda path: open(path).read(), stack.replace(f"-{me}.stack", f"-{1 - me}.stack")),
                            ("c++ stack", lambda path: torch.from_file(path, size=8, dtype=torch.uint8),
                             stack.replace(f"-{me}.stack", f"-{1 - me}.stack"))):
        try:
            read(path)
            said.append(f"{how}: READ")
        except Exception as refused:  # why, in few words: the feedback keeps 400 characters
            said.append(f"{how}: {type(refused).__name__} {'another rank' in str(refused)}"
                        f" {'Permission denied' in str(refused)}")
    try:
        socket.socket()
        said.append("socket: OPENED")
    except OSError as refused:
        said.append(f"socket: {type(refused).__name__} {'open sockets' in str(refused)}")
    raise RuntimeError("; ".join(said))
"""


@pytest.mark.slow
def test_grading_ranks_pass_nothing_to_each_other_around_torch_distributed() -> None:
    """A file one rank writes and another reads (in its folder, or its stack file through the
    descriptor faulthandler holds), or a socket between them, is communication no recorder sees:
    ranks that swapped their tensors so and summed them themselves (with a token reduce_scatter
    and all_gather) scored 10/10 on exercise 1, its communication part included."""
    message = _one_batch(SIDE_CHANNELS)
    assert "own folder True; stack True" in message and "READ" not in message and "OPENED" not in message, message
    assert "python: PermissionError True False" in message, message  # the audit hook, saying why
    assert "stack: PermissionError True False" in message, message
    if confine.available():  # C++'s open is refused by the kernel
        assert "c++: RuntimeError False True" in message and "c++ stack: RuntimeError False True" in message, message
    assert "socket: PermissionError True" in message, message


# signal 0 only asks whether a signal could be sent: if the refusal ever broke, nothing is hurt
SIGNAL_OTHERS = """import os
def all_reduce_rs_ag(tensor, op=None, group=None):
    os.kill(os.getpid(), 0)  # itself: allowed
    launcher = os.getppid()
    with open(f"/proc/{launcher}/stat") as stat:
        grader = int(stat.read().rsplit(")", 1)[1].split()[1])
    os.kill(grader, 0)
"""


@pytest.mark.slow
def test_grading_ranks_cannot_signal_the_grader_or_other_processes() -> None:
    for source, refused in ((SIGNAL_OTHERS, "os.kill"),
                            (SIGNAL_OTHERS.replace("os.kill(grader, 0)", "os.kill(-1, 0)"), "os.kill -1"),
                            (SIGNAL_OTHERS.replace("os.kill(grader, 0)", "os.killpg(os.getpgid(launcher), 0)"),
                             "os.killpg")):
        graded = _grade(source, ())
        assert not any(passed for _, passed, _ in graded)
        assert f"signal other processes ({refused}" in graded[0][2], graded[0][2]


@pytest.mark.slow
def test_the_committed_ring_recording_matches_the_reference() -> None:
    from distlab.replay import recording, ring_frames
    from grader import record

    fresh = ring_frames(record.record_ring())
    committed = ring_frames(recording(f"ring_all_reduce_{record.RING_WORLD}ranks"))
    assert [(f.label, f.buffers, f.messages, f.sent, f.received) for f in committed] == \
        [(f.label, f.buffers, f.messages, f.sent, f.received) for f in fresh]
    total = sum(float(k + 10 * r) for r in range(record.RING_WORLD) for k in range(1))
    assert committed[-1].buffers[0][0] == total


# Every route below reads or moves the secret without naming its absolute path in an open().
SANDBOX_ROUTES = r'''
import os, shutil, sys, tempfile
from distlab.grading import sandbox

base, secret, elsewhere = sys.argv[1], sys.argv[2], sys.argv[3]
sandbox.install([secret])
name = os.path.basename(secret)
relative_up = os.path.relpath(os.path.join(secret, "answer.txt"), elsewhere)  # ../../x/secret/answer.txt
os.symlink(secret, os.path.join(elsewhere, "link"))

def read_fd(fd):
    return os.read(fd, 100).decode().strip()

attacks = {
    "open": lambda: open(os.path.join(secret, "answer.txt")).read(),
    "dir_fd below": lambda: read_fd(os.open(f"{name}/answer.txt", os.O_RDONLY, dir_fd=os.open(base, os.O_RDONLY))),
    "dir_fd with ..": lambda: read_fd(os.open(relative_up, os.O_RDONLY, dir_fd=os.open(elsewhere, os.O_RDONLY))),
    "opener": lambda: open(f"{name}/answer.txt", opener=lambda p, f: os.open(p, f, dir_fd=os.open(base, os.O_RDONLY))).read(),
    "symlink and dir_fd": lambda: read_fd(os.open("link/answer.txt", os.O_RDONLY, dir_fd=os.open(elsewhere, os.O_RDONLY))),
    "hard link": lambda: (os.link(os.path.join(secret, "answer.txt"), os.path.join(elsewhere, "copy")),
                          open(os.path.join(elsewhere, "copy")).read())[1],
    "rename the file out": lambda: (os.rename(os.path.join(secret, "answer.txt"), os.path.join(elsewhere, "moved")),
                                    open(os.path.join(elsewhere, "moved")).read())[1],
    "rename a folder above": lambda: (os.rename(base, base + "-moved"),
                                      open(os.path.join(base + "-moved", name, "answer.txt")).read())[1],
    "list": lambda: os.listdir(secret),
    "remove": lambda: os.remove(os.path.join(secret, "answer.txt")),
    "copy": lambda: shutil.copyfile(os.path.join(secret, "answer.txt"), os.path.join(elsewhere, "c2")),
}
for label, attack in attacks.items():
    try:
        print("LEAK" if "42" in str(attack()) else "no leak", label)
    except PermissionError as exc:
        print("refused", label, "|", exc)
    except OSError as exc:
        print("failed", label, "|", exc)

# what honest code does keeps working
with tempfile.TemporaryDirectory() as scratch:
    os.chdir(scratch)
    with open("notes.txt", "w") as handle:
        handle.write("ok")
    os.makedirs("a/b")
    os.rename("notes.txt", "a/b/notes.txt")
    assert open(os.open("b/notes.txt", os.O_RDONLY, dir_fd=os.open("a", os.O_RDONLY))).read() == "ok"
    shutil.rmtree("a")
assert name in os.listdir(base)  # a folder above may be listed
import json, email.mime.text  # imports still work
print("honest code ran")
'''


def test_the_sandbox_closes_routes_around_a_plain_open(tmp_path: Path) -> None:
    """dir_fd, openers, links and renames reach a file without an open() of its absolute path."""
    base, elsewhere = tmp_path / "course", tmp_path / "scratch" / "deep"
    (base / "secret").mkdir(parents=True)
    (base / "secret" / "answer.txt").write_text("42")
    elsewhere.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", SANDBOX_ROUTES, str(base), str(base / "secret"), str(elsewhere)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "honest code ran"
    attacks = lines[:-1]
    assert len(attacks) == 11 and all(line.startswith("refused") for line in attacks), "\n".join(attacks)
    assert (base / "secret" / "answer.txt").read_text() == "42"


CONFINED = r'''
import os, sys, threading
from distlab import confine

secret, elsewhere = sys.argv[1], sys.argv[2]
os.symlink(secret, os.path.join(elsewhere, "link"))
assert confine.confine([secret])

def attempt(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError:
        return "refused"
    os.close(fd)
    return "read"

results = [attempt(os.path.join(secret, "answer.txt")), attempt(os.path.join(elsewhere, "link", "answer.txt"))]
thread = threading.Thread(target=lambda: results.append(attempt(os.path.join(secret, "answer.txt"))))
thread.start()
thread.join()
results += [attempt(os.path.join(os.path.dirname(secret), "notes.txt")), attempt(os.path.join(elsewhere, "b.txt")),
            attempt("/etc/hostname")]
print(" ".join(results))
'''


@pytest.mark.skipif(not confine.available(), reason="this kernel does not enforce Landlock (Linux 5.13+)")
def test_a_confined_process_cannot_read_the_folder_by_any_path_and_reads_the_rest(tmp_path: Path) -> None:
    secret, elsewhere = tmp_path / "course" / "secret", tmp_path / "scratch"
    secret.mkdir(parents=True)
    elsewhere.mkdir()
    (secret / "answer.txt").write_text("42")
    (tmp_path / "course" / "notes.txt").write_text("a file next to the secret folder")
    (elsewhere / "b.txt").write_text("elsewhere")
    done = subprocess.run([sys.executable, "-c", CONFINED, str(secret), str(elsewhere)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    # the folder, through a link, from another thread: refused; the files around it: read
    assert done.stdout.split() == ["refused", "refused", "refused", "read", "read", "read"]
    # a folder holding Python itself (the inbox in the home folder that holds the venv) stays readable
    venv_holder = os.path.dirname(os.path.realpath(sys.prefix))
    kept = subprocess.run([sys.executable, "-c", "import sys\nfrom distlab import confine\n"
                           f"print(confine.confine([{venv_holder!r}]))\nimport tqdm\nprint('imports')"],
                          capture_output=True, text=True, timeout=60)
    assert kept.stdout.split() == ["False", "imports"], kept.stderr


WRITE_AROUND = """import inspect, os, tempfile, torch
TARGETS = {targets!r}

def all_reduce_rs_ag(tensor, op=None, group=None):
    scratch = os.path.join(tempfile.gettempdir(), "scratch.pt")
    torch.save(tensor, scratch)  # C++ writes in the rank's own folder: allowed, as honest code needs
    with open(scratch + ".txt", "w") as note:
        note.write("ok")
    assert torch.equal(torch.load(scratch), tensor) and open(scratch + ".txt").read() == "ok"
    for how, path in TARGETS:
        try:
            if how == "open":
                with open(path, "w") as evil:
                    evil.write("import os\\n")
            elif how == "save":
                torch.save("\\nimport os\\n", path)
            else:
                os.replace(scratch + ".txt", path)
        except Exception as refused:
            if how != "save" and "write outside their temporary folder" not in str(refused):
                raise  # Python's writes are refused by the audit hook, with a message that says why
    _honest(tensor, op, group)

{honest}
"""


@pytest.mark.slow
def test_grading_ranks_write_only_in_a_folder_of_their_own(tmp_path: Path) -> None:
    """A .pth file in site-packages runs in every later Python of the venv, the grader's too; a
    json.py where the grader starts shadows the real one. Python's writes and C++'s are refused
    outside the rank's own temporary folder; writing there works."""
    import inspect
    import site

    from test_grading import reference_all_reduce

    pth = Path(site.getsitepackages()[0]) / f"zz_distlab_test_{os.getpid()}.pth"
    targets = [("open", str(pth)), ("open", str(tmp_path / "json.py")), ("move", str(tmp_path / "moved.txt"))]
    if confine.available():  # C++ opens no audit hook sees: only the kernel refuses them
        targets.append(("save", str(tmp_path / "saved.pth")))
    honest = inspect.getsource(reference_all_reduce).replace("def reference_all_reduce(", "def _honest(")
    try:
        graded = _grade(WRITE_AROUND.format(targets=targets, honest=honest), (str(SOLUTIONS),))
    finally:
        written = [path for _, path in targets if os.path.exists(path)]
        pth.unlink(missing_ok=True)
    assert written == []
    assert all(passed for _, passed, _ in graded), graded  # writing in its own folder works


DISK_BOMBS = {  # what each does, and what its feedback must say
    "one file past the limit": ("with open(os.path.join(tempfile.gettempdir(), 'big'), 'wb') as f:\n"
                                "        for _ in range(400):\n            f.write(bytes(1 << 20))",
                                "File too large"),
    "many files under the limit": ("for i in range(40):\n"
                                   "        with open(os.path.join(tempfile.gettempdir(), f'f{i}'), 'wb') as f:\n"
                                   "            for _ in range(200):\n                f.write(b'x' * (1 << 20))",
                                   "the rank kept more than 256 MB of files in its temporary folder"),
    "shared memory": (f"torch.save(torch.ones(1000), '/dev/shm/distlab-bomb-{os.getpid()}')",
                      "Permission denied" if confine.available() else "write outside their temporary folder"),
}


@pytest.mark.slow
def test_a_submission_that_fills_the_disk_or_shared_memory_fails_in_its_rank() -> None:
    """Files are the other way to take the instructor's machine down: /dev/shm is memory that no
    limit on the rank counts and that outlives it, and /tmp may be memory too. A grading rank
    writes at most 256 MB to a file and keeps at most 256 MB in its folder; /dev/shm is shut."""
    for name, (attack, said) in DISK_BOMBS.items():
        source = f"import os, tempfile, torch\ndef all_reduce_rs_ag(tensor, op=None, group=None):\n    {attack}\n"
        graded = _grade(source + "    raise RuntimeError('ESCAPED')\n", ())
        assert not any(passed for _, passed, _ in graded), name
        assert said in graded[0][2] and "ESCAPED" not in graded[0][2], (name, graded[0][2])
    assert not os.path.exists(f"/dev/shm/distlab-bomb-{os.getpid()}")


MEMORY_BOMB = """import torch
def all_reduce_rs_ag(tensor, op=None, group=None):
    hoard = torch.ones(3 << 30, dtype=torch.uint8)  # 3 GB, more than a grading rank may hold
    return tensor
"""


@pytest.mark.slow
def test_a_submission_that_hoards_memory_fails_in_its_rank_not_on_the_machine() -> None:
    graded = _grade(MEMORY_BOMB, ())
    assert not any(passed for _, passed, _ in graded)
    assert "memory" in graded[0][2].lower() and "at most 2 GB" in graded[0][2], graded[0][2]
    honest = _grade(MEMORY_BOMB.replace("3 << 30", "1 << 20"), ())  # 1 MB: the limit does not get in the way
    assert "memory" not in " ".join(message for _, _, message in honest).lower()
