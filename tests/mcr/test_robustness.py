"""Mixing backends never deadlocks; hangs, dead ranks and bad input fail loudly and clearly."""

import os

import pytest

from mcr.watchdog import EXIT_CODE
from tests.ranks import run_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


@pytest.mark.parametrize("nprocs", [2, 3])
def test_random_interleaving_of_1000_mixed_ops_completes(nprocs):
    # the watchdog turns a hang into a failure naming rank, op and backend
    out = (
        run_script(nprocs, os.path.join(SCRIPTS, "stress.py"), 1000, nprocs, env={"MCR_WATCHDOG_TIMEOUT": "60"})
        .check()
        .output
    )
    assert out.count("stress OK 1000 ops") == nprocs, out[-3000:]


def test_watchdog_names_rank_op_and_backend_of_a_hang():
    result = run_script(
        2, os.path.join(SCRIPTS, "hang.py"), "hang", "mpi", env={"MCR_WATCHDOG_TIMEOUT": "3"}, timeout=90
    )
    assert result.returncode == EXIT_CODE, result.output[-3000:]
    assert "mcr watchdog: rank 0 has waited" in result.output and "in all_reduce on backend mpi" in result.output
    assert "unreachable" not in result.output


def test_gloo_timeout_names_rank_op_and_ends_the_job():
    result = run_script(
        2, os.path.join(SCRIPTS, "hang.py"), "hang", "gloo", env={"MCR_WATCHDOG_TIMEOUT": "3"}, timeout=90
    )
    assert result.returncode != 0
    # gloo's own timeout and the watchdog share the deadline; whichever fires names the same things
    by_gloo = "rank 0: all_reduce on backend gloo" in result.output and "rank 0 ended with CommError" in result.output
    by_watchdog = "rank 0 has waited" in result.output and "in all_reduce on backend gloo" in result.output
    assert by_gloo or by_watchdog, result.output[-3000:]


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_a_dead_rank_fails_the_job_naming_it(launcher):
    result = run_script(
        2,
        os.path.join(SCRIPTS, "hang.py"),
        "die",
        "gloo",
        launcher=launcher,
        env={"MCR_WATCHDOG_TIMEOUT": "20"},
        timeout=120,
    )
    assert result.returncode != 0
    # the launcher names the dead rank, or a survivor names the op whose peer vanished (a race)
    dead_named = "rank      : 1" in result.output if launcher == "torchrun" else "Exit code:    3" in result.output
    op_named = "rank 0: all_reduce on backend gloo" in result.output
    assert dead_named or op_named, result.output[-3000:]


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_bad_input_raises_clear_errors(launcher):
    out = run_script(2, os.path.join(SCRIPTS, "bad_input.py"), launcher=launcher).check().output
    assert out.count("bad input OK") == 2, out[-3000:]
