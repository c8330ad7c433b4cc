"""Ranks on other hosts: how a pool asks SLURM (or the user's own launcher) to start them.

Why here and not in the launcher: on a laptop the kit's own launcher forks ranks next to the
kernel. On a cluster the hosts belong to the scheduler, so a pool hands the job to ``srun`` inside
the user's allocation (or prints the command for any other launcher), and every rank runs
``python -m distlab.join``, which connects back to the kernel over TCP on the interface the user
named. The secret travels in the environment and in a file only the user can read, never on a
command line.
"""

from __future__ import annotations

import atexit
import getpass
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from distlab.errors import PoolDied

LAUNCHERS = ("local", "slurm", "external")
_LIVE: set[ClusterLaunch] = set()  # srun processes of this kernel, stopped when it exits
_ENDING: list[threading.Thread] = []  # steps being ended in the background (see ClusterLaunch.stop)


def _term_with_parent() -> None:
    """In srun, before it starts: SIGTERM when the kernel dies, even by SIGKILL (Linux), so a
    request still pending is withdrawn and a running step ends."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@atexit.register
def _stop_all() -> None:
    for launch in list(_LIVE):
        launch.stop()
    for thread in list(_ENDING):
        thread.join(timeout=10.0)


# What a notebook chose with %dist_start: launcher, interface, extra srun options.
Settings = tuple[str, str, tuple[str, ...]]
LOCAL: Settings = ("local", "", ())


def launch_for(settings: Settings) -> ClusterLaunch | None:
    """A fresh launch for a pool with these settings (None: ranks forked next to the kernel)."""
    launcher, iface, srun_args = settings
    return None if launcher == "local" else ClusterLaunch(launcher, iface, srun_args)


def settings_of(launch: ClusterLaunch | None) -> Settings:
    return LOCAL if launch is None else (launch.launcher, launch.iface, launch.srun_args)


@dataclass(eq=False)
class ClusterLaunch:
    """How a pool's ranks are started when they do not run next to the kernel."""

    launcher: str  # "slurm" or "external"
    iface: str  # the network interface the ranks and the kernel share: a name, or a subnet
    srun_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    job_name: str = ""

    def address(self) -> str:
        """The kernel's address on ``iface``: the only address it listens on for ranks."""
        from distlab.join import local_interface

        return local_interface(self.iface)[1]

    def environment(self, hub: str, key: bytes, pool_id: str, generation: int, backend: str,
                    key_dir: str) -> dict[str, str]:
        key_file = Path(key_dir) / f"{pool_id}.key"
        key_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key.hex())
        return {"DISTLAB_HUB": hub, "DISTLAB_KEY_FILE": str(key_file), "DISTLAB_POOL": f"{pool_id}:{generation}",
                "DISTLAB_BACKEND": backend, "DISTLAB_IFACE": self.iface}

    def start(self, world_size: int, env: dict[str, str], log_path: str) -> str:
        """Start the ranks (slurm) or say how to (external); returns what to tell the user."""
        command = [sys.executable, "-m", "distlab.join"]
        if self.launcher == "external":
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            return (f"distlab: waiting for {world_size} ranks. Start this once per rank with your launcher "
                    f"(it reads its rank from SLURM_PROCID, RANK, OMPI_COMM_WORLD_RANK or PMI_RANK):\n"
                    f"  env {exports} {shlex.join(command)}")
        full = dict(os.environ)
        full.update(env)
        self.job_name = f"distlab-{env['DISTLAB_POOL'].replace(':', '-')}"  # one per generation
        # --export=ALL: a kernel in a job started with sbatch --export=NONE (or a list of names, as
        # JupyterHub's batchspawner does) inherits SLURM_EXPORT_ENV, and srun would start the ranks
        # without DISTLAB_*; an --export of the user's own comes later and wins
        srun = ["srun", f"--ntasks={world_size}", "--kill-on-bad-exit=1", "--unbuffered", "--export=ALL",
                f"--job-name={self.job_name}", *_share_the_allocation(self.srun_args), *self.srun_args, *command]
        with open(log_path, "ab") as log:
            try:
                self.process = subprocess.Popen(srun, env=full, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True,
                                                preexec_fn=_term_with_parent)
                _LIVE.add(self)
            except FileNotFoundError:
                raise PoolDied("srun was not found: run the notebook inside a SLURM allocation "
                               "(salloc, or a batch job), or use --launcher external") from None
        return ""

    def exited(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def stop(self, wait: bool = True) -> None:
        """End the job step on every node, and the job if srun asked SLURM for one itself.

        The ranks were told to exit on their control lines first, so srun usually ends by itself;
        if not, it gets SIGTERM (it passes that on to the tasks), then SIGKILL. ``scancel --name``
        then removes what srun may leave behind: a pending request, or an allocation it made.

        ``wait=False`` does this in the background: a failed cell reports at once and the next
        generation starts, instead of waiting seconds for srun (after a node is lost, srun waits
        for the step's end itself). Every generation has its own job name, so ending the old one
        never touches the new one; the kernel still waits for all of it when it exits.
        """
        process, self.process = self.process, None
        _LIVE.discard(self)
        if process is None:
            return
        if wait:
            _end(process, self.job_name)
            return
        ending = threading.Thread(target=_end, args=(process, self.job_name), name="distlab-end-step", daemon=True)
        ending.start()
        _ENDING[:] = [t for t in _ENDING if t.is_alive()] + [ending]

    def pending(self) -> str:
        """SLURM's word on a request that has not started: "job 12 pending (Resources)", or ""."""
        if not self.job_name or not shutil.which("squeue"):
            return ""
        done = subprocess.run(["squeue", "-h", f"--name={self.job_name}", "-t", "PD", "-o", "%i %r"],
                              capture_output=True, text=True, timeout=30)
        line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
        return f"job {line.split()[0]} pending ({' '.join(line.split()[1:])})" if line else ""

    def down(self, nodes: list[str]) -> str:
        """Which of ``nodes`` SLURM holds down, drained or unresponsive, with its reason:
        "node2 (Not responding)", or "". Asked only about the nodes the ranks ran on, so a
        large cluster's other broken nodes never show up here."""
        if not nodes or not shutil.which("sinfo"):
            return ""
        done = subprocess.run(["sinfo", "-h", "-R", "-n", ",".join(sorted(set(nodes))), "-o", "%n|%E"],
                              capture_output=True, text=True, timeout=30)
        found = sorted({tuple(line.split("|", 1)) for line in done.stdout.splitlines() if "|" in line})
        return ", ".join(f"{node} ({reason})" if reason else node for node, reason in found)


def _share_the_allocation(srun_args: tuple[str, ...]) -> list[str]:
    """``--overlap`` when the kernel runs inside an allocation. JupyterLab started with
    ``srun --pty`` holds the allocation's CPUs in a step of its own, and since Slurm 20.11 a step
    waits for CPUs another step holds: the ranks' step would wait for ever ("step creation
    temporarily disabled"). The same holds for a previous generation's step that is still ending.
    Not when the user asked for CPUs of the step's own (``--exclusive``) or said it already."""
    if not os.environ.get("SLURM_JOB_ID") or any(arg.startswith(("--overlap", "--exclusive")) for arg in srun_args):
        return []
    return ["--overlap"]


def _end(process: subprocess.Popen[bytes], job_name: str) -> None:
    """srun's own end if it comes within 3 s, else SIGTERM, then SIGKILL; then scancel by name."""
    try:
        process.wait(timeout=3.0)
    except subprocess.TimeoutExpired:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=3.0)
                break
            except subprocess.TimeoutExpired:
                continue
    if job_name and shutil.which("scancel"):
        subprocess.run(["scancel", "--quiet", f"--name={job_name}", f"--user={getpass.getuser()}"],
                       capture_output=True, timeout=30)
