"""A barrier's own timeout (`mcr.barrier(timeout=)`, `dist.barrier(timeout=)` on backend "mcr"):
it fails the barrier once passed, as on torch's gloo, on a backend that takes one."""

import inspect
import os

import pytest
import torch.distributed as dist

from tests.ranks import run_script

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "barrier_timeout.py")


@pytest.mark.parametrize("mode", ["api", "dist"])
def test_a_barrier_with_a_timeout_fails_once_it_passed_and_the_job_goes_on(mode):
    if mode == "dist" and "timeout" not in inspect.signature(dist.barrier).parameters:
        pytest.skip("this torch's dist.barrier takes no timeout (torch 2.12 added it)")
    got = run_script(2, SCRIPT, mode).check().tagged("BARRIER")
    sums = [30.0, 2.0]  # 10 + 20, 0.5 + 1.5
    # rank 0's late barrier: gloo's timeout, after 0.5 s (never sooner; how much later depends on
    # the machine's load), which alone can end it: rank 1 leaves the group only after it
    late = got["0"].pop("error")
    assert "barrier on backend gloo" in late and "Timed out waiting 500ms" in late, late
    assert got["0"].pop("waited") >= 0.4, got
    assert got == {
        "0": {"timed": "gloo", "untimed": "mpi", "sum": sums},
        "1": {"timed": "gloo", "untimed": "mpi", "error": None, "waited": None, "sum": sums},
    }
