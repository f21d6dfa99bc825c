"""launch.dead_rank: which rank died, from the ranks' processes (FirstToEnd) and the launcher's words."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from launch.dead_rank import FirstToEnd, dead_rank_lines, read_rank_files
from tests.ranks import REPO

# torchrun 2.13's summary of a real run of tests/mcr/scripts/hang.py kill (rank 1 SIGKILLed itself,
# rank 0 then failed on the closed connection in the same second): its Root Cause is rank 0
TORCHRUN_SUMMARY = """Failures:
[1]:
  time      : 2026-11-28_23:10:48
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 12771)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 12771
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_23:10:48
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 12770)
"""


def write_rank_files(directory, procs):
    for rank, proc in enumerate(procs):
        about = {"rank": rank, "host": socket.gethostname(), "pid": proc.pid}
        (directory / f"rank-{rank}.json").write_text(json.dumps(about))


def sleepers(n):
    return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(n)]


def files_of_dead_ranks(directory, n):
    """The rank files of `n` processes that have all ended (killed)."""
    procs = sleepers(n)
    write_rank_files(directory, procs)
    for proc in procs:
        proc.kill()
        proc.wait()
    return read_rank_files(str(directory))


def test_torchruns_summary_names_the_rank_a_signal_ended_not_its_root_cause(tmp_path):
    assert dead_rank_lines(TORCHRUN_SUMMARY, files_of_dead_ranks(tmp_path, 2)) == [
        f"mcr: rank 1 (host {socket.gethostname()}) died"
    ]


def test_the_first_rank_to_end_is_named_and_ranks_seen_ending_together_name_none(tmp_path):
    alone, together = tmp_path / "alone", tmp_path / "together"
    alone.mkdir(), together.mkdir()
    procs = sleepers(2)
    watch = FirstToEnd(str(alone), 2)
    write_rank_files(alone, procs)
    deadline = time.monotonic() + 120
    while watch.seen != {0, 1}:  # both watched before either ends
        assert time.monotonic() < deadline, watch.seen
        time.sleep(0.01)
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    while not watch.ended:  # rank 1 seen ending before rank 0 is killed
        assert time.monotonic() < deadline, watch.ended
        time.sleep(0.01)
    procs[0].kill()
    procs[0].wait()
    watch.stop()
    assert watch.first() == 1, watch.ended
    # both ended before the watcher looked: which was first, it cannot say
    procs = sleepers(2)
    for proc in procs:
        proc.kill()
        proc.wait()
    write_rank_files(together, procs)
    watch = FirstToEnd(str(together), 2)
    while watch.seen != {0, 1}:
        assert time.monotonic() < deadline, watch.seen
        time.sleep(0.01)
    watch.stop()
    assert watch.ended == [[0, 1]] and watch.first() is None, watch.ended


def test_a_rank_that_ended_well_is_passed_over_for_the_first_that_did_not(tmp_path):
    procs = sleepers(3)
    watch = FirstToEnd(str(tmp_path), 3)
    write_rank_files(tmp_path, procs)
    deadline = time.monotonic() + 120
    while watch.seen != {0, 1, 2}:
        assert time.monotonic() < deadline, watch.seen
        time.sleep(0.01)
    for rank in (0, 2, 1):  # rank 0 ends well, then rank 2 dies, then rank 1
        if rank == 0:
            about = json.loads((tmp_path / "rank-0.json").read_text())
            (tmp_path / "rank-0.json").write_text(json.dumps(dict(about, ended_well=True)))
        procs[rank].kill()
        procs[rank].wait()
        while sum(map(len, watch.ended)) < {0: 1, 2: 2, 1: 3}[rank]:  # seen ending before the next ends
            assert time.monotonic() < deadline, watch.ended
            time.sleep(0.01)
    watch.stop()
    assert watch.ended == [[0], [2], [1]] and watch.first() == 2, watch.ended


@pytest.mark.parametrize(
    "end,ended_well",
    [("pass", True), ("raise RuntimeError('fails')", False), ("os.kill(os.getpid(), signal.SIGKILL)", False)],
)
def test_a_rank_file_says_ended_well_only_after_a_clean_exit(tmp_path, end, ended_well):
    script = (
        "import os, signal, sys\n"
        "from mcr.rank_file import write_rank_file, mark_a_clean_exit\n"
        f"write_rank_file({str(tmp_path)!r}, 3)\n"
        f"mark_a_clean_exit({str(tmp_path)!r}, 3)\n" + end + "\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=120)
    assert read_rank_files(str(tmp_path))[3].ended_well is ended_well


@pytest.mark.parametrize("end,ended_well", [("mcr.finalize()", True), ("pass", False)])
def test_a_rank_is_marked_ended_well_by_the_runtimes_finalize_not_by_its_start(tmp_path, end, ended_well):
    # a rank that leaves without finalize() may leave its peers waiting: it is not passed over
    script = f"import mcr\nmcr.init(backends='gloo')\n{end}\n"
    env = dict(os.environ, MCR_RANK_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_rank_files(str(tmp_path))[0].ended_well is ended_well


# Cray PALS' mpiexec as public reports quote it (pmodels/mpich#7569, #7605; ufs-weather-model#3186):
# the rank that died first, then those PALS ended (signal 15) and those that failed of it (a code)
PALS_OUTPUT = """\
x3004c0s7b0n0.hsn.cm.polaris.alcf.anl.gov: rank 0 exited with code 1
x3004c0s13b1n0.hsn.cm.polaris.alcf.anl.gov: rank 5 died from signal 9
x3004c0s7b0n0.hsn.cm.polaris.alcf.anl.gov: rank 2 died from signal 15
"""


def test_cray_pals_line_names_the_rank_a_signal_other_than_its_own_sigterm_ended(tmp_path):
    ranks = files_of_dead_ranks(tmp_path, 6)
    assert dead_rank_lines(PALS_OUTPUT, ranks) == [f"mcr: rank 5 (host {socket.gethostname()}) died"]
    ended_by_pals = "\n".join(line for line in PALS_OUTPUT.splitlines() if "signal 9" not in line)
    assert dead_rank_lines(ended_by_pals, ranks) == []  # its own SIGTERMs and exit codes name no death
