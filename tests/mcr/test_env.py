"""Rank, local rank, world size and rendezvous address from each launcher's variables, in
made-up multi-node jobs (2 nodes x 4 or 8 ranks); the rank checked sits on the second node."""

import logging
import os

import pytest

from mcr.env import discover, mpi_plugin_hint, port_for_job, slurm_tasks_on_node, threads_per_rank
from tests.ranks import run_script, under_hydra

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


@pytest.fixture
def nodefile(tmp_path):
    path = tmp_path / "nodes"
    path.write_text("node05\nnode05\nnode06\nnode06\n")
    return str(path)


def cases(nodefile):
    """name -> (environment, (launcher, rank, local rank, world, local world, master addr, port, mpi world))."""
    return {
        "torchrun": (
            {
                "TORCHELASTIC_RUN_ID": "j1",
                **{"RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"},
                **{"MASTER_ADDR": "n0", "MASTER_PORT": "1234"},
            },
            ("torchrun", 13, 5, 16, 8, "n0", 1234, False),
        ),
        "mpirun-cobalt": (
            {
                **{"OMPI_COMM_WORLD_RANK": "13", "OMPI_COMM_WORLD_LOCAL_RANK": "5"},
                **{"OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"},
                **{"COBALT_NODEFILE": nodefile, "COBALT_JOBID": "4711"},
            },
            ("openmpi", 13, 5, 16, 8, "node05", 24711, True),
        ),
        "jsrun-lsf": (
            {
                **{"JSM_NAMESPACE_RANK": "6", "JSM_NAMESPACE_LOCAL_RANK": "2"},
                **{"JSM_NAMESPACE_SIZE": "8", "JSM_NAMESPACE_LOCAL_SIZE": "4"},
                **{"LSB_HOSTS": "batch1 lassen7 lassen7 lassen7 lassen7 lassen8", "LSB_JOBID": "123456"},
            },
            ("jsrun", 6, 2, 8, 4, "lassen7", 20000 + 123456 % 20000, True),
        ),
        "mvapich2": (
            {
                **{"MV2_COMM_WORLD_RANK": "5", "MV2_COMM_WORLD_LOCAL_RANK": "1"},
                **{"MV2_COMM_WORLD_SIZE": "8", "MV2_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "m1"},
            },
            ("mvapich2", 5, 1, 8, 4, "m1", None, True),
        ),
        "srun-pmix": (
            {
                **{"SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"},
                **{"SLURM_STEP_NUM_TASKS": "16", "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_MPI_TYPE": "pmix"},
                **{"PMIX_RANK": "9", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "77"},
            },
            ("srun --mpi=pmix", 9, 1, 16, 8, "gpu07", 20077, True),
        ),
        # pmi2 gives PMI_RANK/PMI_SIZE but no local rank: before, rank 9 was "local rank 9 of 16"
        "srun-pmi2": (
            {
                **{"SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"},
                **{"SLURM_STEP_NUM_TASKS": "16", "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_MPI_TYPE": "pmi2"},
                **{"PMI_RANK": "9", "PMI_SIZE": "16", "SLURM_JOB_NODELIST": "gpu[07-08]", "MASTER_PORT": "2000"},
            },
            ("srun --mpi=pmi2", 9, 1, 16, 8, "gpu07", 2000, True),
        ),
        # uneven nodes: 6 tasks on node 0, 2 on node 1 (SLURM_TASKS_PER_NODE's "a,b" form)
        "srun-uneven": (
            {
                **{"SLURM_STEP_ID": "3", "SLURM_PROCID": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"},
                **{"SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "6,2", "SLURM_JOB_NODELIST": "cn1,cn2"},
                "SLURM_MPI_TYPE": "none",
            },
            ("srun", 7, 1, 8, 2, "cn1", None, False),
        ),
        "pbs-pals": (
            {
                **{"PALS_RANKID": "5", "PMI_RANK": "5", "PMI_LOCAL_RANK": "1", "PMI_SIZE": "8"},
                **{"PMI_LOCAL_SIZE": "4", "PBS_NODEFILE": nodefile, "PBS_JOBID": "9001.polaris-pbs-01"},
            },
            ("cray-pals", 5, 1, 8, 4, "node05", 29001, True),
        ),
        "mpich-hydra": (
            {"PMI_RANK": "6", "PMI_SIZE": "8", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4", "MASTER_ADDR": "h1"},
            ("hydra", 6, 2, 8, 4, "h1", None, True),
        ),
        "env": (
            {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "e1"},
            ("env", 5, 1, 8, 4, "e1", None, False),
        ),
        "single": ({}, ("single", 0, 0, 1, 1, "127.0.0.1", None, False)),
    }


@pytest.mark.parametrize(
    "name",
    [
        "torchrun",
        "mpirun-cobalt",
        "jsrun-lsf",
        "mvapich2",
        "srun-pmix",
        "srun-pmi2",
        "srun-uneven",
        "pbs-pals",
        "mpich-hydra",
        "env",
        "single",
    ],
)
def test_discover_reads_each_launcher(name, nodefile):
    env, expected = cases(nodefile)[name]
    info = discover(env)
    got = (info.launcher, info.rank, info.local_rank, info.world_size, info.local_world_size)
    assert got + (info.master_addr, info.master_port, info.mpi_world) == expected


def test_mpiexec_wins_over_a_wrappers_rank_and_world_size_and_the_disagreement_is_reported(caplog):
    env = {
        **{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "3"},
        **{"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
        **{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"},  # a wrapper's stale values
    }
    with caplog.at_level(logging.WARNING, logger="mcr"):
        info = discover(env)
    assert (info.launcher, info.rank, info.world_size) == ("openmpi", 3, 4)
    assert "openmpi says rank 3 of 4, env says rank 0 of 1; using openmpi" in caplog.text


def test_agreeing_launchers_are_not_reported(caplog):
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "RANK": "1", "WORLD_SIZE": "2"}
    with caplog.at_level(logging.WARNING, logger="mcr"):
        assert discover(env).launcher == "openmpi"
    assert "disagree" not in caplog.text


def test_mpirun_inside_a_slurm_job_is_not_mistaken_for_srun(caplog):
    # Open MPI's mpirun starts its daemons with srun (one task per node): the ranks inherit that
    # step's SLURM_PROCID, which names the node, not the rank.
    env = {
        **{"OMPI_COMM_WORLD_RANK": "13", "OMPI_COMM_WORLD_LOCAL_RANK": "5"},
        **{"OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"},
        **{"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "2"},
        "SLURM_JOB_NODELIST": "a[1-2]",
    }
    with caplog.at_level(logging.WARNING, logger="mcr"):
        info = discover(env)
    assert (info.launcher, info.rank, info.local_rank, info.local_world_size) == ("openmpi", 13, 5, 8)
    assert "disagree" not in caplog.text


def test_slurm_tasks_per_node_forms():
    assert [slurm_tasks_on_node("8(x2)", n) for n in (0, 1)] == [8, 8]
    assert [slurm_tasks_on_node("4(x2),2,3(x3)", n) for n in range(6)] == [4, 4, 2, 3, 3, 3]


def test_lsf_rankfile_skips_the_launch_node(tmp_path):
    rankfile = tmp_path / "ranks"
    rankfile.write_text("launchnode\nlassen12\nlassen12\nlassen13\n")
    info = discover({"JSM_NAMESPACE_RANK": "0", "JSM_NAMESPACE_SIZE": "3", "LSB_DJOB_RANKFILE": str(rankfile)})
    assert info.master_addr == "lassen12"


def test_port_from_the_job_id_matches_the_job_scripts_rule():
    assert port_for_job("123") == 20123 and port_for_job("45678.pbs") == 25678


def test_plugin_hint_names_the_srun_plugin_to_use():
    hint = mpi_plugin_hint({"SLURM_MPI_TYPE": "pmi2"})
    assert "srun --mpi=pmi2 started this rank" in hint and "Open MPI 5 needs srun --mpi=pmix" in hint
    assert mpi_plugin_hint({}) == ""


def test_threads_come_from_the_cpus_the_job_gave_each_rank():
    assert threads_per_rank(8, {"OMP_NUM_THREADS": "6"}) == 6
    assert threads_per_rank(8, {"SLURM_CPUS_PER_TASK": "5"}) == 5
    assert threads_per_rank(1, {}) >= 1


# mpiexec's name in the refusal; Open MPI's would end the job when the first rank exits, maybe before
# the other has printed its refusal: its knob lets each rank run to its own end. Hydra (MPICH,
# Intel MPI) needs none: a rank exiting through MPI_Finalize waits there for the others, and only
# one that aborts, or that started MPI and exits without MPI_Finalize, gets the others killed.
MPIEXEC_NAME = "hydra" if under_hydra() else "openmpi"
KEEP_GOING = {"PRTE_MCA_state_base_error_non_zero_exit": "0"}


def refused(rank: int) -> str:
    return (
        f"RuntimeError: mcr.init: rank {rank} of 2 (launcher {MPIEXEC_NAME}) has no rendezvous address; "
        "mpi is unavailable (not in the configured backends list)"
    )


def test_an_mpi_launch_without_mpi_in_the_backends_says_why_it_has_no_rendezvous():
    # under mpiexec the rendezvous address travels over MPI; with gloo alone there is none to use
    probe = os.path.join(os.path.dirname(__file__), "..", "launch", "probe.py")
    result = run_script(2, probe, "backends=gloo", timeout=120, env=KEEP_GOING)
    for rank in (0, 1):
        assert refused(rank) in result.output, result.output[-2000:]
    assert "probe: rank" not in result.output, result.output[-2000:]  # neither went on


def test_a_rank_refusing_with_mpi_up_ends_through_mpi_finalize_so_a_later_refusal_is_seen(tmp_path):
    # rank 1 refuses first and is on its way out; rank 0, refusing only then, must still be there
    # to say why: a refusal that aborted, or left MPI unfinalized, had Hydra kill it first
    result = run_script(2, os.path.join(SCRIPTS, "refuse.py"), tmp_path, timeout=240, env=KEEP_GOING)
    for rank in (0, 1):
        assert refused(rank) in result.output, result.output[-2000:]
    assert "went on" not in result.output, result.output[-2000:]
    if MPIEXEC_NAME == "hydra":  # a rank's exit code 1 is the job's (Open MPI's knob makes it 0)
        assert result.returncode != 0, result.output[-2000:]
