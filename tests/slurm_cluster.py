"""A real two-node SLURM cluster on this machine, for the cluster tests (root only).

Debian's slurm-wlm and munge: munged and slurmctld run in the host's network namespace on a bridge
address; each node's slurmd runs in its own network namespace (a veth on the bridge, named ``dl0``
on the first node, like the bridge itself, and ``dlx2`` on the second, as nodes of a real cluster
may name one network differently: ``--iface 10.213.0.0/24`` fits the kernel and every rank),
with its own host name and /etc/hosts (``unshare --mount --uts``). Traffic stays on what this
module makes: the namespaces have no default route and the host forwards nothing, names resolve
from the nodes' /etc/hosts (resolv.conf points at 127.0.0.1, where nothing answers), and the only
addresses used are the bridge's own. Everything is stopped by pid and removed again, even when a
test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BRIDGE = "dl0"
SUBNET = "10.213.0"
HOST_ADDR = f"{SUBNET}.1"
NETWORK = f"{SUBNET}.0/24"
NODES = {"dlnode1": f"{SUBNET}.11", "dlnode2": f"{SUBNET}.12"}
NODE_IFACES = {"dlnode1": BRIDGE, "dlnode2": "dlx2"}  # one network, two names for it


# A cell that loops on all_reduces and leaves a file per rank once it is in the loop: faults are
# set off on that file, not after a guessed delay (tests and bench/bench_cluster.py share it).
LOOP_CELL = ("%%dist --timeout 120\nimport pathlib, time\nfor step in range(1200):\n    t = torch.ones(1)\n"
             "    dist.all_reduce(t)\n    if step == 0:\n        pathlib.Path(MARKS, f'running-{rank}').touch()\n"
             "    time.sleep(0.1)")


def when_every_rank_is_looping(marks: Path, fault: Callable[[], None]) -> threading.Thread:
    """Run ``fault`` once each rank has finished its first all_reduce of LOOP_CELL (a file says so)."""
    def wait_then_fault() -> None:
        deadline = time.monotonic() + 120
        while len(list(marks.glob("running-*"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        fault()

    thread = threading.Thread(target=wait_then_fault, daemon=True)
    thread.start()
    return thread


def skip_reason() -> str | None:
    """Why the cluster tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and the SLURM daemons)"
    missing = [tool for tool in ("slurmctld", "slurmd", "srun", "munged", "ip", "nsenter", "unshare")
               if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install slurm-wlm munge iproute2)"
    return None


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@dataclass
class SlurmCluster:
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="distlab-slurm-")))
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        """What a client command (srun, squeue, a kernel that runs srun) needs."""
        return {"SLURM_CONF": str(self.conf)}

    # --- up -----------------------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        try:
            self._network()
            self._munge()
            self._config()
            self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            for node in NODES:
                self._node(node)
            self._wait_idle(60.0)
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{HOST_ADDR}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for i, (node, address) in enumerate(NODES.items(), start=1):
            ns, outside = f"dl-{node}", f"dlv{i}"
            _run("ip", "netns", "add", ns)
            inside = NODE_IFACES[node]
            _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", ns)
            _run("ip", "link", "set", outside, "master", BRIDGE, "up")
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", inside)
            _run("ip", "-n", ns, "link", "set", inside, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        # every address also in its IPv4-mapped IPv6 form: torch's TCPStore looks its peers up that way
        names = {HOST_ADDR: socket.gethostname(), **{a: n for n, a in NODES.items()}}
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n::ffff:{a} {n}\n" for a, n in names.items())
        (self.root / "hosts").write_text(hosts)
        (self.root / "resolv.conf").write_text("nameserver 127.0.0.1\n")

    def _munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._daemon("munged", ["munged", "--foreground", f"--key-file={key}", f"--socket={munge / 'sock'}",
                                f"--pid-file={munge / 'pid'}", f"--log-file={munge / 'log'}",
                                f"--seed-file={munge / 'seed'}", "--force"])
        deadline = time.monotonic() + 10
        while not (munge / "sock").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("munged did not start: " + (munge / "log").read_text(errors="replace"))
            time.sleep(0.05)

    def _config(self) -> None:
        r = self.root
        nodes = "".join(f"NodeName={n} NodeAddr={a} CPUs=4 State=UNKNOWN\n" for n, a in NODES.items())
        self.conf.write_text(f"""\
ClusterName=distlab
SlurmctldHost={socket.gethostname()}({HOST_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r / 'munge' / 'sock'}
CredType=cred/munge
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r / 'slurmctld.log'}
SlurmdLogFile={r}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdTimeout=30
{nodes}PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")
        (r / "state").mkdir()

    def _node(self, node: str) -> None:
        r = self.root
        script = (f"hostname {node} && mount --bind {r / 'hosts'} /etc/hosts && "
                  f"mount --bind {r / 'resolv.conf'} /etc/resolv.conf && "
                  f"exec slurmd -D -N {node} -f {self.conf}")
        self._daemon(node, ["nsenter", f"--net=/run/netns/dl-{node}", "unshare", "--mount", "--uts",
                            "sh", "-c", script])

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")  # noqa: SIM115 - the daemon owns it
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.daemons[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=env, start_new_session=True)
        log.close()

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited: {self.logs()}")
            done = subprocess.run(["sinfo", "-h", "-o", "%n %t"], capture_output=True, text=True,
                                  env=dict(os.environ, **self.env()), timeout=10)
            out = done.stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            if set(states) == set(NODES) and all(s in ("idle", "mix", "alloc") for s in states.values()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the nodes did not come up: {out}\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)

    def tasks_on(self, node: str) -> list[int]:
        """Pids of processes left in a node's network namespace (slurmd itself excluded)."""
        done = subprocess.run(["ip", "netns", "pids", f"dl-{node}"], capture_output=True, text=True, timeout=10)
        slurmd = self.daemons[node].pid
        return [int(p) for p in done.stdout.split() if int(p) != slurmd]

    def joined_ranks_on(self, node: str) -> list[int]:
        """Pids of the node's rank processes (python -m distlab.join), found among its namespace's pids."""
        found = []
        for pid in self.tasks_on(node):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"distlab.join" in cmdline:
                found.append(pid)
        return found

    # --- faults -------------------------------------------------------------------------------
    def kill_tasks(self, node: str) -> None:
        """SIGKILL to everything the node runs but its slurmd (the step's processes and ranks)."""
        for pid in self.tasks_on(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def crash_node(self, node: str) -> None:
        """As if the machine lost power: SIGKILL to its slurmd and everything else it runs."""
        self.daemons[node].kill()
        self.daemons[node].wait()
        self.kill_tasks(node)

    def restart_node(self, node: str) -> None:
        """The machine is back: its slurmd starts again and registers with slurmctld."""
        self._node(node)
        self._wait_idle(90.0)

    def cut(self, node: str) -> None:
        """Unplug the node's cable: its link goes down, its processes keep running."""
        _run("ip", "-n", f"dl-{node}", "link", "set", NODE_IFACES[node], "down")

    def reconnect(self, node: str) -> None:
        _run("ip", "-n", f"dl-{node}", "link", "set", NODE_IFACES[node], "up")

    # --- down ---------------------------------------------------------------------------------
    def stop(self) -> None:
        for proc in reversed(list(self.daemons.values())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
        for node in NODES:
            left = subprocess.run(["ip", "netns", "pids", f"dl-{node}"], capture_output=True, text=True).stdout
            for pid in left.split():  # what the test itself started in the namespace, by pid
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", f"dl-{node}"], capture_output=True)
        for i in range(1, len(NODES) + 1):
            subprocess.run(["ip", "link", "del", f"dlv{i}"], capture_output=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
