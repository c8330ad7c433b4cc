"""``python -m distlab.join``: one rank, started by any launcher on any host, joins a notebook's pool.

Why a command of its own: on a cluster the kernel cannot fork ranks on other machines. Whatever the
site uses to start processes there (``srun``, ``torchrun``, ``mpirun``, ``ssh``) starts this command
once per rank instead; it connects back to the kernel over TCP, proves it holds the pool's secret,
and then behaves exactly like a rank forked on a laptop.

Everything comes from the environment, never the command line (which ``ps`` shows to every user):

=====================  =====================================================================
DISTLAB_HUB            "address:port" the kernel listens on (``%dist_start --iface IFACE``)
DISTLAB_KEY_FILE       a file readable only by the user holding the pool's secret (hex), in
                       ~/.distlab or the kernel's DISTLAB_KEY_DIR (a folder the nodes share), or
DISTLAB_KEY            the secret itself, in the environment
DISTLAB_POOL           the pool's id and generation, "id:generation"
DISTLAB_BACKEND        gloo or nccl
DISTLAB_IFACE          the network interface the ranks use (GLOO_/NCCL_SOCKET_IFNAME), by name
                       or as a subnet ("10.1.0.0/16": each host uses its interface in it)
rank, world size       SLURM_PROCID / SLURM_NTASKS, else RANK / WORLD_SIZE (torchrun), else
                       OMPI_COMM_WORLD_RANK / _SIZE or PMI_RANK / PMI_SIZE (MPI launchers)
local rank             SLURM_LOCALID, LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, else
                       its place among the ranks on its host (the kernel counts them, and sets
                       LOCAL_WORLD_SIZE and GROUP_RANK from that count for every launcher)
=====================  =====================================================================
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import sys

from distlab.errors import PoolDied
from distlab.i18n import tr

_RANK_VARS = ("SLURM_PROCID", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_SIZE_VARS = ("SLURM_NTASKS", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_LOCAL_VARS = ("SLURM_LOCALID", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_LOCAL_SIZE_VARS = ("SLURM_NTASKS_PER_NODE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def _first(env: dict[str, str], names: tuple[str, ...], default: str | None = None) -> str:
    for name in names:
        value = env.get(name, "").split("(")[0].split(",")[0]  # SLURM_NTASKS_PER_NODE: "4(x2)"
        if value.strip().isdigit():
            return value.strip()
    if default is None:
        raise PoolDied(f"distlab.join: none of {', '.join(names)} is set: start it with srun, torchrun or mpirun")
    return default


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux); loopback when no name is given."""
    if not name:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
    return socket.inet_ntoa(packed[20:24])


def local_interface(spec: str) -> tuple[str, str]:
    """(name, IPv4 address) on this host of what ``--iface`` named: an interface ("ib0"), or a
    subnet ("10.1.0.0/16"), for clusters whose nodes name the same network differently (eth0
    on one, ens3 on another). Gloo needs each host's own name for it."""
    if "/" not in spec:
        try:
            return spec, interface_address(spec)
        except OSError:
            raise PoolDied(tr("--iface {spec}: {host} has no network interface {spec} with an IPv4 address; if the "
                              "nodes name it differently, give its subnet (--iface 10.1.0.0/16)",
                              spec=spec, host=socket.gethostname())) from None
    try:
        network = ipaddress.ip_network(spec, strict=False)
    except ValueError as exc:
        raise PoolDied(tr("--iface {spec}: neither an interface name nor a subnet ({why})", spec=spec, why=exc)) from None
    for _, name in socket.if_nameindex():
        try:
            address = interface_address(name)
        except OSError:  # no IPv4 address
            continue
        if ipaddress.ip_address(address) in network:
            return name, address
    raise PoolDied(tr("--iface {spec}: no network interface of {host} has an address in {spec}",
                      spec=spec, host=socket.gethostname()))


def read_key(env: dict[str, str]) -> bytes:
    path = env.get("DISTLAB_KEY_FILE")
    if path:
        try:
            with open(path) as handle:
                return bytes.fromhex(handle.read().strip())
        except FileNotFoundError:
            raise PoolDied(f"distlab.join on {socket.gethostname()}: the pool's key file {path} is not here. The "
                           f"kernel writes it in ~/.distlab, which every node must see: start JupyterLab from a "
                           f"home the nodes share, or set DISTLAB_KEY_DIR to a shared folder before "
                           f"%load_ext distlab") from None
    if env.get("DISTLAB_KEY"):
        return bytes.fromhex(env["DISTLAB_KEY"])
    raise PoolDied("distlab.join: neither DISTLAB_KEY_FILE nor DISTLAB_KEY is set")


def main(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    rank = int(_first(env, _RANK_VARS))
    world_size = int(_first(env, _SIZE_VARS))
    local_rank = int(_first(env, _LOCAL_VARS, "-1"))  # -1: the kernel places it
    local_world = int(_first(env, _LOCAL_SIZE_VARS, "0"))
    pool_id, _, generation = env["DISTLAB_POOL"].partition(":")
    iface, address = local_interface(env.get("DISTLAB_IFACE", ""))
    if iface:  # the interface the user named (this host's name for it), whatever the environment said
        os.environ["GLOO_SOCKET_IFNAME"] = iface
        os.environ["NCCL_SOCKET_IFNAME"] = iface
    store = None
    store_addr = ""
    if rank == 0:  # rank 0 hosts the TCPStore, on the ranks' interface only; the OS picks the port
        store = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        store.bind((address, 0))
        store.listen(256)
        store_addr = f"{address}:{store.getsockname()[1]}"
    from distlab.worker import RankSpec, rank_main

    spec = RankSpec(
        pool_id=pool_id, generation=int(generation), rank=rank, world_size=world_size,
        backend=env.get("DISTLAB_BACKEND", "gloo"), hub_path=env["DISTLAB_HUB"], key=read_key(env),
        store_port=0, joined=True, local_rank=local_rank, local_world_size=local_world,
        node=socket.gethostname(), store_addr=store_addr,
    )
    return rank_main(spec, store)


if __name__ == "__main__":
    sys.exit(main())
