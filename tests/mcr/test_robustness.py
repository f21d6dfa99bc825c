"""Mixing backends never deadlocks; hangs, dead ranks and bad input fail loudly and clearly."""

import json
import os
import re
import socket
import tempfile
import time

import pytest

from mcr.backends.mpi import WORKER_FROM
from mcr.watchdog import EXIT_CODE
from tests.mcr.tables import CHUNK_FROM, size_split_table
from tests.ranks import run_script, under_hydra

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def assert_every_op_checked(out, nprocs, num_ops):
    lines = re.findall(r"rank (\d+): stress OK (\d+) ops, (\d+) issued, (\d+) checked", out)
    assert sorted(int(r) for r, *_ in lines) == list(range(nprocs)), out[-3000:]
    for r, ops, issued, checked in lines:
        assert int(ops) == num_ops and issued == checked, (r, issued, checked)
        if int(r) in (0, nprocs - 1):  # members of every group the script uses issue every op
            assert int(issued) == num_ops, (r, issued)


@pytest.mark.parametrize("nprocs,seed", [(2, 2), (3, 3)])
def test_random_interleaving_of_1000_mixed_ops_completes(nprocs, seed):
    # the watchdog turns a hang into a failure naming rank, op and backend
    env = {"MCR_WATCHDOG_TIMEOUT": "60"}
    out = run_script(nprocs, os.path.join(SCRIPTS, "stress.py"), 1000, seed, env=env).check().output
    assert_every_op_checked(out, nprocs, 1000)


@pytest.mark.parametrize("nprocs,seed", [(2, 11), (3, 12), (3, 13)])
def test_random_interleaving_with_a_size_dependent_table_completes(tmp_path, nprocs, seed):
    # the automatic choice flips with size, so uneven all-to-alls agree on their size among async ops
    table = size_split_table(tmp_path / "table.yaml", nprocs)
    log_path = tmp_path / "comm.json"
    env = {"MCR_WATCHDOG_TIMEOUT": "60", "MCR_COMM_LOG": "1", "MCR_COMM_LOG_JSON": str(log_path)}
    out = run_script(nprocs, os.path.join(SCRIPTS, "stress.py"), 500, seed, table, env=env).check().output
    assert_every_op_checked(out, nprocs, 500)
    # the ops took the paths the table and the sizes are there for (rank 0's log)
    rows = json.loads(log_path.read_text())
    chunked = [row for row in rows if row["op"] == "all_reduce" and row["backend"] == "mpi/chunk=32K"]
    assert chunked and all(row["bytes"] >= CHUNK_FROM for row in chunked), rows
    on_worker = [row for row in rows if row["backend"] == "mpi" and row["bytes"] >= WORKER_FROM]
    assert {row["op"] for row in on_worker} >= {"all_gather", "reduce_scatter"}, rows


def test_a_rank_blocked_in_gloo_keeps_its_async_mpi_ops_moving():
    # rank 1 waits for an MPI op that needs rank 0's progress while rank 0 waits in gloo for rank 1
    env = {"MCR_WATCHDOG_TIMEOUT": "60"}
    out = run_script(2, os.path.join(SCRIPTS, "cross_progress.py"), env=env, timeout=180).check().output
    assert out.count("cross progress OK") == 2 and out.count(": OK") == 8, out[-3000:]


@pytest.mark.parametrize("thread_level", ["multiple", "single"])
def test_a_wait_no_test_can_finish_does_not_hang_on_a_pending_mpi_receive(thread_level):
    # torch's gloo marks its reduce-scatter and send/recv Works done only inside wait(): polling
    # them while an MPI receive is pending spun until that receive, which needs this rank to go on.
    # With MPI_THREAD_MULTIPLE the driver thread keeps MPI moving; without it ("single") the wait
    # runs on a helper thread while the waiting one drives MPI (MPIDriver.wait_for: polling
    # instead hung this test). The watchdog off (0), as a user debugging a hang sets it: torch's
    # groups keep their own timeout (a 0 reached gloo's, and its groups failed to form); the
    # harness ends a hang
    env = {"MCR_WATCHDOG_TIMEOUT": "0", "MPI4PY_RC_THREAD_LEVEL": thread_level}
    out = run_script(2, os.path.join(SCRIPTS, "waited_only.py"), env=env, timeout=120).check().output
    assert out.count("waited only OK") == 2 and out.count("pending: OK") == 4, out[-3000:]


def run_hang(fault, wait, backend, launcher="mpiexec", watchdog_s=10, flight_dir=None):
    """hang.py under `launcher`; returns the result and the seconds from rank 1's fault to the job's
    end (`result.waited_s`: from the start of rank 0's endless wait to the job's end).
    `flight_dir`: the ranks keep their flight records there (MCR_FR_DIR)."""
    script = os.path.join(SCRIPTS, "hang.py")
    env = {"MCR_WATCHDOG_TIMEOUT": str(watchdog_s), **({"MCR_FR_DIR": str(flight_dir)} if flight_dir else {})}
    with tempfile.TemporaryDirectory(prefix="mcr-hang-") as events:
        result = run_script(
            2, script, fault, wait, backend, events, launcher=launcher, env=env, timeout=watchdog_s + 150
        )
    ended = time.time()
    fault_at = re.search(r"fault at ([0-9.]+)", result.output)
    wait_at = re.search(r"rank 0 waits at ([0-9.]+)", result.output)
    assert fault_at, result.output[-3000:]
    seconds = ended - float(fault_at.group(1))
    result.waited_s = ended - float(wait_at.group(1)) if wait_at else None
    print(f"{fault} {wait} {backend} {launcher}: exit code {result.returncode} {seconds:.1f} s after the fault")
    return result, seconds


def ended_by_the_fault(result) -> bool:
    """The job ended, and not by the watchdog's timeout (120 s in these tests, the harness's
    270): what ended it was the dead or failing rank. How soon is not asserted (a busy
    machine's launcher takes its time); the seconds are printed."""
    return result.returncode not in (0, EXIT_CODE) and "mcr watchdog:" not in result.output


# The watchdog tests use 10 s: well past gloo's connect at start-up (which shares the timeout), so a
# slow start on a loaded machine is not mistaken for the hang under test.
WATCHDOG_S = 10


@pytest.mark.parametrize(
    "wait,named",
    [
        ("op", "in all_reduce on backend mpi"),  # rank 0 blocked in an op rank 1 never issues
        ("async", "in all_reduce on backend mpi"),  # ... waiting on the handle of such an op
        ("finalize", "in finalize on backend mpi"),  # ... in finalize(), which rank 1 never calls
    ],
)
def test_watchdog_names_rank_op_and_backend_of_a_hang_after_its_timeout_not_before(wait, named):
    result, _ = run_hang("hang", wait, "mpi", watchdog_s=WATCHDOG_S)
    assert result.returncode == EXIT_CODE, result.output[-3000:]
    assert "mcr watchdog: rank 0 has waited" in result.output and named in result.output, result.output[-3000:]
    # it checks once a second, so the time it reports lies in [timeout, timeout + one period (+ slack)]
    reported = re.search(r"mcr watchdog: rank 0 has waited ([0-9.]+) s", result.output)
    assert reported, result.output[-3000:]
    assert WATCHDOG_S <= float(reported.group(1)) <= WATCHDOG_S + 2, result.output[-3000:]
    # seen from outside, from the wait's start to the job's end: never early (how late depends on
    # how fast a busy machine's launcher takes the job down, so it is not asserted)
    assert result.waited_s is not None, result.output[-3000:]
    assert WATCHDOG_S <= result.waited_s, (result.waited_s, result.output[-3000:])


def test_gloo_timeout_names_rank_op_and_ends_the_job():
    result, _ = run_hang("hang", "op", "gloo")
    assert result.returncode != 0
    # gloo's own timeout and the watchdog share the deadline; whichever fires names the same things
    by_gloo = "rank 0: all_reduce on backend gloo" in result.output and "rank 0 ended with CommError" in result.output
    by_watchdog = "rank 0 has waited" in result.output and "in all_reduce on backend gloo" in result.output
    assert by_gloo or by_watchdog, result.output[-3000:]


# What each launcher prints about a rank SIGKILLed: that rank's death, in its own words (Hydra's
# names a PID and host that are not the dead rank's: launch/dead_rank.py)
KILLED = {
    "mpiexec": r"process rank 1 with PID \d+ on node \S+ exited on\s+signal 9",
    "torchrun": r"rank\s+: 1 \(local_rank: 1\)\n\s+exitcode\s+: -9",
}


@pytest.mark.parametrize(
    "launcher,wait,backend",
    [
        ("mpiexec", "op", "mpi"),
        ("mpiexec", "async", "mpi"),
        ("mpiexec", "op", "gloo"),
        ("torchrun", "async", "gloo"),  # no MPI world under torchrun
    ],
)
def test_a_killed_rank_ends_the_job_promptly_named_with_its_host_and_where_its_peer_waited(
    launcher, wait, backend, tmp_path
):
    # the watchdog's 120 s is far off: what ends the job is the dead rank, not a timeout
    result, _ = run_hang("kill", wait, backend, launcher=launcher, watchdog_s=120, flight_dir=tmp_path)
    out = result.output
    assert ended_by_the_fault(result), (result.returncode, out[-3000:])
    # launch.local's last word, under every launcher: the rank, from its rank file's host
    assert out.rstrip().endswith(f"mcr: rank 1 (host {socket.gethostname()}) died"), out[-3000:]
    if launcher == "mpiexec" and under_hydra():
        # Hydra SIGKILLs the survivors at once: they say nothing, so launch.local names rank 0's op
        # from its live flight record (an MPI wait never learns of the death; a gloo one may)
        if backend == "mpi":
            assert "launch.local: rank 0 was last in all_reduce on backend mpi (group world" in out, out[-3000:]
        return
    assert re.search(KILLED[launcher], out), out[-3000:]
    # the survivor names its op: gloo sees the closed connection; an MPI wait learns of the death
    # only from the launcher's SIGTERM, which the runtime turns into a line naming the op
    by_error = f"rank 0: all_reduce on backend {backend}" in out and "rank 0 ended with CommError" in out
    by_sigterm = re.search(rf"rank 0 was ended by SIGTERM .* (in|after) all_reduce on backend {backend}", out)
    assert by_sigterm if backend == "mpi" else by_error or by_sigterm, out[-3000:]


def test_a_sigterm_while_a_failed_op_is_reported_still_names_that_op():
    # rank 0's wait fails (gloo: connection closed by rank 1, still alive); once rank 0 reports it,
    # rank 1 dies and the launcher's SIGTERM lands while rank 0 still reports
    result, _ = run_hang("close", "report", "gloo", launcher="torchrun", watchdog_s=120)
    assert ended_by_the_fault(result), (result.returncode, result.output[-3000:])
    named = re.search(
        r"rank 0 was ended by SIGTERM .* outside any communication op, after all_reduce on backend gloo "
        r"\(16 bytes, group of 2 ranks\) failed: .*Connection closed by peer",
        result.output,
    )
    assert named, result.output[-3000:]


def test_a_rank_raising_aborts_the_job_while_its_peer_waits_in_mpi():
    result, _ = run_hang("raise", "op", "mpi", watchdog_s=120)
    assert ended_by_the_fault(result), (result.returncode, result.output[-3000:])
    assert "RuntimeError: rank 1 fails on purpose" in result.output, result.output[-3000:]
    assert "mcr: rank 1 ended with RuntimeError; aborting the job" in result.output, result.output[-3000:]


@pytest.mark.parametrize(
    "launcher,env",
    [
        # an override naming a backend not started; no backend left for an int16 reduction
        ("mpiexec", {"MCR_BACKENDS": "mpi,nccl", "MCR_BACKEND_BROADCAST": "gloo"}),
        ("torchrun", {"MCR_BACKEND": "mpi"}),  # a default naming a backend torchrun cannot start
    ],
)
def test_bad_input_raises_clear_errors(launcher, env):
    out = run_script(2, os.path.join(SCRIPTS, "bad_input.py"), launcher=launcher, env=env).check().output
    assert out.count("bad input OK") == 2, out[-3000:]


def test_the_hooks_refuse_what_they_cannot_do_and_out_of_order_installs():
    out = run_script(2, os.path.join(SCRIPTS, "bad_hooks.py"), launcher="torchrun").check().output
    assert out.count("bad hooks OK") == 2, out[-3000:]
