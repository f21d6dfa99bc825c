"""DeepSpeed-MoE (expert parallel 2), ZeRO-2 and ZeRO-3 on the runtime vs stock DeepSpeed on gloo.

The gloo baseline loads DeepSpeed's shared-memory op, which `make setup` builds (in
$TORCH_EXTENSIONS_DIR; where it is missing, the first run builds it: about a minute); the
runtime side never loads it.
"""

import pytest

from tests.hooks.common import assert_same_losses, families, run, tagged

ENV = {"DS_ACCELERATOR": "cpu"}


@pytest.fixture(scope="module")
def gloo_losses():
    return tagged(run("scripts/deepspeed_hook.py", "gloo", env=ENV, timeout=400), "LOSSES")


def test_install_instead_of_init_distributed_matches_gloo_and_uses_the_runtime(gloo_losses):
    out = run("scripts/deepspeed_hook.py", "mcr", env=ENV)
    assert_same_losses(tagged(out, "LOSSES"), gloo_losses)
    for rank in ("0", "1"):
        ops = families(tagged(out, "COMMLOG")[rank])
        # MoE all-to-all, gate and gradient all-reduce, ZeRO all-gather and ZeRO-3 reduce-scatter
        for op in ("all_to_all", "all_reduce", "all_gather", "reduce_scatter"):
            assert ops.get(op) == {"mpi"}, f"rank {rank}: {op} did not go through the runtime on mpi: {ops}"


def test_install_after_init_distributed_under_torchrun(gloo_losses):
    out = run("scripts/deepspeed_hook.py", "after", launcher="torchrun", env=ENV)
    assert_same_losses(tagged(out, "LOSSES"), gloo_losses)
    ops = families(tagged(out, "COMMLOG")["0"])
    for op in ("all_to_all", "all_reduce", "all_gather", "reduce_scatter"):
        assert ops.get(op) == {"gloo"}, f"{op} did not go through the runtime: {ops}"
