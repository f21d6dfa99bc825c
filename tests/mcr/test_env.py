"""Rank, local rank, world size and rendezvous address from each launcher's variables."""

import pytest

from mcr.env import discover

CASES = {
    "torchrun": (
        {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "8",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "n0",
            "MASTER_PORT": "1234",
        },
        (3, 1, 8, 2, "n0", 1234, False),
    ),
    "openmpi": (
        {
            "OMPI_COMM_WORLD_RANK": "5",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        },
        (5, 1, 8, 4, None, None, True),
    ),
    "slurm": (
        {
            "SLURM_PROCID": "6",
            "SLURM_LOCALID": "2",
            "SLURM_NTASKS": "16",
            "SLURM_NTASKS_PER_NODE": "8(x2)",
            "SLURM_JOB_NODELIST": "gpu[07-08],login1",
        },
        (6, 2, 16, 8, "gpu07", None, False),
    ),
    "slurm-pmix": (
        {
            "SLURM_PROCID": "1",
            "SLURM_LOCALID": "1",
            "SLURM_NTASKS": "2",
            "PMIX_RANK": "1",
            "SLURM_JOB_NODELIST": "node1",
        },
        (1, 1, 2, 2, "node1", None, True),
    ),
    "jsrun": (
        {
            "JSM_NAMESPACE_RANK": "7",
            "JSM_NAMESPACE_LOCAL_RANK": "3",
            "JSM_NAMESPACE_SIZE": "8",
            "JSM_NAMESPACE_LOCAL_SIZE": "4",
            "LSB_HOSTS": "launch lassen1 lassen1",
        },
        (7, 3, 8, 4, "lassen1", None, True),
    ),
    "mpich": (
        {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
        (2, 0, 4, 1, None, None, True),
    ),
    "single": ({}, (0, 0, 1, 1, "127.0.0.1", None, False)),
}


@pytest.mark.parametrize("name", CASES)
def test_discover_reads_each_launcher(name):
    env, (rank, local_rank, world, local_world, addr, port, mpi_world) = CASES[name]
    info = discover(env)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (
        rank,
        local_rank,
        world,
        local_world,
    )
    assert (info.master_addr, info.master_port, info.mpi_world) == (addr, port, mpi_world)


def test_lsf_rankfile_skips_the_launch_node(tmp_path):
    rankfile = tmp_path / "ranks"
    rankfile.write_text("launchnode\nlassen12\nlassen12\nlassen13\n")
    info = discover({"JSM_NAMESPACE_RANK": "0", "JSM_NAMESPACE_SIZE": "3", "LSB_DJOB_RANKFILE": str(rankfile)})
    assert info.master_addr == "lassen12"


def test_theta_nodefile_gives_master(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("thetagpu05\nthetagpu06\n")
    info = discover({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "16", "COBALT_NODEFILE": str(nodefile)})
    assert info.master_addr == "thetagpu05"
