"""Two ranks sharing one GPU: every op on CUDA tensors through staged MPI, CUDA-aware MPI, gloo,
the runtime's choice and node:mpi+nccl, under stream races (tests/gpu/scripts/races.py says how
each race delays the stream a wrong runtime would depend on); dropped handles; NCCL refused on
the world; finalize. One launch (tests/gpu/scripts/ops.py) serves every test here.

Each op runs blocking under two races and async under three, in float32 and bfloat16, with data
distinct per rank, chunk and race, checked whole through the consumer's copy against values the
script computes from the seeds:

- late-producer: the issuing stream sleeps before the producer. Fails a runtime that hands the
  memory to MPI or gloo (or copies it to the host) without waiting for the work queued on the
  caller's current stream at issue, or that records that wait on another stream (the default
  one, idle here), or calls NCCL from a thread whose current stream is not the caller's.
- busy-default-stream: the default stream sleeps. Fails a runtime whose copy-back, AVG divide or
  copy-out runs on the default stream of the thread that completed the op (the progress,
  callbacks or MPI worker thread): the consumer on the caller's stream reads before it.
- wait-elsewhere: the op is issued on one stream, which then sleeps; another stream waits and
  consumes. Fails a wait() that orders the issuing stream instead of the current one, or none.
"""

from __future__ import annotations

import re

import pytest

from tests.gpu.common import (
    RACES_PER_OP,
    assert_checks,
    comm_log,
    fallbacks,
    families,
    launch,
    needs_gpu,
)

pytestmark = needs_gpu
FAMILIES = {"all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all"}
NODE_FAMILIES = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
NODE = "node:mpi+nccl"


def every_op(rank: int, nprocs: int = 2) -> int:
    """Checks per label of ops.py's `every_op`: per race, 3 all-reduces, broadcast, all-gather (one
    per rank), the tensor all-gather, scatter, 2 reduce-scatters, the list all-to-all (one per
    rank), 2 all_to_all_single, send/recv; reduce and gather (one per rank) at the root (the
    last rank); in 2 dtypes; 2 barriers; the 32 MiB AVG under every race."""
    g, root = nprocs, nprocs - 1
    per_race = 3 + 1 + g + 1 + 1 + 2 + g + 2 + (g > 1) + (1 + g) * (rank == root)
    return 2 * RACES_PER_OP * per_race + 2 + RACES_PER_OP


def node_aware_ops(nprocs: int = 2) -> int:
    """3 all-reduces, all-gather (one per rank), the tensor all-gather, 2 reduce-scatters, the
    list all-to-all (one per rank), 2 all_to_all_single; 2 dtypes, every race. Each op but the
    all-reduces adds 2 checks of NCCL's log (ops.py's `nccl_witnessed`)."""
    return 2 * RACES_PER_OP * (3 + nprocs + 1 + 2 + nprocs + 2 + 7 * 2)


@pytest.fixture(scope="module")
def run():
    return launch(2, "tests.gpu.scripts.ops", timeout=300)


def mpi_cuda_aware(run) -> tuple:
    """(whether the runtime handed this MPI device memory, what rank 0 said of it)."""
    found = re.search(r"rank 0: gpu mpi cuda_aware=(True|False): (.*)", run.output)
    assert found, f"rank 0 never said whether MPI is CUDA-aware:\n{run.output[-3000:]}"
    return found.group(1) == "True", found.group(2)


def test_every_op_through_staged_mpi_keeps_the_stream_rules(run):
    """backend="mpi/host": pinned host twins copied in on the caller's stream after the producer,
    MPI on the host, copies back and AVG's divide on the issuing stream. Besides the races, a
    staging that copied back on another stream, or freed a pinned twin whose copy was pending,
    fails here; an op that fell back to another backend shows in the comm log."""
    assert_checks(run, "mpi/host", {0: every_op(0), 1: every_op(1)})
    for rank in (0, 1):
        rows = comm_log(run.output, rank)
        assert families(rows, "mpi/host", 2) >= FAMILIES | {"send_recv"}, rows
    assert not fallbacks(run.output, "mpi/host", "mpi")


def test_every_op_through_cuda_aware_mpi_keeps_the_stream_rules(run):
    """backend="mpi" where the runtime decided this MPI reads device memory: MPI gets device
    pointers only once the issuing stream reached the op (a CUDA-aware MPI reading at issue
    reads POISON), and async collectives run on the worker, never libnbc on device memory."""
    aware, said = mpi_cuda_aware(run)
    if not aware:
        pytest.skip(f"this MPI is not CUDA-aware, so every CUDA tensor was staged: {said}")
    assert_checks(run, "mpi", {0: every_op(0), 1: every_op(1)})
    assert families(comm_log(run.output, 0), "mpi", 2) >= FAMILIES | {"send_recv"}
    assert not fallbacks(run.output, "mpi")


def test_every_op_through_gloo_keeps_the_stream_rules(run):
    """backend="gloo": the ops torch's gloo runs on CUDA tensors itself (ordered against the
    caller's stream by its own CUDA Works) and the ones the runtime stages for it."""
    assert_checks(run, "gloo", {0: every_op(0), 1: every_op(1)})
    for rank in (0, 1):
        assert families(comm_log(run.output, rank), "gloo", 2) >= FAMILIES | {"send_recv", "barrier"}
    assert not fallbacks(run.output, "gloo")


def test_the_runtime_choice_on_a_shared_gpu_never_picks_nccl_and_keeps_the_stream_rules(run):
    """backend=None: NCCL comes first in the built-in order on GPU, but the two ranks share the
    GPU ("Duplicate GPU detected"), so the world group has no NCCL communicator and the choice
    takes MPI; backend="nccl" there is a ValueError, not a hang or an NCCL error. Fails a runtime
    that opens NCCL on a group whose ranks share a GPU, or whose choice still names it there."""
    assert_checks(run, "auto", {0: every_op(0), 1: every_op(1)})
    assert_checks(run, "nccl refused", {0: 1, 1: 1})
    for rank in (0, 1):
        assert not families(comm_log(run.output, rank), "nccl", 2), comm_log(run.output, rank)


def test_node_aware_mpi_plus_nccl_hands_buffers_between_libraries_in_stream_order(run):
    """node:mpi+nccl on one node of 2 ranks: the intra-node phases on MPI, the inter-node phase on
    NCCL over 1-rank peer groups (each holds one GPU, so NCCL has them). All-gather writes on
    NCCL's stream and MPI reads it next (finding 1: MPI must wait for what NCCL queued);
    reduce-scatter and all-to-all hand MPI's result to NCCL; the all-reduce hands temporaries
    between two MPI phases. Not node:nccl+mpi: on one node its intra-node NCCL phase would put
    the two ranks sharing the GPU in one communicator; giving each rank a hostname of its own
    (unshare --uts) would change NCCL's own host hash too, so NCCL would stop seeing the shared
    GPU and the test would check that trick rather than the runtime.

    On one node the peer groups have one rank: NCCL's phase is a copy at most, the all-reduce
    has no inter-node phase, and a hand-off race is a coin toss (NCCL's 1-rank copy and MPI's
    read start together). So values passed whether the phase ran on NCCL, fell back to MPI
    unannounced, or ran on a stream MPI's next phase was not ordered after. NCCL's own log now
    holds each race of the other 7 ops to: NCCL calls on 1-rank communicators from the calling
    thread, on the caller's current stream (each phase is a blocking op; torch runs those there,
    so MPI's next phase, recorded on that stream, follows it). Breaks caught: an inter phase run
    off NCCL or skipped (no call); NCCL called from another thread; a blocking phase on NCCL's
    own stream (today's async path for blocking ops, issue 49 item 2). What one node cannot show:
    NCCL across ranks, and the all-reduce's NCCL phase."""
    assert_checks(run, NODE, {0: node_aware_ops(), 1: node_aware_ops()})
    for rank in (0, 1):
        assert families(comm_log(run.output, rank), NODE, 2) == NODE_FAMILIES, comm_log(run.output, rank)
    assert not fallbacks(run.output, NODE)


def test_dropped_async_ops_on_cuda_are_finished_before_a_later_blocking_op_returns(run):
    """An AVG all-reduce and an all-gather whose handles the caller drops, the all-gather's input
    freed at once, then a blocking all-reduce on the same backend: after it returns, the caller's
    stream sees the average (fails if the divide never runs, or runs on the default stream,
    which sleeps here) and the gathered inputs (fails if the runtime let go of the freed input,
    whose block the next allocation fills with -POISON before the op reads it)."""
    for backend in ("mpi/host", "gloo") + (("mpi",) if mpi_cuda_aware(run)[0] else ()):
        assert_checks(run, f"{backend} dropped", {0: 18, 1: 18})  # 3 rounds x 2 races x 3 results


def test_finalize_with_two_ranks_on_one_gpu_exits_cleanly(run):
    """After NCCL communicators on 1-rank groups, MPI and gloo on CUDA tensors: finalize() must
    not meet on NCCL over the world (two ranks on one GPU: "Duplicate GPU detected"), nor hang;
    both ranks get past it and the job exits 0."""
    for rank in (0, 1):
        assert f"rank {rank}: gpu finalize OK" in run.output, run.output[-3000:]
    assert run.returncode == 0, f"exit {run.returncode}:\n{run.output[-3000:]}"
