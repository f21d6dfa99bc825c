"""launch.local's mpiexec line fits the launcher on PATH: Open MPI's flags for Open MPI, none for
Hydra (MPICH, MVAPICH, Intel MPI), which refuses `--oversubscribe` ("unrecognized argument",
seen with the mpich wheel's mpiexec before the launcher told them apart); under Hydra, with more
ranks than cores, the variables that make a waiting rank sleep between polls; a failed job ends
naming the rank that died."""

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from launch import local
from tests.ranks import REPO, rank_env, run_tool, under_hydra

HYDRA_BANNER = "HYDRA build details:\n    Version:                                 5.0.2\n"


def test_open_mpi_gets_its_flags_from_the_real_mpiexec(monkeypatch):
    monkeypatch.delenv("MPIEXEC", raising=False)  # .venv's Open MPI, also under `make test-mpi`
    monkeypatch.delenv("PYTHON_EXEC", raising=False)
    local.mpiexec_family.cache_clear()
    cmd = local.mpiexec_command(2, ["-m", "x"])
    assert local.mpiexec_family(cmd[0]) == "open-mpi", cmd
    assert cmd[1:6] == ["-n", "2", "--oversubscribe", "--bind-to", "none"], cmd
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0), cmd
    assert cmd[-3:] == [sys.executable, "-m", "x"]
    monkeypatch.setenv("PYTHON_EXEC", "/other/python")  # the ranks' Python, as torchrun reads it
    assert local.mpiexec_command(2, ["-m", "x"])[-3:] == ["/other/python", "-m", "x"]


def test_hydra_gets_none_of_open_mpis_flags(tmp_path, monkeypatch):
    fake = tmp_path / "mpiexec"  # a double printing Hydra's banner, first on PATH
    fake.write_text(f"#!/bin/sh\nprintf '{HYDRA_BANNER}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("MPIEXEC", raising=False)
    monkeypatch.setattr(local.sys, "executable", "/nowhere/python")  # its folder holds no mpiexec
    local.mpiexec_family.cache_clear()
    cores = len(os.sched_getaffinity(0))  # as many ranks as cores: nothing of the oversubscribed case either
    cmd = local.mpiexec_command(cores, ["script.py"], "-ppn 3")
    assert cmd == [str(fake), "-n", str(cores), "-ppn", "3", "/nowhere/python", "script.py"], cmd


@contextlib.contextmanager
def one_core():
    """This thread (and what it starts) may run on one core only, as under `taskset -c N`."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_hydra_with_more_ranks_than_cores_makes_waits_sleep_unless_the_user_chose(tmp_path, monkeypatch):
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\nprintf '{HYDRA_BANNER}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("MPIEXEC", str(fake))
    for name in local.HYDRA_OVERSUBSCRIBED:
        monkeypatch.delenv(name, raising=False)
    local.mpiexec_family.cache_clear()
    with one_core():
        cmd = local.mpiexec_command(2, ["script.py"])
        monkeypatch.setenv("MPIR_CVAR_ENABLE_HEAVY_YIELD", "0")  # the user's own: passed on by Hydra, not overridden
        mine = local.mpiexec_command(2, ["script.py"])
    assert cmd[1:6] == ["-n", "2", "-genv", "MPIR_CVAR_ENABLE_HEAVY_YIELD", "1"], cmd
    assert "-genv" not in mine, mine


# one write a rank: Hydra forwards the ranks' output as it comes, and two may share a line
SHOW_ENV = "import os, sys; os.write(1, ' '.join(f'{k}={os.environ.get(k)};' for k in sys.argv[1:]).encode())\n"


@pytest.mark.skipif(not under_hydra(), reason="needs Hydra's mpiexec (MPICH, Intel MPI): make test-mpi")
def test_oversubscribed_hydra_ranks_see_the_sleeping_wait_in_their_environment(tmp_path):
    """A real launch through `python -m launch.local` on one core: 2 ranks, 1 rank, and 2 ranks
    where the user set the variable."""
    script = tmp_path / "show_env.py"
    script.write_text(SHOW_ENV)

    def ranks_see(nprocs, **env):
        cmd = [sys.executable, "-m", "launch.local", "-n", str(nprocs), str(script), "MPIR_CVAR_ENABLE_HEAVY_YIELD"]
        with one_core():  # the launcher and its ranks inherit it
            out = subprocess.run(cmd, cwd=REPO, env=rank_env(env), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return re.findall(r"MPIR_CVAR_ENABLE_HEAVY_YIELD=(\w+);", out.stdout)

    assert ranks_see(2) == ["1", "1"]
    assert ranks_see(1) == ["None"]
    assert ranks_see(2, MPIR_CVAR_ENABLE_HEAVY_YIELD="0") == ["0", "0"]


def test_a_failed_job_ends_naming_the_dead_rank_from_the_files_the_ranks_wrote(tmp_path):
    # tests/mcr/scripts/hang.py: rank 1 SIGKILLs itself while rank 0 waits in an all-reduce
    hang = os.path.join(REPO, "tests", "mcr", "scripts", "hang.py")
    rank_dir, events = tmp_path / "ranks", tmp_path / "events"
    events.mkdir()
    env = {"MCR_RANK_DIR": str(rank_dir), "MCR_WATCHDOG_TIMEOUT": "120"}
    result = run_tool("launch.local", "-n", "2", hang, "kill", "op", "mpi", events, env=env, timeout=300)
    assert result.returncode != 0, result.output[-3000:]
    host = socket.gethostname()
    assert result.errors.rstrip().endswith(f"mcr: rank 1 (host {host}) died"), result.errors[-3000:]
    ranks = {name: json.loads((rank_dir / name).read_text()) for name in os.listdir(rank_dir)}
    assert sorted(ranks) == ["rank-0.json", "rank-1.json"], ranks  # written whole: no temporary file left
    assert [(r["rank"], r["host"]) for _, r in sorted(ranks.items())] == [(0, host), (1, host)], ranks
    assert ranks["rank-0.json"]["pid"] != ranks["rank-1.json"]["pid"] > 0, ranks


# Both ranks finalize; rank 0 exits, and rank 1 dies once rank 0's process has ended (no MPI: an
# MPI_Finalize waits for every rank, so under mpiexec no rank ends before its peers)
ENDS_WELL_THEN_DIES = """
import json, os, select, signal
import torch
import mcr

mcr.init()
rank = mcr.get_rank()
t = torch.full((4,), float(rank + 1))
mcr.all_reduce(t)
assert t.tolist() == [3.0] * 4, t
mcr.finalize()
if rank == 1:
    with open(os.path.join(os.environ["MCR_RANK_DIR"], "rank-0.json")) as f:
        pid = json.load(f)["pid"]
    try:
        ended, _, _ = select.select([os.pidfd_open(pid)], [], [], 120)
        assert ended, "rank 0 still runs after 120 s"
    except ProcessLookupError:
        pass  # gone already
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(under_hydra(), reason="no MPI in this job: `make test` runs it")
def test_a_rank_that_ended_well_first_is_not_named_for_the_one_that_died(tmp_path):
    script, rank_dir = tmp_path / "ends_well_then_dies.py", tmp_path / "ranks"
    script.write_text(ENDS_WELL_THEN_DIES)
    result = run_tool("launch.local", "--launcher", "torchrun", "-n", "2", script, env={"MCR_RANK_DIR": str(rank_dir)})
    assert result.returncode != 0, result.output[-3000:]
    assert result.errors.rstrip().endswith(f"mcr: rank 1 (host {socket.gethostname()}) died"), result.errors[-3000:]
    ended_well = {r: json.loads((rank_dir / f"rank-{r}.json").read_text())["ended_well"] for r in (0, 1)}
    assert ended_well == {0: True, 1: False}, ended_well


# Run as PID 1 of a new PID namespace, so the launcher gets the same PID each time: "leave" starts
# an Open MPI job and SIGKILLs its launcher mid-run (its session directory stays); "launch" starts
# one that prints a line. Both print the launcher's PID.
LEAVE_OR_LAUNCH = """
import os, signal, subprocess, sys, time
from launch.local import mpiexec_command

mode, ready = sys.argv[1], sys.argv[2]
wait = f"import pathlib, time; pathlib.Path({ready!r}).touch(); time.sleep(600)"
cmd = mpiexec_command(1, ["-c", wait if mode == "leave" else "print('the rank ran')"])
proc = subprocess.Popen(cmd)
print("launcher pid", proc.pid, flush=True)
if mode == "leave":
    deadline = time.monotonic() + 120
    while not os.path.exists(ready) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(ready), "the rank never started"
    proc.kill()  # SIGKILL: as a scheduler's time limit or the OOM killer ends it
proc.wait()
print("launcher exit", proc.returncode, flush=True)
"""


@pytest.mark.skipif(under_hydra(), reason="Open MPI's launcher leaves <tmp>/ompi.<pid>; Hydra keeps no such directory")
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="a PID namespace needs root and unshare"
)
def test_a_session_directory_a_killed_launcher_left_does_not_fail_the_next_under_its_pid(tmp_path):
    script, tmp = tmp_path / "leave_or_launch.py", tmp_path / "tmp"
    script.write_text(LEAVE_OR_LAUNCH)
    tmp.mkdir()
    env = rank_env({"TMPDIR": str(tmp)})

    def in_new_pid_namespace(mode):
        cmd = ["unshare", "--fork", "--pid", "--mount-proc", sys.executable, str(script), mode, str(tmp_path / "ready")]
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        return out.stdout + out.stderr, re.search(r"launcher pid (\d+)", out.stdout)

    out, left = in_new_pid_namespace("leave")
    assert left and os.listdir(tmp) == [f"ompi.{left[1]}"], out  # what a SIGKILLed launcher leaves
    (tmp / "ompi.1").mkdir()  # PID 1 there is the script itself, alive: its directory stays
    out, launched = in_new_pid_namespace("launch")
    assert sorted(os.listdir(tmp)) == ["ompi.1"], out  # the dead launcher's gone, the live one's kept
    assert launched and launched[1] == left[1], out  # the next launcher got the same PID
    assert "the rank ran" in out and "launcher exit 0" in out, out  # not "listener thread failed to start"
