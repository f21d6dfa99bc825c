"""Under jsrun with one GPU per rank (Lassen, Summit) the runtime starts MPI before it binds the
GPU (mcr.startup.binds_after_mpi): the rank still ends on that GPU, with MPI's CUDA check and NCCL
working on it. jsrun's variables are set by hand on one mpiexec rank (this machine has no LSF)."""

from __future__ import annotations

from tests.gpu.common import launch, needs_gpu

pytestmark = needs_gpu
JSRUN = {
    "JSM_NAMESPACE_RANK": "0",
    "JSM_NAMESPACE_SIZE": "1",
    "JSM_NAMESPACE_LOCAL_RANK": "0",
    "JSM_NAMESPACE_LOCAL_SIZE": "1",
    "CUDA_VISIBLE_DEVICES": "0",  # a resource set's one GPU
}


def test_a_jsrun_rank_with_one_gpu_binds_it_after_mpi_and_runs_mpi_and_nccl_on_it():
    result = launch(1, "tests.gpu.scripts.jsrun_rank", env=JSRUN, timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    assert "jsrun rank: no CUDA before init; bound cuda:0; mpi all-reduce ok; nccl all-reduce ok" in result.output
