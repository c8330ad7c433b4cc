"""One rank: join the process group, then run cells and functions sent by the kernel.

Runs in a process forked by the launcher. Every outcome goes back as a value (a ``Done`` message
with a failure or a result); the kernel decides what to raise. Cells run in one namespace that
persists for the life of the rank, like a notebook kernel's.
"""

from __future__ import annotations

import ast
import asyncio
import bdb
import dataclasses
import datetime
import faulthandler
import importlib
import inspect
import io
import linecache
import os
import pickle
import reprlib
import resource
import signal
import socket
import sys
import threading
import time
import tokenize
import traceback
import types
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import cloudpickle
import torch
import torch.distributed as dist

from distlab import codeship, follow, protocol, rank_display, rank_io, scripts
from distlab.errors import SubmissionFailed, TransferFailed
from distlab.i18n import tr
from distlab.protocol import (
    Done,
    FailureKind,
    Pull,
    Push,
    RankFailure,
    RankHello,
    RankReady,
    Regroup,
    RunCell,
    RunFunction,
    Stop,
)
from distlab.rank_display import RankDisplay
from distlab.rank_io import CapturedOutput

STORE_TIMEOUT = datetime.timedelta(seconds=120)


@dataclass(frozen=True)
class RankSpec:
    pool_id: str
    generation: int
    rank: int
    world_size: int
    backend: str
    hub_path: str  # a Unix socket path, or "host:port" for a rank that joined from another host
    key: bytes
    store_port: int
    scripts_port: int = 0  # MASTER_PORT for code that makes its own rendezvous (0: store_port)
    joined: bool = False  # started by an outside launcher (srun, ...), not forked by ours
    local_rank: int = -1  # -1: the same as rank (every rank on this machine)
    local_world_size: int = 0  # 0: world_size
    node: str = ""
    store_addr: str = ""  # a joined rank 0: the "address:port" its TCPStore listens on


class _ResultPickler(cloudpickle.Pickler):
    """Results come home on the CPU, so the kernel never has to initialise CUDA to read them; and,
    as cloudpickle does, classes and functions defined in cells come by value, because the
    kernel has no copy of them."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            return (_identity, (obj.detach().cpu(),))
        return super().reducer_override(obj)


def _identity(value: Any) -> Any:
    return value


def dumps_result(value: Any) -> bytes:
    buffer = io.BytesIO()
    _ResultPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


class Rank:
    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.pid = os.getpid()  # see _in_forked_child
        self.conn = protocol.connect(spec.hub_path, spec.key)
        self._lock = threading.Lock()
        self.send(RankHello(spec.pool_id, spec.generation, spec.rank, os.getpid(), spec.node, spec.store_addr,
                            self._nccl_refusal()))
        self.master_addr, self.master_port = "127.0.0.1", spec.store_port
        self.node_rank = 0  # which host, in order of their lowest rank (set by the rendezvous)
        if spec.joined:
            self._start_control()
        self.output = CapturedOutput(spec.rank, self.send)
        self._stack_file = open(self._stack_path(), "a+", errors="replace")  # noqa: SIM115 - lives as long as the rank
        if spec.joined:  # read back through this descriptor alone: no file left behind, even after a kill
            os.unlink(self._stack_file.name)
        faulthandler.register(signal.SIGUSR1, file=self._stack_file, all_threads=True)
        self.in_user_code = False
        self._looking_for_cancel = False  # see _begin_user_code
        self._signal_while_looking = False
        self._held: list[protocol.Message] = []  # read while looking for a Cancel, for serve()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task, self._rendezvous_calls = 0, 0  # which env:// rendezvous of which task (see _serve_env_rendezvous)
        self._given: dict[str, Any] = {}  # the names every rank starts with (set when it joins)
        self._rebound: dict[str, str] = {}  # the names given to every rank that a cell rebound, as last said
        self._follower = follow.Follower()  # the kernel's folder, import path and environment (distlab.follow)
        signal.signal(signal.SIGINT, self._on_interrupt)

    def join(self, store_socket: socket.socket | None) -> None:
        self.device = self._join(store_socket)
        self.namespace = self._namespace()

    @property
    def local_rank(self) -> int:
        return self.spec.rank if self.spec.local_rank < 0 else self.spec.local_rank

    def _nccl_refusal(self) -> str:
        """Why NCCL cannot work for this joined rank ("" if it can): NCCL refuses two ranks on one
        GPU, and only the node itself can count its GPUs. The kernel then moves every rank to gloo."""
        spec = self.spec
        if not spec.joined or spec.backend != "nccl":
            return ""
        gpus = torch.cuda.device_count()
        if self.local_rank < gpus:
            return ""
        return f"{spec.node}: {spec.local_world_size or spec.world_size} ranks, {gpus} GPUs"

    def _stack_path(self) -> str:
        spec = self.spec
        if spec.joined:  # the kernel's folder is on another host: keep it here, send it on request
            import tempfile

            return os.path.join(tempfile.gettempdir(), f"distlab-{os.getpid()}.stack")
        return protocol.stack_file(os.path.dirname(spec.hub_path), spec.pool_id, spec.generation, spec.rank)

    def _in_forked_child(self) -> bool:
        """True in a child a cell made with ``os.fork()``: it runs on, but is not this rank
        (see _end_forked_child). Asked of the OS, so a fork from C counts too."""
        return os.getpid() != self.pid

    def send(self, message: protocol.Message) -> None:
        if self._in_forked_child():  # a forked child must not write into its rank's channel
            return
        data = protocol.encode(message)
        with self._lock:
            self.conn.send_bytes(data)

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self.in_user_code:
            if self._looking_for_cancel:  # raising now could cut a message in half: say so instead
                self._signal_while_looking = True
                return
            raise KeyboardInterrupt

    def _begin_user_code(self, task: int) -> None:
        """From here the stop button's SIGINT raises KeyboardInterrupt in the cell. A signal that
        came earlier (the task was still on its way, or the rank was setting it up) was ignored,
        since it may have been meant for the task before: the kernel's Cancel, sent before the
        signal, says which task it was for. Without this look the rank would run the cell until
        the kernel's grace ran out and killed it, losing the rank's variables."""
        self._signal_while_looking = False
        self._looking_for_cancel = True
        self.in_user_code = True
        try:
            cancelled = False
            while protocol.waiting(self.conn):
                message = protocol.recv(self.conn)
                if isinstance(message, protocol.Cancel):
                    cancelled |= message.task == task
                else:
                    self._held.append(message)
        finally:
            self._looking_for_cancel = False
        if cancelled or self._signal_while_looking:
            raise KeyboardInterrupt

    def _start_control(self) -> None:
        """A joined rank cannot be signalled by the kernel: a second connection carries interrupts,
        stack requests and the order to exit, and its end (the kernel is gone) ends the rank."""
        spec = self.spec
        control = protocol.connect(spec.hub_path, spec.key)
        protocol.send(control, protocol.ControlHello(spec.pool_id, spec.generation, spec.rank))

        def listen() -> None:
            while True:
                try:
                    message = protocol.recv(control)
                except (EOFError, OSError):
                    os._exit(1)  # the kernel is gone: never outlive it
                if not isinstance(message, protocol.Control):
                    continue
                if message.action == "interrupt":
                    os.kill(os.getpid(), signal.SIGINT)
                elif message.action == "stack":
                    self._stack_file.seek(0)
                    self._stack_file.truncate()
                    faulthandler.dump_traceback(file=self._stack_file, all_threads=True)
                    self._stack_file.flush()
                    self._stack_file.seek(0)
                    protocol.send(control, protocol.Stack(self._stack_file.read()))
                elif message.action == "exit":
                    os._exit(1)

        threading.Thread(target=listen, name="distlab-control", daemon=True).start()

    def _rendezvous(self) -> None:
        """A joined rank learns where rank 0's TCPStore listens once every rank has said hello."""
        message = protocol.recv(self.conn)
        if not isinstance(message, protocol.Rendezvous):
            raise RuntimeError(f"expected the rendezvous, got {type(message).__name__}")
        self.master_addr, self.master_port = message.master_addr, message.master_port
        self.node_rank = message.node_rank
        # the launcher's local rank binds GPUs (SLURM_LOCALID), so it stays when there is one; the
        # kernel's count of ranks per host is the local world size (see protocol.Rendezvous)
        self.spec = dataclasses.replace(self.spec, backend=message.backend,  # gloo: see _nccl_refusal
                                        local_rank=self.spec.local_rank if self.spec.local_rank >= 0 else message.local_rank,
                                        local_world_size=message.local_world_size)

    def _join(self, store_socket: socket.socket | None) -> torch.device:
        spec = self.spec
        if spec.joined:
            self._rendezvous()
        spec = self.spec  # the rendezvous may have placed the rank and changed the backend
        local_rank, local_world = self.local_rank, spec.local_world_size or spec.world_size
        # what torchrun gives its workers, so code that reads them (or asks
        # dist.is_torchelastic_launched(), as Lightning and torchtitan do) finds a torchrun world
        # (on another host a real launcher, torchrun itself perhaps, may have set them: they stay)
        elastic = {"GROUP_RANK": str(self.node_rank),
                   "ROLE_RANK": str(spec.rank), "ROLE_WORLD_SIZE": str(spec.world_size), "ROLE_NAME": "default",
                   "TORCHELASTIC_RUN_ID": spec.pool_id, "TORCHELASTIC_RESTART_COUNT": "0",
                   "TORCHELASTIC_MAX_RESTARTS": "0"}
        for name, value in elastic.items():
            if not spec.joined or name not in os.environ:
                os.environ[name] = value
        os.environ.update({
            "RANK": str(spec.rank), "WORLD_SIZE": str(spec.world_size), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(spec.scripts_port or self.master_port),
        })
        torch.set_num_threads(threads_per_rank(local_world))
        if spec.backend == "nccl":
            gpus = torch.cuda.device_count()
            if local_rank >= gpus:  # NCCL refuses two ranks on one GPU: say so before it does
                from distlab.errors import BackendUnavailable

                refusal = BackendUnavailable.nccl_needs_gpus(local_world, gpus)
                raise BackendUnavailable(f"{spec.node}: {refusal}" if spec.node else str(refusal))
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        extra: dict[str, Any] = {"master_listen_fd": store_socket.fileno()} if store_socket is not None else {}
        store = dist.TCPStore(
            self.master_addr, self.master_port, spec.world_size, spec.rank == 0,
            STORE_TIMEOUT, wait_for_workers=False, **extra,
        )
        self.store = store
        bind: dict[str, Any] = {"device_id": device} if spec.backend == "nccl" else {}  # NCCL: no guessing which GPU
        dist.init_process_group(spec.backend, store=store, rank=spec.rank, world_size=spec.world_size, **bind)
        scripts.install(spec.rank, spec.world_size)
        self._serve_env_rendezvous(store)
        return device

    def _namespace(self) -> dict[str, Any]:
        module = types.ModuleType("__main__")
        sys.modules["__main__"] = module  # classes defined in cells pickle by reference to it
        namespace = module.__dict__
        self._given = {
            "rank": self.spec.rank, "world_size": self.spec.world_size,
            "local_rank": self.local_rank,
            "device": self.device, "torch": torch, "dist": dist,
            "display": RankDisplay(self.spec.rank, self.send, self.output),
        }
        namespace.update(self._given)
        rank_display.current_display = self._given["display"]
        rank_display.route_notebook_tools()
        return namespace

    def _restore_deleted_names(self) -> None:
        """``del rank`` (or a clean-up loop over ``globals()``) would leave every later cell without
        the names the kit promises; a name a cell deleted is back, with its true value, in the next."""
        for name, value in self._given.items():
            self.namespace.setdefault(name, value)

    # --- the loop -----------------------------------------------------------------------------
    def serve(self) -> None:
        self.send(RankReady(self.spec.rank, self.spec.backend, str(self.device)))
        while True:
            try:
                message = self._held.pop(0) if self._held else protocol.recv(self.conn)
            except (EOFError, OSError):
                return
            if isinstance(message, Stop):
                return
            if isinstance(message, protocol.Cancel):  # for a task that ended before its signal came
                continue
            self.send(self.run_task(message))  # type: ignore[arg-type]

    def run_task(self, task: protocol.Task) -> Done:
        started = time.perf_counter()
        value: bytes | None = None
        records: list[Any] | None = None
        failure = None
        self.output.repair()
        if rank_display.current_display is not None:
            rank_display.current_display.new_task()
        self._task, self._rendezvous_calls = task.task, 0
        try:
            if isinstance(task, (RunCell, RunFunction)) and task.trace:
                from distlab.trace import recording

                with recording() as records:
                    value = self._run(task)
            else:
                value = self._run(task)
        except SystemExit as exc:  # scripts end with sys.exit(0): that is success, anything else is not
            if self._in_forked_child():
                _end_forked_child(None, exc.code)
            if exc.code not in (0, None):
                failure = describe_failure(self.spec.rank, exc, getattr(task, "filename", ""))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back as a value
            failure = describe_failure(self.spec.rank, exc, getattr(task, "filename", ""))
        finally:
            self.in_user_code = False
        if self._in_forked_child():
            _end_forked_child(failure)
        if isinstance(task, RunCell):
            self._note_rebound_names()
            if failure is None:
                self._show_new_figures()
        self.output.sync()
        trace = pickle.dumps(records) if records is not None else None
        return Done(self.spec.rank, task.task, failure, value, trace, time.perf_counter() - started,
                    grouped=dist.is_initialized())

    def _note_rebound_names(self) -> None:
        """Scripts name their loop variable ``rank`` (``for rank in range(size): ...``): after such a
        cell ``rank`` is ``size - 1`` on every rank, and every later cell that reads it is wrong
        without a word. Say so once, where the name no longer holds the truth."""
        for name, truth in (("rank", self.spec.rank), ("world_size", self.spec.world_size)):
            if name not in self.namespace:
                continue
            value = self.namespace[name]
            if type(value) is int and value == truth:
                self._rebound.pop(name, None)
                continue
            shown = reprlib.repr(value)
            if self._rebound.get(name) != shown:
                self._rebound[name] = shown
                print(tr("distlab: this cell set {name} = {value} on rank {rank}, and later cells see that value. "
                         "dist.get_rank() and dist.get_world_size() always tell the truth.",
                         name=name, value=shown, rank=self.spec.rank), file=sys.stderr)

    def _run(self, task: protocol.Task) -> bytes | None:
        if isinstance(task, (RunCell, RunFunction, Push)):
            self._follow(task.context)
        if isinstance(task, RunCell):
            self._restore_deleted_names()
            try:
                self._run_cell(task.source, task.filename, task.task)
            finally:
                self._follower.after_task()
            return None
        if isinstance(task, RunFunction):
            fn, args, kwargs, files, sources = cloudpickle.loads(task.payload)
            codeship.restore(fn, files, sources)
            self._begin_user_code(task.task)
            result = fn(*args, **kwargs)
            self.in_user_code = False
            return self._result(result, tr("the function's result"))
        if isinstance(task, Pull):
            if task.name not in self.namespace:
                raise NameError(f"name {task.name!r} is not defined on rank {self.spec.rank}")
            return self._result(self.namespace[task.name], tr("the value of {name!r}", name=task.name))
        if isinstance(task, Push):
            self.namespace[task.name] = cloudpickle.loads(task.payload)
            return None
        if isinstance(task, Regroup):
            self._regroup(task.round)
            return None
        raise TypeError(f"unknown task {type(task).__name__}")

    def _follow(self, context: protocol.KernelContext) -> None:
        missing = self._follower.apply(context)
        if missing:  # another host without the kernel's folder: say so, once per change of folder
            print(tr("distlab: rank {rank} cannot enter the kernel's folder ({why}) and stays in {cwd}",
                     rank=self.spec.rank, why=missing, cwd=os.getcwd()), file=sys.stderr)

    @staticmethod
    def _result(value: Any, what: str) -> bytes:
        try:
            return dumps_result(value)
        except Exception as exc:  # noqa: BLE001 - a lock, a generator, an open file: the same news
            raise TransferFailed.to_kernel(what, exc) from None

    def _run_cell(self, source: str, filename: str, task: int) -> None:
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        tree, source = self._parse(source, filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not _ends_with_semicolon(source):
            last = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
        body = compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        self._event_loop()
        self._begin_user_code(task)
        self._finish(eval(body, self.namespace))  # eval, not exec: a cell with top-level await gives a coroutine
        if last is not None:
            value = self._finish(eval(compile(last, filename, "eval", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT),
                                      self.namespace))
            if value is not None:
                self.output.start_a_line()
                rank_display.show_value(value)
        self.in_user_code = False

    def _parse(self, source: str, filename: str) -> tuple[ast.Module, str]:
        """The cell's syntax tree, and the source it came from: a cell that is not Python but
        IPython (%timeit, !cmd) runs as IPython would run it, against a shell made for ranks."""
        try:
            return ast.parse(source, filename), source
        except SyntaxError as error:
            # imported by the first such cell, not by every cold start
            from distlab import rank_shell

            python = rank_shell.transform(source)
            if python is None:
                raise
            try:
                tree = ast.parse(python, filename)
            except SyntaxError as rewritten:
                raise _in_the_cell(rewritten, error, source, python) from None
            self.namespace.setdefault("get_ipython", rank_shell.RankShell(self.namespace, self.device).get_ipython)
            return tree, python

    def _finish(self, value: Any) -> Any:
        """``await`` at the top of a cell works as in a notebook: on one event loop that lives as
        long as the rank, so a task started in one cell can be awaited in the next."""
        if not inspect.iscoroutine(value):
            return value
        return self._event_loop().run_until_complete(value)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)  # again each cell: asyncio.run() in a cell unsets it when done
        return self._loop

    def _show_new_figures(self) -> None:
        if "matplotlib.pyplot" not in sys.modules:
            return
        from distlab.rank_backend import show

        show()

    def _serve_env_rendezvous(self, store: Any) -> None:
        """Code that makes its own rendezvous (``init_process_group()`` after destroying the group,
        ``rpc.init_rpc``) gets a fresh corner of the ranks' own store, on loopback, instead of
        starting a store server at MASTER_PORT on every interface. Ranks name the corner alike
        (this task's number, the how-many-th rendezvous of the task), so no keys are stale."""
        torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module, not dist.rendezvous()
        rank_self = self

        def handler(url: str, timeout: Any = None, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
            query = dict(part.split("=", 1) for part in urllib.parse.urlparse(url).query.split("&") if "=" in part)
            rank = int(query.get("rank", os.environ["RANK"]))
            world_size = int(query.get("world_size", os.environ["WORLD_SIZE"]))
            rank_self._rendezvous_calls += 1
            yield (dist.PrefixStore(f"scripts/{rank_self._task}/{rank_self._rendezvous_calls}", store), rank,
                   world_size)
            raise RuntimeError("Unable to perform re-rendezvous using env:// method")

        torch_rendezvous._rendezvous_handlers["env"] = handler

    def _regroup(self, round_: int) -> None:
        """Leave what is left of the old group and join a fresh one, with every other rank."""
        if dist.is_initialized():
            dist.destroy_process_group()
        store = dist.PrefixStore(f"regroup{round_}", self.store)
        bind: dict[str, Any] = {"device_id": self.device} if self.spec.backend == "nccl" else {}
        dist.init_process_group(self.spec.backend, store=store, rank=self.spec.rank, world_size=self.spec.world_size,
                                **bind)


# distlab's own frames, left out of a rank's traceback: the loop that runs the cell, and the stand-ins
# a cell calls without knowing (sys.stdin, display): the learner's line is the last frame they see
_WORKER_FILES = {__file__, scripts.__file__, rank_io.__file__, rank_display.__file__,
                 os.path.join(os.path.dirname(__file__), "trace.py")}


def _end_forked_child(failure: RankFailure | None, code: object = None) -> NoReturn:
    """A child a cell made with ``os.fork()`` ran the rest of the cell, as a script's child would.
    It ends here, as a script's child would at the end of the script, instead of going back to the
    rank's loop: it would answer for its rank, read its tasks and steal its output. What it printed
    went to its rank's pipes and is shown under the rank's label."""
    rank_io.flush_standard_streams()
    if failure is not None:
        os.write(2, failure.traceback.encode(errors="replace"))
        os._exit(1)
    if code is None or isinstance(code, int):
        os._exit((code or 0) & 0xFF)
    os.write(2, f"{code}\n".encode(errors="replace"))  # sys.exit("message") prints it, as Python does
    os._exit(1)


def describe_failure(rank: int, exc: BaseException, filename: str) -> RankFailure:
    """The exception as text, with distlab's own frames removed and the cell line picked out."""
    tb = exc.__traceback__
    if isinstance(exc, SyntaxError):  # the parser's own frames say nothing about the cell
        tb = None
    summary = traceback.TracebackException(type(exc), exc, tb)
    summary.stack = traceback.StackSummary.from_list(
        [frame for frame in summary.stack if frame.filename not in _WORKER_FILES])
    text = "".join(summary.format())
    lineno, line = None, ""
    for frame in traceback.extract_tb(tb):
        if frame.filename == filename:
            lineno, line = frame.lineno, frame.line or ""
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        lineno, line = exc.lineno, (exc.text or "")
    if any(sign in _safe_str(exc) for sign in _NO_GPU_SIGNS):
        text += tr("(This rank has no GPU to use. Code written for GPUs runs here on the CPU: use "
                   "init_process_group(\"gloo\") and the variable device, which every rank has (cpu here; "
                   "cuda:N with %%dist --backend nccl on a machine with a GPU per rank), instead of \"cuda\"; FSDP "
                   "takes device_id=device.)") + "\n"
    if "SyncBatchNorm expected input tensor to be on GPU" in _safe_str(exc):
        text += tr("(SyncBatchNorm runs on GPUs only. On CPU ranks keep BatchNorm, which normalises each rank's "
                   "own batch, or all_reduce the batch's sum and sum of squares yourself: that is all "
                   "SyncBatchNorm adds.)") + "\n"
    if "Too many open files" in _safe_str(exc):
        text += _open_files_hint()
    if isinstance(exc, SystemExit) and exc.code == 2 and any(
            frame.filename.endswith("argparse.py") and frame.name == "error" for frame in traceback.extract_tb(tb)):
        text += tr("(argparse read the command line, and a rank has none: launcher.py in the usage line is "
                   "distlab's. Give the arguments in the cell, p.parse_args([\"--lr\", \"0.1\"]), or set "
                   "sys.argv = [\"train.py\", \"--lr\", \"0.1\"] before parsing.)") + "\n"
    if isinstance(exc, bdb.BdbQuit):  # pdb read EOF from NoKeyboard and quit: say why, not bdb's frames alone
        text += tr("(A debugger cannot stop a rank: nobody can type to it, so breakpoint() and pdb quit at once. "
                   "Print the values you want to see, or copy them to the kernel with %dist_pull NAME and look "
                   "at them there.)") + "\n"
    kind = exc.failure_kind if isinstance(exc, SubmissionFailed) else FailureKind.RAISED
    return RankFailure(rank, type(exc).__name__, _safe_str(exc), text, filename, lineno, line, kind=kind)


def _open_files_hint() -> str:
    """A rank lives on from cell to cell, so a limit a cell lowered (or files it left open) makes
    every later cell fail with EMFILE, far from the line that caused it: say where to look."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return tr("(This rank may hold at most {limit} open files (RLIMIT_NOFILE), and the ranks live on from cell "
              "to cell: a cell that lowered that limit, or left files or sockets open, makes later cells fail "
              "here. Close what you opened, raise the limit with resource.setrlimit, or run %dist_restart for "
              "fresh ranks.)").format(limit=soft) + "\n"


# what torch says when code written for GPUs meets a machine (or a build) without them
_NO_GPU_SIGNS = ("doesn't have NCCL built in", "not compiled with CUDA enabled", "Found no NVIDIA driver",
                 "No CUDA GPUs are available", "NCCL is only supported with GPUs", "has no attribute '_cuda_",
                 "no accelerator device is detected")  # FSDP without device_id


def threads_per_rank(local_world: int) -> int:
    """torch's intra-op threads for one of ``local_world`` ranks on this host: what the user said
    (OMP_NUM_THREADS, or srun's --cpus-per-task), else a share of the CPUs this process may use
    (a container's or a job's cpuset, not the whole machine): 4 ranks on 8 cores run 2 threads
    each, not 8, and ranks in a 4-CPU container on a 64-core host do not run 16 each."""
    for name in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
        given = os.environ.get(name, "")
        if given.isdigit() and int(given) > 0:
            return int(given)
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        allowed = os.cpu_count() or 1
    return max(1, allowed // local_world)


def _in_the_cell(rewritten: SyntaxError, original: SyntaxError, source: str, python: str) -> SyntaxError:
    """The error to show when a cell is neither Python nor IPython. IPython rewrites a magic line
    into one line of Python, so the rewrite's error is on the learner's line (``%env`` on line 1
    is fine; ``print(files, %pwd)`` on line 5 is not): that line, in the learner's words. A rewrite
    that changed the number of lines (a cell magic) cannot be mapped back: Python's own error."""
    cell, ours = source.splitlines(), python.splitlines()
    line = rewritten.lineno or 0
    if len(cell) != len(ours) or not 0 < line <= len(cell):
        return original
    offset = rewritten.offset if cell[line - 1] == ours[line - 1] else None
    return SyntaxError(rewritten.msg, (original.filename, line, offset, cell[line - 1] + "\n"))


def _ends_with_semicolon(source: str) -> bool:
    """``x;`` at the end of a cell shows nothing, as in a notebook (``plt.plot(...);``)."""
    if ";" not in source:  # most cells: no need to tokenize them
        return False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    ignored = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT)
    meaningful = [t for t in tokens if t.type not in ignored]
    return bool(meaningful) and meaningful[-1].string == ";"


def _safe_str(exc: BaseException) -> str:
    """str(exc), even for an exception whose __str__ raises (which must not end the rank)."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001
        return "<exception str() failed>"




def rank_main(spec: RankSpec, store_socket: socket.socket | None) -> int:
    """Entry point in the forked child; returns the exit code."""
    try:
        rank = Rank(spec)
    except BaseException as exc:  # noqa: BLE001 - no channel to the kernel: the launcher log keeps why
        os.write(2, traceback.format_exc().encode())
        os.write(2, protocol.early_failure(spec.pool_id, spec.generation, spec.rank, exc).encode())
        return 1
    try:
        rank.join(store_socket)
    except BaseException:  # noqa: BLE001 - tell the kernel why this rank could not join, then exit
        rank.output.sync()
        rank.send(RankReady(spec.rank, rank.spec.backend, "", error=traceback.format_exc()))
        return 1
    if store_socket is not None:
        store_socket.close()
    try:
        rank.serve()
    finally:
        rank.output.sync()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - peers may already be gone at shutdown
                pass
    return 0
