"""One rank with the GPU to itself: NCCL runs every op (there is no peer for send/recv), chosen
by name and by the runtime, under the stream races of tests/gpu/scripts/races.py, in float32 and
bfloat16 (tests/gpu/scripts/nccl_solo.py).

NCCL orders itself against the stream current on the thread that calls it, at issue and at
wait. So the races fail a runtime that issues or waits on NCCL's Work from another thread (the
progress or callbacks thread, whose current stream is the default one): late-producer (NCCL
copies POISON when its stream waited on the wrong, idle stream), busy-default-stream (NCCL
waits on the sleeping default stream while the consumer is not ordered after it) and
wait-elsewhere (the consumer's stream never waits on NCCL's). On one rank an in-place op leaves
its tensor unchanged, so only the out-of-place ops (gathers, scatters, reduce-scatters,
all-to-alls) can show a race; the in-place ones are checked against NCCL's own log of each call
instead (tests/gpu/scripts/nccl_log.py).
"""

from __future__ import annotations

import re

import pytest

from tests.gpu.common import RACES_PER_OP, assert_checks, comm_log, launch, needs_gpu

pytestmark = needs_gpu
# every family but send/recv (no peer) and barrier (no tensor: chosen as on the host)
CUDA_FAMILIES = {"all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all"}


@pytest.fixture(scope="module")
def run():
    return launch(1, "tests.gpu.scripts.nccl_solo", timeout=180)


def test_every_op_on_nccl_alone_keeps_the_stream_rules_and_is_the_runtime_choice(run):
    """14 ops a race (3 all-reduces, reduce, broadcast, all-gather, the tensor all-gather, gather,
    scatter, 2 reduce-scatters, 3 all-to-alls), 2 dtypes, every race; 2 barriers; the 32 MiB AVG.
    The runtime's choice must be NCCL for every CUDA op (first in the built-in order on GPU): a
    CUDA op logged on MPI or gloo fails."""
    want = 2 * RACES_PER_OP * 14 + 2 + RACES_PER_OP
    for label in ("nccl", "auto"):
        assert_checks(run, label, {0: want})
    rows = comm_log(run.output, 0)
    assert {row[0] for row in rows if row[1] == "nccl"} >= CUDA_FAMILIES, rows
    elsewhere = [row for row in rows if row[0] in CUDA_FAMILIES and row[1] != "nccl"]
    assert not elsewhere, f"CUDA ops the runtime did not run on NCCL: {elsewhere}"
    assert "rank 0: gpu finalize OK" in run.output and run.returncode == 0, run.output[-3000:]


def test_in_place_ops_make_torchs_nccl_call_on_the_callers_thread_and_stream(run):
    """All-reduce SUM, AVG and MAX, reduce AVG and broadcast at one rank are identities: their
    values pass whether NCCL ran them, ran something else, or ran nothing. So each, in float32 and
    bfloat16, blocking and async, by name and by the runtime's choice, is held to NCCL's own log
    line of the call beside the line torch's own ProcessGroupNCCL makes for it on a copy of the
    same input: one NCCL call; the same function, count, datatype, reduce op and root; in place on
    the caller's tensor; from the calling thread; on the caller's current stream when blocking
    (torch with asyncOp false) and on another when async. 6 checks each, 20 ops a label.
    Breaks caught: AVG run as SUM then a divide (op 0, torch's is 4); a blocking op on the async
    path (NCCL's own stream, not the caller's: issue 49, item 2); an op issued from the progress
    or callbacks thread; a copy reduced instead of the caller's tensor; an op that skipped NCCL or
    ran on another backend (no line); a second NCCL call per op. The first check holds torch to
    the same stream rule, so a torch that changed it shows as such, not as mcr's failure."""
    for label in ("calls nccl", "calls auto"):
        assert_checks(run, label, {0: 2 * 5 * 2 * 6})


def test_an_nccl_op_the_gpu_has_not_run_stays_in_flight_and_unfinished_in_the_flight_record(run):
    """Finding 12: NCCL's wait never blocks the host, so a runtime that forgot a blocking NCCL op
    once it returned would let a hung one go unnamed by the watchdog and the flight recorder.
    Breaks caught: not holding blocking CUDA ops in flight; stamping the entry done at return."""
    assert_checks(run, "in-flight", {0: 4})


def test_finalize_shuts_nccl_down_as_torch_destroy_process_group_does(run):
    """Left to its destructor at exit, ProcessGroupNCCL warns that destroy_process_group() was not
    called (every gpu-check step printed it before NcclBackend.shutdown), and its watchdog once
    reported an 'unhandled system error' there."""
    assert "rank 0: gpu finalize OK" in run.output, run.output[-3000:]
    for sign in ("destroy_process_group() was not called", "NCCL error"):
        assert sign not in run.output, run.output[-3000:]


def test_abort_aborts_every_nccl_communicator_without_waiting_for_the_op_in_flight():
    """mcr.abort() (torch's _abort_process_group on backend mcr) with an NCCL all-reduce queued
    behind 2 s of GPU work: ProcessGroupNCCL.abort, not a wait for the op, and the process exits.
    Its speed alone cannot show the abort (the op has no GPU work at one rank, and dropping the
    group is as fast), so NCCL's own log says what became of each communicator by the time
    abort() returned: every one made was aborted (ncclCommAbort), none destroyed or left.
    Breaks caught: a Backend.abort that skips ProcessGroupNCCL.abort (left), that shuts the group
    down instead (ncclCommDestroy: destroyed), or a Runtime.abort that misses a group (left); an
    abort that waits for the op (the 2 s)."""
    result = launch(1, "tests.gpu.scripts.nccl_abort", timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    took = re.search(r"rank 0: abort took ([0-9.]+) s with 1 ops in flight", result.output)
    assert took and float(took.group(1)) < 1.5, result.output[-3000:]
    ends = re.search(
        r"rank 0: nccl communicators: (\d+) made, (\d+) of them aborted, (\d+) destroyed, (\d+) left", result.output
    )
    assert ends, result.output[-3000:]
    made, aborted, destroyed, left = map(int, ends.groups())
    assert made >= 1 and (aborted, destroyed, left) == (made, 0, 0), result.output[-3000:]
    assert "rank 0: exits after abort; mcr initialized: False" in result.output, result.output[-3000:]
