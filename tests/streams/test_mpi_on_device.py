"""MPI on device memory beside NCCL, checked on the CPU tier (`tests.streams.cuda_model`): a
CUDA-aware MPI (the real Open MPI, MCR_MPI_CUDA_AWARE=true, reading the stand-in's CudaLike
tensors, which are CPU memory) and NCCL's model on 2 ranks. One run of scripts/mpi_on_device.py
serves the module; each test reads its scenario. tests/gpu/test_mpi_on_device.py checks on a
real GPU what one GPU can show (docs/testing.md)."""

import os

import pytest

from tests.ranks import run_script
from tests.streams import scenarios

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "mpi_on_device.py")
ENV = {"MCR_BACKENDS": "mpi,gloo,nccl", "MCR_MPI_CUDA_AWARE": "true"}


@pytest.fixture(scope="module")
def device():
    result = run_script(2, SCRIPT, env=ENV).check()
    return scenarios(result, "DEVICE")


def test_a_host_driven_ops_temporaries_are_made_before_its_ready_event(device):
    for rank in device("temporaries"):
        for async_op, ops in rank["results"].items():
            for op, (got, want) in ops.items():
                assert got == want, (async_op, op)
        # MPI reads memory at once, on the host: no kernel on it may still be queued
        assert [read for read in rank["reads"] if read[3]] == [], rank["reads"]
        # each temporary made by the caller on the issuing stream (so before its ready event)
        assert rank["temporaries"], "no temporary seen"
        assert {(e[1], e[3]) for e in rank["temporaries"]} == {("MainThread", rank["side"])}, rank["temporaries"]


def test_copy_out_runs_on_the_issuing_stream(device):
    for rank in device("copy_out"):
        for async_op, ops in rank["results"].items():
            for op, (got, want) in ops.items():
                assert got == want, (async_op, op)
        for async_op, touched in rank["touched"].items():
            assert touched and {stream for _, stream in touched} == {rank["side"]}, (async_op, touched)


def test_a_tensor_touched_off_its_allocation_stream_is_recorded_there(device):
    for rank in device("recorded"):
        for op, (got, want) in rank["results"].items():
            assert got == want, op
        assert sorted(rank["freed"]) == sorted(rank["names"]), f"not freed: {rank['freed']}"
        assert rank["freed"] == {name: [] for name in rank["names"]}, "touched off their stream unrecorded"


def test_an_op_from_a_side_stream_whose_input_is_freed_at_once_and_output_consumed_there(device):
    for rank in device("cross_stream"):
        got, want = rank["results"]
        assert got == want
        assert rank["again"] == [-7.0] * 6  # the freed input's next owner kept its values
        assert {stream for _, stream in rank["touched"]} == {rank["side"]}, rank["touched"]
        assert rank["input_freed"] == [[]] and rank["freed_after_the_call"], "freed before MPI had read it"
        assert rank["reads"] and all(read[3] == [] for read in rank["reads"]), rank["reads"]


def test_no_cuda_aware_mpi_op_starts_while_an_nccl_op_on_the_device_is_unfinished(device):
    for rank in device("nccl_then_mpi") + device("untracked"):  # NCCL ops tracked, or not (recorder off)
        got, want = rank["results"]
        assert got == want
        assert len(rank["calls"]) == 2 and all(call[3] == [] for call in rank["calls"]), rank["calls"]
    for rank in device("mpi_then_nccl"):
        assert rank["calls"] and all(call[3] == [] for call in rank["calls"]), rank["calls"]
        assert rank["launched"] == 1 and rank["before_mpi_returned"] == [], rank["before_mpi_returned"]
        for got, want in (rank["results"], rank["nccl"]):
            assert got == want


def test_running_cuda_aware_mpi_beside_nccl_is_an_explicit_option(device):
    rank0, rank1 = device("concurrent")
    # rank 0's NCCL launched while its all-gather was in flight (rank 1 joins it only after that)
    assert len(rank0["before_mpi_returned"]) == 1, rank0
    for rank in (rank0, rank1):
        for got, want in (rank["results"], rank["nccl"]):
            assert got == want


def test_a_blocking_nccl_all_reduce_beside_cuda_aware_mpi_makes_as_few_python_calls(device):
    # as test_a_blocking_nccl_all_reduce_makes_few_python_calls_in_mcr, in a job where the two take turns
    for rank in device("call_count"):
        assert rank["turns"]
        assert len(rank["calls"]) <= 12, rank["calls"]


def test_a_staged_call_reuses_its_ready_event_and_waits_for_it_on_its_own_thread(device):
    for rank in device("staged_waits"):
        assert rank["new_events"] == 1, rank  # the async call's done event; the ready events are reused
        assert rank["handed"] == [], "a wait was handed to the driver thread"
        assert {"MainThread", "mcr-mpi-worker"} <= set(rank["waited_on"]), rank["waited_on"]  # each waits itself
        got, want = rank["result"]
        assert got == want
