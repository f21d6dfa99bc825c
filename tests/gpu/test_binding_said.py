"""At start-up rank 0 names each node's ranks and their GPUs, and says loudly where two ranks share
one (NCCL then leaves every group holding both); MCR_STRICT_BINDING=1 makes that an error on every
rank. Two ranks on this machine's one GPU are such a pair. The preflight (mcr.tools.preflight)
fails them too, naming the rank and the fix, and passes one rank with its GPU and that GPU's cores."""

from __future__ import annotations

import re

from tests.gpu.common import launch, needs_gpu

pytestmark = needs_gpu


def test_two_ranks_on_one_gpu_are_named_at_start_up_and_strict_binding_stops_both():
    said = launch(2, "tests.gpu.scripts.start_only", timeout=120)
    assert said.returncode == 0, said.output[-3000:]
    assert re.search(r"mcr: node \S+: rank 0 cuda:0 GPU-\w{8}, rank 1 cuda:0 GPU-\w{8}", said.output), said.output
    assert said.output.count("mcr: WARNING: ranks 0 and 1 on node") == 1 and "SHARE GPU GPU-" in said.output
    strict = launch(2, "tests.gpu.scripts.start_only", env={"MCR_STRICT_BINDING": "1"}, timeout=120)
    assert strict.returncode not in (0, None), strict.output[-3000:]
    assert strict.output.count("BindingError: mcr: MCR_STRICT_BINDING=1 and ranks 0 and 1 on node") == 2, strict.output


def test_preflight_fails_two_ranks_on_one_gpu_and_passes_one_rank_with_its_gpus_cores():
    shared = launch(2, "mcr.tools.preflight", timeout=180)
    assert shared.returncode not in (0, None), shared.output[-3000:]
    assert re.search(
        r"rank 1 \(\S+\) shares GPU GPU-[\w-]+ with rank 0, so NCCL cannot run between them", shared.output
    )
    assert "preflight: " in shared.output and "problem(s)" in shared.output
    alone = launch(1, "mcr.tools.preflight", timeout=180)
    assert alone.returncode == 0, alone.output[-3000:]
    row = re.search(r"^0 +\S+ +0 +\S+ +cuda:0 GPU-\w+ +(\S+) +\S+ +(\S+) +(\S+) +(\S+)$", alone.output, re.M)
    assert row and row.group(2) == "ok" and row.group(3) == "ok" and row.group(4) == "ok", (
        alone.output
    )  # nccl, gloo, mpi
    assert "preflight: every check passed (1 ranks on 1 node(s))" in alone.output
