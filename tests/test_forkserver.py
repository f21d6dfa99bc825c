"""The fork server stands in for a fresh Python: a forked rank sees its own argv, environment,
directory and path, ends as the launcher expects (exit code, signal), and dies with its client;
where it cannot stand in, the rank starts fresh."""

import os
import re
import signal
import subprocess
import time

import pytest

from tests.ranks import REPO, fork_server, rank_env, run_script

pytestmark = pytest.mark.skipif(
    os.environ.get("TESTS_FORKSERVER") == "0", reason="TESTS_FORKSERVER=0: every rank starts fresh"
)

SCRIPT = """
import os, sys
forked = "torch" in sys.modules  # imported before this line only by the server
from tests.report import report
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["RANK"])
import mcr
mcr.init(tuning=None)
import torch
x = torch.full((3,), float(rank + 1))
mcr.all_reduce(x)
report("FORK", rank, value={"forked": forked, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
       "mine": os.environ.get("MINE"), "sum": x.tolist(), "server_var": "TESTS_FORKSERVER_SOCKET" in os.environ})
mcr.finalize()
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return str(path)


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_a_forked_rank_runs_with_its_own_argv_environment_and_directory(script, launcher):
    result = run_script(2, script, "a", "b", launcher=launcher, env={"MINE": launcher}).check()
    reports = result.tagged("FORK")
    for rank in (0, 1):
        assert reports[str(rank)] == {
            "forked": True,
            "argv": [script, "a", "b"],
            "cwd": REPO,
            "path0": os.path.dirname(script),
            "mine": launcher,
            "sum": [3.0, 3.0, 3.0],
            "server_var": False,
        }


def test_an_environment_read_at_start_gets_a_fresh_python(script):
    reports = run_script(2, script, env={"OMP_NUM_THREADS": "2"}).check().tagged("FORK")
    assert [reports[str(r)]["forked"] for r in (0, 1)] == [False, False]


def test_the_launcher_sees_the_ranks_exit_code_and_the_signal_that_killed_it(script, tmp_path):
    assert run_script(2, script, env={"EXIT_WITH": "7"}).returncode == 7
    killed = tmp_path / "killed.py"
    killed.write_text("import os, signal, sys\nassert 'torch' in sys.modules\nos.kill(os.getpid(), signal.SIGKILL)\n")
    out = run_script(2, str(killed)).output
    assert re.search(r"rank \d with PID \d+ on node \S+ exited on\s+signal 9", out), out


def test_a_rank_dies_with_its_client(tmp_path):
    client = fork_server("mpiexec")
    pid_file = tmp_path / "pid"
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)\n")
    env = dict(rank_env(), TESTS_FORKSERVER_SOCKET=client + ".socket")
    proc = subprocess.Popen([client, str(sleeper)], env=env, cwd=REPO)
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    rank = int(pid_file.read_text())
    assert rank != proc.pid  # forked by the server, not the client itself
    proc.send_signal(signal.SIGTERM)  # relayed
    assert proc.wait(10) == -signal.SIGTERM
    proc = subprocess.Popen([client, str(sleeper)], env=env, cwd=REPO)
    for _ in range(300):
        if int(pid_file.read_text() or 0) != rank:
            break
        time.sleep(0.05)
    rank = int(pid_file.read_text())
    proc.kill()  # SIGKILL cannot be relayed: the relay sees the client gone
    proc.wait()
    for _ in range(100):
        if not os.path.exists(f"/proc/{rank}") or open(f"/proc/{rank}/stat").read().split()[2] == "Z":
            return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} outlived its client")


ENDING = """
import atexit, os, sys, threading, time
rank = os.environ["OMPI_COMM_WORLD_RANK"]
atexit.register(print, "atexit ran on", rank)
threading.Thread(target=lambda: (time.sleep(0.5), print("thread joined on", rank))).start()
sys.stdout = open(1, "w", buffering=1 << 16, closefd=False)  # the ranks' own stdout is unbuffered
sys.stdout.write("unflushed output of " + rank)
code = os.environ["EXIT_WITH"]
sys.exit(int(code) if code.isdigit() else code)
"""


ENDED = ("atexit ran on", "thread joined on", "unflushed output of")


@pytest.mark.parametrize("exit_with,returncode", [("0", 0), ("5", 5), ("a message", 1)])
def test_a_forked_rank_ends_as_the_interpreter_would(tmp_path, exit_with, returncode):
    # the server ends its ranks without tearing down modules (tests/forkserver.py: leave)
    path = tmp_path / "ending.py"
    path.write_text(ENDING)
    result = run_script(2, str(path), env={"EXIT_WITH": exit_with})
    assert result.returncode == returncode, result.output
    ended = [r for r in (0, 1) if all(f"{what} {r}" in result.output for what in ENDED)]
    # Open MPI ends the job when a rank exits with an error: the other may be killed before it ends
    assert ended == [0, 1] if returncode == 0 else ended, result.output
    assert (result.output.count("a message") == 2) == (exit_with == "a message"), result.output
