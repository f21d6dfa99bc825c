"""Where am I? Rank, local rank, world size and rendezvous address from any launcher.

Each launcher exports its own variables; several sets are often present at once (srun with
PMI, mpiexec under a wrapper that also sets RANK/WORLD_SIZE, mpirun inside a SLURM job). The
launcher that really started the ranks wins: torchrun (its agent marks its workers), then the
MPI launchers, then srun, then plain RANK/WORLD_SIZE. Another set that names a different rank
or world size is reported, once per process.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

log = logging.getLogger("mcr")

# (launcher, rank, local rank, world size, local world size, marker that must also be present), most specific first.
_FAMILIES = [
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        None,
    ),
    ("jsrun", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_SIZE", None),
    (
        "mvapich2",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_SIZE",
        None,
    ),
    ("srun", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", None, "SLURM_STEP_ID"),
    ("cray-pals", "PMI_RANK", "PMI_LOCAL_RANK", "PMI_SIZE", "PMI_LOCAL_SIZE", "PALS_RANKID"),
    ("hydra", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS", None),  # MPICH, Intel MPI
    ("pmix", "PMIX_RANK", "PMIX_LOCAL_RANK", "PMIX_SIZE", "PMIX_LOCAL_SIZE", None),
    ("env", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", None),
]

# Variables that mean "an MPI library started this process as part of a world" (PMI/PMIx wire-up).
_MPI_WORLD_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "JSM_NAMESPACE_SIZE")

# Job ids, for a rendezvous port when the job script gave none (the scripts use the same rule).
_JOB_ID_VARS = ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "COBALT_JOBID")
_reported: set = set()


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


def port_for_job(job_id: str) -> int:
    """A rendezvous port from the job id: jobs sharing a node do not collide (launch/scripts.py writes the same)."""
    return 20000 + int(job_id.split(".")[0]) % 20000


def slurm_tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """SLURM's compressed counts, "8(x2),4" = 8, 8, 4 tasks on nodes 0, 1, 2."""
    counts = []
    for part in tasks_per_node.split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts[min(node_id, len(counts) - 1)]


def _first_host_of_slurm_nodelist(nodelist: str) -> str:
    # "node[01-04,07],gpu2" -> "node01"
    head = nodelist.split(",")[0] if "[" not in nodelist.split(",")[0] else nodelist
    if "[" in head:
        prefix, rest = head.split("[", 1)
        first = rest.split(",")[0].split("-")[0].rstrip("]")
        return prefix + first
    return head


def _first_line(path: str, skip: int = 0) -> str | None:
    with open(path) as f:
        hosts = [line.strip() for line in f if line.strip()]
    return hosts[min(skip, len(hosts) - 1)] if hosts else None


def _master_addr_from_env(env) -> str | None:
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    for var in ("LSB_DJOB_RANKFILE", "LSB_DJOB_HOSTFILE"):
        if env.get(var) and os.path.exists(env[var]):
            return _first_line(env[var], skip=1)  # line 1 is the launch node, which runs no ranks
    if env.get("LSB_HOSTS"):
        hosts = env["LSB_HOSTS"].split()
        return hosts[1] if len(hosts) > 1 else hosts[0]
    if env.get("SLURM_JOB_NODELIST"):
        return _first_host_of_slurm_nodelist(env["SLURM_JOB_NODELIST"])
    for var in ("PBS_NODEFILE", "COBALT_NODEFILE"):
        if env.get(var) and os.path.exists(env[var]):
            return _first_line(env[var])
    return None


def _claims(env) -> list[tuple]:
    """(launcher, rank, local rank or None, world, local world or None) of every family present."""
    found = []
    for name, rank_var, local_var, size_var, local_size_var, marker in _FAMILIES:
        if name == "srun" and "SLURM_STEP_NUM_TASKS" not in env:
            size_var = "SLURM_NTASKS"
        if rank_var not in env or size_var not in env or (marker and marker not in env):
            continue
        local = int(env[local_var]) if env.get(local_var) else None
        local_size = int(env[local_size_var]) if local_size_var and env.get(local_size_var) else None
        if name == "srun":
            per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
            if per_node:
                local_size = slurm_tasks_on_node(per_node, int(env.get("SLURM_NODEID", "0")))
        found.append((name, int(env[rank_var]), local, int(env[size_var]), local_size))
    return found


def _winner(claims: list[tuple]) -> tuple:
    mpi_sizes = {c[3] for c in claims if c[0] not in ("torchrun", "srun", "env")}
    for claim in claims:
        # srun also launches the daemons of an mpirun inside a SLURM job: its step then holds
        # one task per node, not the ranks, and the MPI launcher's variables are the truth.
        if claim[0] == "srun" and mpi_sizes and claim[3] not in mpi_sizes:
            continue
        return claim
    return ("single", 0, 0, 1, 1)


def _report_disagreements(winner: tuple, claims: list[tuple]) -> None:
    for claim in claims:
        if claim[0] == winner[0] or (claim[0] == "srun" and claim[3] != winner[3]):
            continue
        if (claim[1], claim[3]) != (winner[1], winner[3]):
            message = (
                f"mcr: launcher variables disagree: {winner[0]} says rank {winner[1]} of {winner[3]}, "
                f"{claim[0]} says rank {claim[1]} of {claim[3]}; using {winner[0]}, which started the ranks"
            )
            if message not in _reported:
                _reported.add(message)
                log.warning(message)


def discover(env=None) -> LaunchInfo:
    """Read the launcher's environment. A plain `python script.py` is a world of one."""
    env = os.environ if env is None else env
    claims = _claims(env)
    launcher, rank, local_rank, world, local_size = winner = _winner(claims)
    _report_disagreements(winner, claims)
    # A family that lacks the local view (srun --mpi=pmi2 sets PMI_RANK only) takes it from
    # another that agrees on rank and world size (srun's SLURM_LOCALID), else assumes full nodes.
    for other in claims:
        if (other[1], other[3]) == (rank, world):
            local_rank = local_rank if local_rank is not None else other[2]
            local_size = local_size if local_size is not None else other[4]
    local_size = local_size or world
    local_rank = local_rank if local_rank is not None else rank % local_size
    if launcher == "srun" and env.get("SLURM_MPI_TYPE") not in (None, "none"):
        launcher = f"srun --mpi={env['SLURM_MPI_TYPE']}"
    master = _master_addr_from_env(env)
    if master is None and world == 1:
        master = "127.0.0.1"
    port = env.get("MASTER_PORT")
    job_id = next((env[v] for v in _JOB_ID_VARS if env.get(v)), None)
    if not port and job_id and world > 1:
        port = port_for_job(job_id)
    return LaunchInfo(
        launcher=launcher,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_size,
        master_addr=master,
        master_port=int(port) if port else None,
        mpi_world=any(v in env for v in _MPI_WORLD_VARS),
    )


def from_torch(rank: int, world_size: int, store) -> LaunchInfo:
    """The place of a process that torch.distributed was told its rank and world size directly
    (`mp.spawn`, notebooks, torch's own test suite) and that no launcher started. The local view
    comes from the hostnames every rank publishes on torch's store; there is no MPI world."""
    hosts = hosts_by_rank(store, rank, world_size)
    mine = hosts[rank]
    return LaunchInfo(
        launcher="torch",
        rank=rank,
        local_rank=hosts[:rank].count(mine),
        world_size=world_size,
        local_world_size=hosts.count(mine),
        master_addr=None,  # the store torch already rendezvoused on serves every backend
        master_port=None,
        mpi_world=False,
    )


def hosts_by_rank(store, rank: int, world_size: int) -> list[str]:
    """Every rank's hostname, exchanged once over a torch store."""
    return by_rank(store, "host", rank, world_size, socket.gethostname())


def by_rank(store, key: str, rank: int, world_size: int, value: str) -> list[str]:
    """Every rank's `value` under `key`, exchanged once over a torch store (each rank sets its own key)."""
    store.set(f"{key}/{rank}", value)
    return [found.decode() for found in store.multi_get([f"{key}/{r}" for r in range(world_size)])]


def mpi_plugin_hint(env=None) -> str:
    """Why an MPI launcher's world came out as singletons, when srun started the ranks."""
    env = os.environ if env is None else env
    plugin = env.get("SLURM_MPI_TYPE")
    if not plugin:
        return ""
    return (
        f"; srun --mpi={plugin} started this rank, which this MPI library does not speak: "
        "Open MPI 5 needs srun --mpi=pmix (the pip wheel also PMIX_MCA_psec=native), "
        "MPICH and MVAPICH srun --mpi=pmi2 (srun --mpi=list shows the plugins)"
    )


def threads_per_rank(local_world_size: int, env=None) -> int:
    """The CPUs the job gave each rank (the job scripts export OMP_NUM_THREADS from cpus_per_task;
    srun sets SLURM_CPUS_PER_TASK), else this node's cores shared among its ranks."""
    env = os.environ if env is None else env
    for var in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
        if env.get(var, "").isdigit() and int(env[var]) > 0:
            return int(env[var])
    return max(1, (os.cpu_count() or 1) // max(1, local_world_size))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
