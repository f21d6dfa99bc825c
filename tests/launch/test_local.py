"""launch.local's mpiexec line fits the launcher on PATH: Open MPI's flags for Open MPI, none for
Hydra (MPICH, MVAPICH, Intel MPI), which refuses `--oversubscribe` ("unrecognized argument",
seen with the mpich wheel's mpiexec before the launcher told them apart)."""

import os
import sys

from launch import local

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
