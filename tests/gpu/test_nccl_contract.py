"""What one GPU can show of the NCCL contract that tests/streams checks op by op on the CPU
(tests/gpu/scripts/nccl_contract.py): an async op returns torch's Work and torch's future; sends
and receives to itself as one group; NCCL ops captured into a CUDA graph and replayed while a
runtime thread reads the GPU ops (relaxed capture mode); gloo refused under capture. What one GPU
cannot show (a peer's pair communicator, DDP's overlap with a peer) stays with the CPU tier."""

import pytest

from tests.gpu.common import assert_checks, launch, needs_gpu

pytestmark = needs_gpu


@pytest.fixture(scope="module")
def run():
    return launch(1, "tests.gpu.scripts.nccl_contract", timeout=180)


def test_an_async_nccl_op_returns_torchs_work_and_future(run):
    assert_checks(run, "work", {0: 3})


def test_sends_and_receives_to_itself_run_as_nccl_groups(run):
    assert_checks(run, "p2p", {0: 3})


def test_nccl_ops_are_captured_and_replayed_and_no_runtime_thread_breaks_the_capture(run):
    assert_checks(run, "capture", {0: 4})
    assert "rank 0: gpu finalize OK" in run.output, run.output[-3000:]
