"""launch.local's mpiexec line fits the launcher on PATH: Open MPI's flags for Open MPI, none for
Hydra (MPICH, MVAPICH, Intel MPI), which refuses `--oversubscribe` ("unrecognized argument",
seen with the mpich wheel's mpiexec before the launcher told them apart); a failed job ends
naming the rank that died."""

import json
import os
import socket
import sys

from launch import local
from tests.ranks import REPO, run_tool

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
    cmd = local.mpiexec_command(3, ["script.py"], "-ppn 3")
    assert cmd == [str(fake), "-n", "3", "-ppn", "3", "/nowhere/python", "script.py"], cmd


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
