"""What one GPU can show of how mcr runs MPI on device memory (tests/gpu/scripts/mpi_on_device.py
at one rank); the CPU tier checks each rule op by op (tests/streams/test_mpi_on_device.py). The
CUDA-aware checks skip where this machine's MPI does not read device memory.

What one GPU cannot show: a blocking op's temporary made after its ready event (it is made on the
issuing stream after the host's wait, where that stream is idle: the race lasts microseconds);
nor, for a staged op, an input the runtime freed too early (its copy to the host is queued on the
issuing stream before anything the caller makes next there)."""

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


def test_copy_out_runs_on_the_issuing_stream(run):
    """Async list all-gather and gather while the default stream sleeps: fails a runtime that
    copies the packed result out on the MPI worker (its default stream)."""
    cuda_aware(run)
    assert_checks(run, "copy-out", {0: 6})


def test_a_tensor_touched_off_its_allocation_stream_is_recorded_there(run):
    """A staged async AVG all-reduce from a side stream on a tensor made on the default stream,
    freed while its copy-back waits on the side stream: fails without record_stream (the new
    tensor of its size gets its block and the copy-back overwrites it). Any MPI."""
    assert_checks(run, "recorded", {0: 3})


def test_an_op_from_a_side_stream_whose_input_is_freed_at_once_and_output_consumed_there(run):
    """Staged, and CUDA-aware where MPI reads device memory: fails a runtime that lets the input's
    block go before the op read it, or copies out off the issuing stream."""
    found = re.search(r"rank 0: gpu mpi cuda_aware=(True|False)", run.output)
    assert found, run.output[-3000:]
    assert_checks(run, "cross-stream", {0: 6 if found.group(1) == "True" else 3})


def test_no_cuda_aware_mpi_op_starts_while_an_nccl_op_on_the_device_is_unfinished(run):
    """At one rank: NCCL's op behind a sleep, MPI's after it (and the other way round). Fails a
    runtime that starts MPI's call before the NCCL op ran, or launches NCCL while an MPI op issued
    before it is in flight. One GPU cannot show the deadlock itself (that needs peers), nor the
    concurrent option's overlap with a peer: the CPU tier shows those."""
    cuda_aware(run)
    assert_checks(run, "turns", {0: 12})
