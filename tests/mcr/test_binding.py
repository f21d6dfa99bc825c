"""Which GPU each rank binds, and when (mcr.startup): the device before MPI starts, except under
jsrun with one GPU per rank, where Spectrum MPI's CUDA hook wants MPI first; and what rank 0 says
of it at start-up (mcr.topology: each node's ranks and GPUs, shared GPUs, wrapped local ranks).
The GPU cases run on a GPU in tests/gpu/test_binding_said.py."""

from __future__ import annotations

import socket

import pytest

from mcr.config import ConfigError, load
from mcr.startup import binds_after_mpi
from mcr.topology import RankGPU, binding_problems, node_lines
from tests.ranks import run_script

JSRUN = {"JSM_NAMESPACE_RANK": "0", "OMPI_COMM_WORLD_RANK": "0"}  # Spectrum sets both under jsrun


def test_jsrun_with_one_gpu_per_rank_binds_after_mpi_and_every_other_launch_before():
    assert binds_after_mpi(JSRUN, 1)  # one GPU per resource set: MPI_Init finds it current anyway
    assert not binds_after_mpi(JSRUN, 4)  # several: MPI_Init would set up CUDA on GPU 0 for every rank
    assert not binds_after_mpi(JSRUN, 0)  # no GPU: nothing to bind
    assert not binds_after_mpi({"OMPI_COMM_WORLD_RANK": "0"}, 1)  # Open MPI's mpirun: smcuda wants it first
    assert not binds_after_mpi({"SLURM_PROCID": "0"}, 1)


# --- what rank 0 says of each node's ranks and GPUs (mcr.topology) -----------------------------
def gpu(uuid: str, index: int, local_rank: int, visible: int) -> RankGPU:
    return RankGPU(uuid, index, local_rank, visible)


def test_each_node_gets_one_line_naming_its_ranks_and_the_gpu_each_bound():
    hosts = ["n1", "n1", "n2", "n2"]
    gpus = [gpu("GPU-aaaa1111-x", 0, 0, 2), gpu("GPU-bbbb2222-x", 1, 1, 2), gpu("", -1, 0, 0), gpu("", -1, 1, 0)]
    assert node_lines(hosts, gpus) == [
        "mcr: node n1: rank 0 cuda:0 GPU-aaaa1111, rank 1 cuda:1 GPU-bbbb2222",
        "mcr: node n2: ranks 2, 3, no GPU",
    ]
    assert binding_problems(hosts, gpus) == []


def test_ranks_on_one_gpu_and_a_wrapped_local_rank_are_named_with_the_fix():
    hosts = ["n1"] * 3
    # 3 ranks, 2 GPUs seen by each: local rank 2 wraps to GPU 0, which rank 0 has
    gpus = [gpu("GPU-a", 0, 0, 2), gpu("GPU-b", 1, 1, 2), gpu("GPU-a", 0, 2, 2)]
    wrapped, shared = binding_problems(hosts, gpus)
    assert wrapped.startswith("rank 2 on node n1 has local rank 2 but sees 2 GPUs, so it took GPU 0 (local rank % 2)")
    assert shared.startswith("ranks 0 and 2 on node n1 SHARE GPU GPU-a: NCCL is dropped for every group holding both")
    assert "give each rank its own GPU" in shared


def test_one_gpu_per_rank_by_cuda_visible_devices_is_no_wrap_and_no_sharing():
    # Polaris' wrapper: each rank sees one GPU, its own; every local rank takes index 0
    gpus = [gpu(f"GPU-{r}", 0, r, 1) for r in range(4)]
    assert binding_problems(["n1"] * 4, gpus) == []
    assert RankGPU.parse(gpus[3].text()) == gpus[3]


def test_strict_binding_is_read_from_the_environment():
    assert load(env={"MCR_STRICT_BINDING": "1"}).strict_binding is True
    assert load(env={}).strict_binding is False
    with pytest.raises(ConfigError, match="bad value 'maybe' for MCR_STRICT_BINDING"):
        load(env={"MCR_STRICT_BINDING": "maybe"})


def test_rank_zero_says_each_nodes_ranks_and_gpus_at_start_up(tmp_path):
    script = tmp_path / "start.py"
    script.write_text("import mcr\nmcr.init()\nmcr.finalize()\n")
    result = run_script(2, str(script))
    result.check()
    host = socket.gethostname()
    assert result.output.count(f"mcr: node {host}: ranks 0, 1, no GPU") == 1, result.output  # rank 0 only
