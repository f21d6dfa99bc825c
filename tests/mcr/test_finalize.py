"""finalize() destroys the runtime's gloo groups before the interpreter exits, even while the
caller still holds the runtime (CI once saw a rank abort at exit under torchrun with "terminate
called without an active exception": a gloo thread outliving the interpreter)."""

import os

import pytest

from tests.ranks import run_script

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "finalize_releases.py")


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
@pytest.mark.parametrize("via", ["mcr", "torch"])
def test_finalize_destroys_every_gloo_group_while_python_runs(via, launcher):
    out = run_script(2, SCRIPT, via, launcher=launcher).check().output
    for rank in (0, 1):
        assert f"rank {rank}: finalize released every gloo group via {via}" in out, out[-3000:]


def test_the_runtime_starts_again_and_again_in_one_process():
    """Before finalize freed them, the 5th start failed: "cannot create too many user-defined
    reduction operations" (8 per start), as torch's test runner found in an MPI world."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "restart.py")
    out = run_script(2, script, 12).check().output
    for rank in (0, 1):
        assert f"rank {rank}: restarted 12 times" in out, out[-3000:]
