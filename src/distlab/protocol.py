"""The messages between the kernel, the launcher and the ranks, and the channel that carries them.

Messages are frozen dataclasses with a literal ``kind``. They are pickled, but decoded with an
unpickler that only builds the classes listed here, so a message can never smuggle in code. User
values (function arguments, results, pushed variables) travel as opaque ``bytes`` fields and are
unpickled only by the side that asked for them. Every connection starts with a mutual HMAC
handshake over a Unix socket in a private directory: a process that does not hold the key is
dropped before anything is unpickled.

Why not ``multiprocessing.connection``'s own authkey (``deliver_challenge``/``answer_challenge``):
they wait without a deadline, so one peer that connects and says nothing would stall the hub's
accept thread for every later rank; and the client cannot wait longer than the server, which ranks
need while the kernel is busy in a cell. The handshake here is the same HMAC challenge, both ways,
with a deadline on each side.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import select
import socket
from dataclasses import dataclass, field
from enum import Enum
from multiprocessing.connection import Connection
from typing import Literal, Union

HANDSHAKE_TIMEOUT = 5.0
CHALLENGE_WAIT = 120.0
LOST_AFTER = 10.0  # seconds of silence from a peer's host (not its program) before its TCP link is dropped
_MAGIC = b"DISTLAB1"


class FailureKind(Enum):
    """What kind of failure a ``RankFailure`` is, decided where it happened (never read from text)."""

    RAISED = "raised"          # code on the rank raised: the traceback says where
    CRASHED = "crashed"        # the rank process ended: ``exitcode`` says how
    FEEDBACK = "feedback"      # graded code failed a case: the message is the student's whole feedback
    NOT_LOADED = "not_loaded"  # the graded answer cell itself failed, so every part would


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank, as plain text that survives any process boundary."""

    rank: int
    exc_type: str
    message: str
    traceback: str = ""
    filename: str = ""
    lineno: int | None = None
    line: str = ""
    exitcode: int | None = None
    kind: FailureKind = FailureKind.RAISED


# kernel -> launcher
@dataclass(frozen=True)
class SpawnRanks:
    pool_id: str
    generation: int
    world_size: int
    backend: str
    ranks: tuple[int, ...]
    unreadable: tuple[str, ...] = ()  # folders the ranks shut out at birth (distlab.confine)
    memory_limit: int = 0  # bytes of data per rank, 0: no limit (distlab.confine)
    writes_confined: bool = False  # the ranks write only to a folder of their own (distlab.confine)
    write_quota: int = 0  # bytes a confined rank may keep in its folder, and write to one file (0: no limit)
    kind: Literal["spawn"] = "spawn"


@dataclass(frozen=True)
class KillGeneration:
    """Kill every rank of one pool generation, including ranks that have not connected yet."""

    pool_id: str
    generation: int
    kind: Literal["kill_generation"] = "kill_generation"


@dataclass(frozen=True)
class Shutdown:
    kind: Literal["shutdown"] = "shutdown"


# launcher -> kernel
@dataclass(frozen=True)
class LauncherHello:
    pid: int
    kind: Literal["launcher_hello"] = "launcher_hello"


@dataclass(frozen=True)
class RankExited:
    pool_id: str
    generation: int
    rank: int
    pid: int
    returncode: int
    reason: str = ""  # why the launcher ended it, when it did (WRITE_QUOTA_EXCEEDED)
    kind: Literal["exited"] = "exited"


WRITE_QUOTA_EXCEEDED = "write_quota"  # RankExited.reason: it kept more files than SpawnRanks.write_quota


def early_failure(pool_id: str, generation: int, rank: int, exc: BaseException) -> str:
    """The line a rank that fails before it reaches the kernel leaves in its launcher's log."""
    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"distlab: rank {rank} of {pool_id}/{generation} could not start: {why}\n"


def early_failures(log: str, pool_id: str, generation: int) -> list[str]:
    """What the ranks of one generation left in the launcher's log with :func:`early_failure`."""
    tag = f" of {pool_id}/{generation} could not start: "
    return [line.removeprefix("distlab: ").replace(f" of {pool_id}/{generation}", "", 1)
            for line in log.splitlines() if line.startswith("distlab: rank ") and tag in line]


# rank -> kernel
@dataclass(frozen=True)
class RankHello:
    pool_id: str
    generation: int
    rank: int
    pid: int
    node: str = ""  # a joined rank's host name (ranks forked here leave it empty)
    store: str = ""  # a joined rank 0's "address:port" of the TCPStore it listens on
    nccl_refusal: str = ""  # a joined rank asked for nccl on a node with too few GPUs: why
    kind: Literal["rank_hello"] = "rank_hello"


@dataclass(frozen=True)
class ControlHello:
    """A joined rank's second connection: the kernel's way to interrupt, inspect and end a rank it
    cannot signal (it runs on another host, started by srun or another launcher)."""

    pool_id: str
    generation: int
    rank: int
    kind: Literal["control_hello"] = "control_hello"


@dataclass(frozen=True)
class Rendezvous:
    """Sent to every joined rank once all have said hello: where rank 0's TCPStore listens, the
    backend every rank uses (gloo when some node has too few GPUs for nccl), and where the rank
    sits among the hosts. Only the kernel sees every host, so it counts the ranks on each: a
    launcher's own figures can be the allocation's, not the step's (srun --ntasks=3 in
    `salloc --ntasks-per-node=2` still says 2 per node on the node that runs 1)."""

    master_addr: str
    master_port: int
    backend: str
    node_rank: int = 0  # the host's place, hosts in order of their lowest rank (torchrun's GROUP_RANK)
    local_rank: int = 0  # the rank's place among the ranks on its host
    local_world_size: int = 1  # how many ranks its host runs
    kind: Literal["rendezvous"] = "rendezvous"


@dataclass(frozen=True)
class Control:
    """On the control connection: "interrupt" (SIGINT), "stack" (answer with Stack), "exit"."""

    action: str
    kind: Literal["control"] = "control"


@dataclass(frozen=True)
class Stack:
    text: str
    kind: Literal["stack"] = "stack"


@dataclass(frozen=True)
class RankReady:
    rank: int
    backend: str
    device: str
    error: str = ""
    kind: Literal["ready"] = "ready"


@dataclass(frozen=True)
class Output:
    rank: int
    stream: Literal["stdout", "stderr"]
    text: str
    kind: Literal["output"] = "output"


@dataclass(frozen=True)
class Display:
    rank: int
    data: dict[str, object]
    metadata: dict[str, object] = field(default_factory=dict)
    display_id: str | None = None  # the rank's own id: the kernel keeps one output per (rank, id)
    update: bool = False           # replace the output(s) shown with this id instead of adding one
    kind: Literal["display"] = "display"


@dataclass(frozen=True)
class Done:
    rank: int
    task: int
    failure: RankFailure | None = None
    value: bytes | None = None
    trace: bytes | None = None
    seconds: float = 0.0
    grouped: bool = True  # the rank still has its process group (False: the task destroyed it)
    kind: Literal["done"] = "done"


# kernel -> rank
@dataclass(frozen=True)
class KernelContext:
    """What a cell in the kernel would run with (distlab.follow)."""

    cwd: str = ""
    sys_path: tuple[str, ...] = ()  # the caller's import path, so its modules import on the rank too
    environ: tuple[tuple[str, str | None], ...] = ()  # variables the kernel changed: name, value (None: unset)
    autoreload: int = 0  # the kernel's %autoreload mode (0: off)
    aimported: tuple[str, ...] = ()  # the modules %aimport marked, which mode 1 reloads


@dataclass(frozen=True)
class RunCell:
    task: int
    source: str
    filename: str
    trace: bool = False
    context: KernelContext = KernelContext()
    kind: Literal["run_cell"] = "run_cell"


@dataclass(frozen=True)
class RunFunction:
    task: int
    payload: bytes  # cloudpickle of (fn, args, kwargs, code file names, source lines)
    trace: bool = False
    context: KernelContext = KernelContext()
    kind: Literal["run_function"] = "run_function"


@dataclass(frozen=True)
class Pull:
    task: int
    name: str
    kind: Literal["pull"] = "pull"


@dataclass(frozen=True)
class Push:
    task: int
    name: str
    payload: bytes
    context: KernelContext = KernelContext()
    kind: Literal["push"] = "push"


@dataclass(frozen=True)
class Regroup:
    """Every rank joins a fresh process group (a cell destroyed the old one, as scripts do)."""

    task: int
    round: int  # the same on every rank: names the new group's keys in the store
    kind: Literal["regroup"] = "regroup"


@dataclass(frozen=True)
class Stop:
    kind: Literal["stop"] = "stop"


@dataclass(frozen=True)
class Cancel:
    """The stop button was pressed during ``task``: sent just before the SIGINT (or the control
    connection's "interrupt"), so a rank the signal reached before the task did (it was still on
    its way, or the rank was not yet in the cell's code) can tell that the signal was for this
    task, and stop at once instead of running the cell until its grace runs out. A Cancel for a
    task the rank has finished is stale, and skipped."""

    task: int
    kind: Literal["cancel"] = "cancel"


Message = Union[
    SpawnRanks, KillGeneration, Shutdown, LauncherHello, RankExited, RankHello, RankReady,
    Output, Display, Done, RunCell, RunFunction, Pull, Push, Regroup, Stop, Cancel, ControlHello, Rendezvous,
    Control, Stack,
]
Task = Union[RunCell, RunFunction, Pull, Push, Regroup]

_ALLOWED = {cls.__name__: cls for cls in (
    RankFailure, KernelContext, FailureKind, SpawnRanks, KillGeneration, Shutdown, LauncherHello, RankExited, RankHello,
    RankReady, Output, Display, Done, RunCell, RunFunction, Pull, Push, Regroup, Stop, Cancel, ControlHello,
    Rendezvous, Control, Stack,
)}


class _MessageUnpickler(pickle.Unpickler):
    """Builds only distlab's message classes; anything else is refused."""

    def find_class(self, module: str, name: str) -> type:
        if module == __name__ and name in _ALLOWED:
            return _ALLOWED[name]
        raise pickle.UnpicklingError(f"refused to unpickle {module}.{name} in a distlab message")


def stack_file(folder: str, pool_id: str, generation: int, rank: int) -> str:
    """Where a local rank's faulthandler writes its stack: named in one place for the kernel (which
    reads it), the launcher (which lets a confined rank write it) and the rank."""
    return os.path.join(folder, f"{pool_id}-{generation}-{rank}.stack")


def encode(message: Message) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Message:
    return _MessageUnpickler(io.BytesIO(data)).load()  # type: ignore[no-any-return]


def send(conn: Connection, message: Message) -> None:
    conn.send_bytes(encode(message))


def recv(conn: Connection) -> Message:
    return decode(conn.recv_bytes())


def waiting(conn: Connection) -> bool:
    """Is a message (or the peer's end) waiting? ``conn.poll(0)`` answers the same but builds a
    selector each time, and the kernel and the ranks ask several times per cell."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class HandshakeFailed(ConnectionError):
    """The peer did not prove it holds the key (or did not answer in time)."""


def _mac(key: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


def _recv_within(conn: Connection, timeout: float, maxlength: int) -> bytes:
    if not conn.poll(timeout):
        raise HandshakeFailed("no handshake reply in time")
    try:
        return conn.recv_bytes(maxlength)
    except (OSError, EOFError) as exc:
        raise HandshakeFailed(str(exc)) from exc


def server_handshake(conn: Connection, key: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Kernel side: the client proves it holds ``key``, then we prove it back."""
    nonce = os.urandom(32)
    conn.send_bytes(_MAGIC + nonce)
    reply = _recv_within(conn, timeout, 64)
    if len(reply) != 64 or not hmac.compare_digest(reply[:32], _mac(key, b"client", nonce)):
        raise HandshakeFailed("wrong key")
    conn.send_bytes(_mac(key, b"server", reply[32:]))


def client_handshake(conn: Connection, key: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Launcher and rank side: answer the kernel's challenge and check its answer to ours."""
    challenge = _recv_within(conn, CHALLENGE_WAIT, 64)  # the kernel may be busy: be patient here
    if not challenge.startswith(_MAGIC) or len(challenge) != len(_MAGIC) + 32:
        raise HandshakeFailed("not a distlab hub")
    nonce = os.urandom(32)
    conn.send_bytes(_mac(key, b"client", challenge[len(_MAGIC):]) + nonce)
    answer = _recv_within(conn, timeout, 32)
    if not hmac.compare_digest(answer, _mac(key, b"server", nonce)):
        raise HandshakeFailed("the hub did not prove it holds the key")


def tune_tcp(sock: socket.socket) -> None:
    """Small messages go out at once, and a peer whose host stops answering is noticed.

    Why: a node that loses power or network sends no FIN, so without this a socket to it looks
    open for hours (TCP retries for about 15 minutes, and an idle socket never notices). With
    keepalive probes every second after 2 idle seconds and a user timeout for unanswered data, both
    ends see an error within about ``LOST_AFTER`` s: the kernel reports the rank lost, and the rank,
    cut off from its kernel, exits. A busy rank still answers: the peer's TCP stack acknowledges,
    not the program.
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    probes = {"TCP_KEEPIDLE": 2, "TCP_KEEPINTVL": 1, "TCP_KEEPCNT": int(LOST_AFTER) - 2,
              "TCP_USER_TIMEOUT": int(LOST_AFTER * 1000)}
    for name, value in probes.items():
        option = getattr(socket, name, None)  # Linux has them all; other systems some
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def connect(path: str, key: bytes) -> Connection:
    """Open an authenticated connection to the kernel's hub: a Unix socket path, or "host:port"
    for a rank on another machine (cluster mode)."""
    if path.startswith("/"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    else:
        host, _, port = path.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=CHALLENGE_WAIT)
        sock.settimeout(None)
        tune_tcp(sock)
    conn = Connection(sock.detach())
    try:
        client_handshake(conn, key)
    except BaseException:
        conn.close()
        raise
    return conn
