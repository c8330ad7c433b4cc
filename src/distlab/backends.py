"""Which backend a pool uses, decided without initialising CUDA in the kernel.

The kernel must stay CUDA-free (the launcher forks ranks, and a CUDA context does not survive a
fork), so GPUs are counted from the driver's /proc entries or nvidia-smi, never through torch.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from distlab.errors import BackendUnavailable

BACKENDS = ("gloo", "nccl", "auto")


def visible_gpu_count() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else what the NVIDIA driver lists."""
    physical = _physical_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    entries = [e for e in visible.split(",") if e.strip()]
    count = 0
    for entry in entries:  # CUDA stops at the first invalid entry
        if entry.strip().lstrip("-").isdigit() and int(entry) < 0:
            break
        count += 1
    return min(count, physical)


@functools.cache
def _physical_gpus() -> int:
    """Counted once per process: every %%dist cell resolves its backend, and looking through
    PATH for nvidia-smi costs more than the rest of a cell's work in the kernel."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return 0
        return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    return 0


def resolve_backend(requested: str, world_size: int, gpus: int | None = None) -> str:
    """'auto' -> nccl when every rank can have its own GPU, else gloo; 'nccl' demands that."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}: choose gloo, nccl or auto")
    if gpus is None:
        gpus = visible_gpu_count() if requested != "gloo" else 0
    if requested == "gloo":
        return "gloo"
    if requested == "nccl":
        if gpus < world_size:
            raise BackendUnavailable.nccl_needs_gpus(world_size, gpus)
        return "nccl"
    return "nccl" if gpus >= world_size > 0 else "gloo"
