"""torch's ProcessGroupNCCL contract for NCCL ops through mcr, checked op by op on the CPU tier
(`tests.streams.cuda_model`: the CUDA calls recorded, NCCL's stream semantics modelled, the data
moved by real gloo ranks). One 2-rank run of scripts/nccl_contract.py serves the module; each test
reads its scenario. tests/gpu checks on a real GPU the rules one GPU can show (docs/testing.md)."""

import os

import pytest

from tests.ranks import run_script
from tests.streams import scenarios

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "nccl_contract.py")
HANG = os.path.join(os.path.dirname(__file__), "scripts", "nccl_hang.py")


@pytest.fixture(scope="module")
def contract():
    result = run_script(2, SCRIPT, launcher="torchrun", env={"MCR_BACKENDS": "gloo,nccl"}).check()
    return scenarios(result, "CONTRACT")


def test_a_blocking_nccl_all_reduce_runs_on_the_callers_stream_and_switches_waits_and_wakes_nothing(contract):
    for rank in contract("blocking"):
        assert rank["launches"] == [["launch", "allreduce", "default0", False, "nccl1"]]  # asyncOp false
        assert rank["waits"] == [] and rank["switches"] == [] and rank["stashed"] == []
        assert [s for s in rank["new_streams"] if s != ["new_stream", "default0"]] == []  # no side stream
        assert rank["events"] == 1  # the flight recorder's one event (on by default)
        assert rank["pokes"] == 0  # no thread woken
        assert rank["result"] == rank["want"]


def test_an_async_nccl_op_returns_torchs_work_whose_wait_orders_the_waiters_stream(contract):
    for rank in contract("async_wait"):
        assert rank["handle"] == "WorkModel"  # torch's own Work (the stand-in's WorkNCCL), not a wrapper
        assert rank["launches"] == [["launch", "allreduce", "nccl1-stream", True, "nccl1"]]
        (wait, release) = rank["at_wait"]
        assert wait[:2] == ["wait", "default0"] and release == ["release", "allreduce", "default0"]
        assert rank["result"] == rank["want"]


def test_avg_is_nccls_own_average_not_a_sum_and_a_divide(contract):
    for rank in contract("avg"):
        assert rank["reduce_ops"] == [["reduce_op", "allreduce", "avg"]]
        assert rank["result"] == rank["want"]


def test_a_blocking_op_after_an_async_one_on_the_same_communicator_waits_for_nothing_on_the_host(contract):
    for rank in contract("no_host_wait"):
        assert rank["between"] == []  # no host wait, query or cross-stream wait: NCCL's stream orders them
        assert rank["launches"] == [["launch", "allreduce", "default0", False, "nccl1"]]


def test_settling_a_ddp_future_never_makes_the_issuing_stream_wait(contract):
    for rank in contract("future_settled_aside"):
        assert rank["settled"]
        assert rank["compute_waits"] == [], "the issuing stream was made to wait for the op"
        assert rank["switches_to_compute"] == []
        assert rank["threads_on_compute"] == ["MainThread"]  # only the trainer's thread used its stream


def test_a_p2p_batch_is_one_nccl_group_on_the_groups_communicator(contract):
    for rank in contract("p2p_batch"):
        assert rank["works"] == 1
        assert rank["groups"] == [["group_start", "nccl1"], ["group_end", "nccl1", ["recv", "send"]]]
        assert [launch[2] for launch in rank["launches"]] == ["group", "group"]
        assert rank["communicators"] == []  # no communicator made for the pair
        assert rank["got"] == rank["want"]


def test_a_lone_send_and_receive_make_no_pair_communicator(contract):
    for rank in contract("lone_send"):
        assert rank["communicators"] == []
        assert rank["got"] == rank["want"]


def test_a_blocking_nccl_all_reduce_makes_few_python_calls_in_mcr(contract):
    # a CUDA tensor takes the api's fast path (no _check, Request, call, _call): 8 calls there;
    # the stand-in's CudaLike tensor takes the long way. Before the NCCL route: 40 calls.
    for rank in contract("call_count"):
        assert len(rank["calls"]) <= 12, rank["calls"]


def test_under_capture_nccl_ops_are_launched_only_and_no_runtime_thread_breaks_the_capture(contract):
    for rank in contract("capture"):
        assert rank["held_in_capture"] == 0  # never held, queried or timed
        assert rank["events_outside_the_graph"] == []
        assert rank["watchdog_looked_during_capture"]  # it read the op pending from before, relaxed
        assert rank["broken"] == []


def test_a_host_driven_library_under_capture_fails_naming_the_op_and_the_fix(contract):
    for rank in contract("capture"):
        assert "all_reduce on backend gloo" in rank["refused"] and "backend='nccl'" in rank["refused"]


def test_the_watchdog_ends_a_job_whose_nccl_op_never_runs_with_no_progress_thread():
    result = run_script(
        2, HANG, launcher="torchrun", env={"MCR_BACKENDS": "gloo,nccl", "MCR_WATCHDOG_TIMEOUT": "2"}, timeout=120
    )
    assert "NOT ENDED" not in result.output and result.returncode != 0
    for rank in (0, 1):
        assert f"mcr watchdog: rank {rank} has waited" in result.output
    assert "in all_reduce on backend nccl (16 bytes, group of 2 ranks)" in result.output


def test_groups_split_their_nccl_communicator_from_the_worlds_and_cpu_only_groups_get_none(contract):
    rank0, rank1 = contract("groups")
    for rank in (rank0, rank1):
        assert [e[0] for e in rank["made"]] == ["nccl_comm"] and rank["made"][0][2:] == [2, "nccl1"]  # split
        assert rank["on_split"]
        assert rank["cpu_made"] == [] and rank["cpu_result"] == [3.0, 3.0, 3.0]
        assert "made CPU-only" in rank["refused"] and "pass CPU tensors" in rank["refused"]
    assert [e[0] for e in rank0["alone"]] == ["nccl_comm"] and rank0["alone"][0][2:] == [1, "nccl1"]
    assert rank1["alone"] == [["nccl_nocolor_split", "nccl1"]]  # no member, but in the split


def test_fp8_reductions_are_refused_below_sm90_with_the_reason_and_fp8_moves_stay_on_nccl():
    env = {"MCR_BACKENDS": "gloo,nccl", "CUDA_MODEL_CAPABILITY": "8.0"}
    result = run_script(1, os.path.join(os.path.dirname(__file__), "scripts", "fp8.py"), launcher="torchrun", env=env)
    found = result.check().tagged("FP8")["0"]
    assert found["picked"] == {"all_reduce": "gloo", "broadcast": "nccl", "all_gather": "nccl"}
    assert found["asked_nccl"] == "gloo"
    assert "compute capability 9.0 or newer (this one: 8.0)" in found["rule"]
