"""What one GPU can show of how mcr runs MPI on device memory (tests/gpu/scripts/mpi_on_device.py
at one rank); the CPU tier checks each rule op by op (tests/streams/test_mpi_on_device.py). The
CUDA-aware checks skip where this machine's MPI does not read device memory.

What one GPU cannot show: a blocking op's temporary made after its ready event (it is made on the
issuing stream after the host's wait, where that stream is idle: the race lasts microseconds)."""

import re

import pytest

from tests.gpu.common import assert_checks, launch, needs_gpu

pytestmark = needs_gpu


@pytest.fixture(scope="module")
def run():
    return launch(1, "tests.gpu.scripts.mpi_on_device", timeout=180)


def cuda_aware(run) -> None:
    found = re.search(r"rank 0: gpu mpi cuda_aware=(True|False): (.*)", run.output)
    assert found, f"the script never said whether MPI is CUDA-aware:\n{run.output[-3000:]}"
    if found.group(1) != "True":
        pytest.skip(f"this MPI is not CUDA-aware: {found.group(2)}")


def test_a_host_driven_ops_temporaries_are_made_before_its_ready_event(run):
    """Async scatter and list reduce-scatter while the default stream sleeps: fails a runtime that
    stacks or cats the list on the MPI worker (its default stream, after the ready event)."""
    cuda_aware(run)
    assert_checks(run, "temporaries", {0: 6})
