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


def test_a_script_ending_without_finalize_releases_its_gloo_groups_before_python_finalizes():
    """Left to the interpreter's exit, a gloo thread that drops a tensor then needs the GIL and
    aborts the process (1 run in 3 of 300 blocking gloo all-reduces here). A check registered
    before mcr.init runs after the runtime's exit handler and finds no gloo thread left."""
    out = run_script(2, SCRIPT, "exit").check().output
    for rank in (0, 1):
        assert f"rank {rank}: the exit released every gloo group" in out, out[-3000:]


def test_the_runtime_starts_again_and_again_in_one_process():
    """Before finalize freed them, the 5th start failed: "cannot create too many user-defined
    reduction operations" (8 per start), as torch's test runner found in an MPI world."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "restart.py")
    out = run_script(2, script, 12).check().output
    for rank in (0, 1):
        assert f"rank {rank}: restarted 12 times" in out, out[-3000:]
