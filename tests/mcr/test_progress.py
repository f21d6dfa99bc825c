"""Async ops complete on their own (the progress thread, `mcr.progress`): the caller only
sleeps after issuing, and each op's completion callback, post-steps and result arrive; through
torch, `Work.get_future()` returns at once and its future completes later. Each of these fails
with MCR_PROGRESS_THREAD=0 (nothing moves MPI, runs the post-steps or sets the future). With the
thread off (config or variable, or an MPI without MPI_THREAD_MULTIPLE) ops complete when waited
on and futures at `get_future()`."""

import os
import re

import pytest

from tests.ranks import run_script

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "progress.py")


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_async_ops_complete_without_a_wait(backend):
    out = run_script(2, SCRIPT, backend).check().output
    found = re.findall(rf"rank (\d+): progress OK (\d+) checks via mcr on {backend}", out)
    assert sorted(found) == [("0", "20"), ("1", "20")], out[-3000:]


def test_large_async_collectives_on_the_mpi_worker_mix_with_small_and_blocking_ones():
    out = run_script(2, SCRIPT, "mixed").check().output
    found = re.findall(r"rank (\d+): progress OK (\d+) checks via mcr on mixed", out)
    assert sorted(found) == [("0", "30"), ("1", "30")], out[-3000:]


def test_dist_work_future_completes_on_its_own():
    out = run_script(2, SCRIPT, "torch").check().output
    assert sorted(re.findall(r"rank (\d+): progress OK (\d+) checks via torch", out)) == [("0", "10"), ("1", "10")]


def test_async_op_that_never_completes_is_named_by_the_watchdog():
    """Nobody waits on it (as when DDP waits on a future from C++): the thread reports it."""
    result = run_script(2, SCRIPT, "hang", env={"MCR_WATCHDOG_TIMEOUT": "3"}, timeout=100)
    assert result.returncode != 0, result.output[-3000:]
    assert "rank 0 has waited" in result.output and "in all_reduce on backend mpi (16 bytes" in result.output, (
        result.output[-3000:]
    )
    assert "still here" not in result.output


@pytest.mark.parametrize("mode", ["train", "train-blocking"])
def test_a_train_of_one_op_longer_than_the_watchdog_timeout_runs_to_its_end(mode):
    """8 s of one gloo all-reduce after another (async and waited, or blocking) under a 3 s
    watchdog: every call shares the route's OpCall, and the caller is inside a wait at nearly
    every look of the watchdog, which must see a new wait each time, not one wait of 8 s."""
    out = run_script(2, SCRIPT, mode, env={"MCR_WATCHDOG_TIMEOUT": "3"}, timeout=100).check().output
    assert sorted(re.findall(r"rank (\d+): the train of \d+ ops ended, still here", out)) == ["0", "1"], out[-3000:]


def test_a_caller_that_keeps_issuing_ops_does_not_hide_a_hung_one_from_the_watchdog():
    """The progress thread skips its tests while its caller issues ops, but not for longer than
    MAX_PAUSE_S: rank 0's never-joined op is named while both ranks issue an 8 s train of gloo
    ops (a thread that skipped every test while ops kept coming would never name it)."""
    result = run_script(2, SCRIPT, "hang-train", env={"MCR_WATCHDOG_TIMEOUT": "3"}, timeout=100)
    assert result.returncode != 0, result.output[-3000:]
    assert "rank 0 has waited" in result.output and "in all_reduce on backend mpi (16 bytes" in result.output, (
        result.output[-3000:]
    )
    assert "still here" not in result.output, result.output[-3000:]


def test_an_op_failing_where_nobody_waits_is_named():
    """The progress thread aborts the job with this message: no caller's wait would name the op."""
    from mcr.handle import Handle
    from mcr.inflight import tested
    from mcr.runtime import OpCall

    def test():
        raise OSError("peer gone")

    handle = Handle(wait=None, test=test)
    handle.op = OpCall("all_reduce", "mpi", 16, 2)
    with pytest.raises(
        RuntimeError, match=r"all_reduce on backend mpi \(16 bytes, group of 2 ranks\) failed: peer gone"
    ):
        tested(handle)


@pytest.mark.parametrize("thread", ["1", "0"])
def test_the_progress_thread_is_what_completes_an_unwaited_op(thread):
    """With the thread on, an async op's callback runs while its caller only sleeps; with it off
    (MCR_PROGRESS_THREAD=0) nothing else completes it: the callback runs at wait(), not before."""
    out = run_script(2, SCRIPT, "alone", env={"MCR_PROGRESS_THREAD": thread}).check().output
    found = sorted(re.findall(r"rank (\d+): (\w+) completed alone: (True|False)", out))  # ranks may share a line
    alone = "True" if thread == "1" else "False"
    assert found == [(r, b, alone) for r in "01" for b in ("gloo", "mpi")], out[-3000:]


def test_dist_work_future_is_done_at_get_future_with_the_thread_off_in_the_config():
    """`progress_thread: false`: `get_future()` waits for the op (rank 1 joins once rank 0 issued
    it) and returns a done future holding the whole result, single and coalesced."""
    out = run_script(2, SCRIPT, "torch-off").check().output
    found = sorted(re.findall(r"rank (\d+): progress OK (\d+) checks via torch-off", out))
    assert found == [("0", "6"), ("1", "6")], out[-3000:]


def test_an_mpi_without_thread_multiple_runs_no_second_mpi_thread():
    """MPI_THREAD_SINGLE: the runtime says so and turns the progress thread off (asked for or
    not); futures complete at `get_future()`; large async collectives run as MPI's own nonblocking
    calls (no worker); a rank blocked in gloo moves its pending MPI ops from its own thread."""
    env = {"MPI4PY_RC_THREAD_LEVEL": "single", "MCR_WATCHDOG_TIMEOUT": "60"}
    out = run_script(2, SCRIPT, "single", env=env, timeout=180).check().output
    found = sorted(re.findall(r"rank (\d+): progress OK (\d+) checks via single", out))
    assert found == [("0", "12"), ("1", "12")], out[-3000:]
    assert "mpi takes no calls from two threads at once (for MPI: no MPI_THREAD_MULTIPLE)" in out, out[-3000:]
