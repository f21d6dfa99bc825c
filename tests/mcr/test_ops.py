"""Every op on every backend and on the automatic choice, on real ranks."""

import os
import re

import pytest

from tests.ranks import run_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


@pytest.mark.parametrize(
    "nprocs,launcher,backends",
    [(2, "mpiexec", "['mpi', 'gloo']"), (3, "mpiexec", "['mpi', 'gloo']"), (2, "torchrun", "['gloo']")],
    ids=["2-ranks-mpiexec", "3-ranks-mpiexec", "2-ranks-torchrun"],
)
def test_every_op_matches_local_reference(nprocs, launcher, backends):
    out = run_script(nprocs, os.path.join(SCRIPTS, "check_ops.py"), launcher=launcher).check().output
    oks = re.findall(r"rank (\d+): OK (\d+) checks on backends (\[[^\]]*\])", out)  # ranks may share a line
    assert sorted(int(r) for r, _, _ in oks) == list(range(nprocs)), out[-3000:]
    assert all(int(count) > 1000 and found == backends for _, count, found in oks), oks
    # unsupported combinations fall back visibly, not silently
    if "mpi" in backends:
        assert (
            "mpi (asked for by backend=) cannot run all_reduce sum on cpu bfloat16 tensors; using gloo for all_reduce"
            in out
        )


def test_torchrun_reports_mpi_unavailable_once():
    out = run_script(2, os.path.join(SCRIPTS, "check_ops.py"), launcher="torchrun").check().output
    assert out.count("mpi: launched by torchrun, which gives no MPI world") == 1, out[-2000:]
