"""Which GPU each rank binds, and when (mcr.startup): the device before MPI starts, except under
jsrun with one GPU per rank, where Spectrum MPI's CUDA hook wants MPI first."""

from __future__ import annotations

from mcr.startup import binds_after_mpi

JSRUN = {"JSM_NAMESPACE_RANK": "0", "OMPI_COMM_WORLD_RANK": "0"}  # Spectrum sets both under jsrun


def test_jsrun_with_one_gpu_per_rank_binds_after_mpi_and_every_other_launch_before():
    assert binds_after_mpi(JSRUN, 1)  # one GPU per resource set: MPI_Init finds it current anyway
    assert not binds_after_mpi(JSRUN, 4)  # several: MPI_Init would set up CUDA on GPU 0 for every rank
    assert not binds_after_mpi(JSRUN, 0)  # no GPU: nothing to bind
    assert not binds_after_mpi({"OMPI_COMM_WORLD_RANK": "0"}, 1)  # Open MPI's mpirun: smcuda wants it first
    assert not binds_after_mpi({"SLURM_PROCID": "0"}, 1)
