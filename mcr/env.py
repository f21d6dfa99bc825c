"""Where am I? Rank, local rank, world size and rendezvous address from any launcher.

Each launcher exports its own variables (see ../shared/STYLE.md); we read the first set that
is present so `init()` works the same under mpiexec, torchrun, srun and jsrun.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

# (launcher name, rank, local rank, world size, local world size) variable names, most specific first.
_LAUNCHER_VARS = [
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("jsrun", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_SIZE"),
    (
        "mvapich2",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
    ("mpich", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),
    ("pmix", "PMIX_RANK", "PMIX_LOCAL_RANK", "PMIX_SIZE", "PMIX_LOCAL_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"),
]

# Variables that mean "an MPI library started this process as part of a world" (PMI/PMIx wire-up).
_MPI_WORLD_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "JSM_NAMESPACE_SIZE")

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class LaunchInfo:
    launcher: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str | None  # None: let rank 0 publish it over MPI
    master_port: int | None
    mpi_world: bool  # the launcher wired up an MPI world

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def _first_int(value: str | None, default: int) -> int:
    if not value:
        return default
    # SLURM_NTASKS_PER_NODE may look like "4(x2)"
    return int(value.split("(")[0].split(",")[0])


def _first_host_of_slurm_nodelist(nodelist: str) -> str:
    # "node[01-04,07],gpu2" -> "node01"
    head = nodelist.split(",")[0] if "[" not in nodelist.split(",")[0] else nodelist
    if "[" in head:
        prefix, rest = head.split("[", 1)
        first = rest.split(",")[0].split("-")[0].rstrip("]")
        return prefix + first
    return head


def _master_addr_from_env(env) -> str | None:
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    if env.get("LSB_DJOB_RANKFILE") and os.path.exists(env["LSB_DJOB_RANKFILE"]):
        with open(env["LSB_DJOB_RANKFILE"]) as f:
            hosts = [line.strip() for line in f if line.strip()]
        if len(hosts) > 1:
            return hosts[1]  # line 1 is the launch node, which runs no ranks
    if env.get("LSB_HOSTS"):
        hosts = env["LSB_HOSTS"].split()
        return hosts[1] if len(hosts) > 1 else hosts[0]
    if env.get("SLURM_JOB_NODELIST"):
        return _first_host_of_slurm_nodelist(env["SLURM_JOB_NODELIST"])
    for var in ("PBS_NODEFILE", "COBALT_NODEFILE"):
        if env.get(var) and os.path.exists(env[var]):
            with open(env[var]) as f:
                return f.readline().strip()
    return None


def discover(env=None) -> LaunchInfo:
    """Read the launcher's environment. A plain `python script.py` is a world of one."""
    env = os.environ if env is None else env
    for name, rank_var, local_var, size_var, local_size_var in _LAUNCHER_VARS:
        if rank_var in env and size_var in env:
            world = _first_int(env[size_var], 1)
            local_size = _first_int(env.get(local_size_var), world)
            info_launcher = name
            break
    else:
        name, world, local_size = "single", 1, 1
        rank_var = local_var = None
        info_launcher = name
    rank = _first_int(env.get(rank_var), 0) if rank_var else 0
    local_rank = _first_int(env.get(local_var), rank % max(1, local_size)) if local_var else 0
    port = env.get("MASTER_PORT")
    mpi_world = any(v in env for v in _MPI_WORLD_VARS)
    master = _master_addr_from_env(env)
    if master is None and world == 1:
        master = "127.0.0.1"
    return LaunchInfo(
        launcher=info_launcher,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_size,
        master_addr=master,
        master_port=int(port) if port else None,
        mpi_world=mpi_world,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
