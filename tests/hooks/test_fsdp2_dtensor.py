"""FSDP2 and DTensor, which reach the backend through torch's functional collectives (C++ ops),
on backend "mcr": the same losses as on gloo, and redistributes equal to the whole tensors."""

import torch

from tests.hooks.common import assert_same_losses, families, run, tagged


def expected_redistributes(n):
    whole = torch.arange(4 * n * 3, dtype=torch.float32).view(4 * n, 3)
    partial_sum = sum(torch.full((2 * n, 3), float(r + 1)) for r in range(n)) + n * torch.arange(
        2 * n * 3, dtype=torch.float32
    ).view(2 * n, 3)
    return {
        "shard->replicate": whole.tolist(),
        "replicate->shard(1)": whole.tolist(),
        "partial->replicate": partial_sum.tolist(),
        "partial->shard(0)": partial_sum.tolist(),
    }


def test_fsdp2_and_dtensor_on_mcr_match_gloo_and_the_whole_tensors():
    out = run("scripts/fsdp2.py", "mcr")
    baseline = run("scripts/fsdp2.py", "gloo", launcher="torchrun")
    assert_same_losses(tagged(out, "LOSSES"), tagged(baseline, "LOSSES"))
    want = expected_redistributes(2)
    for rank, got in tagged(out, "DTENSOR").items():
        assert got == want, f"rank {rank}: {got} != {want}"
    for rank in ("0", "1"):
        used = families(tagged(out, "COMMLOG")[f"all {rank}"])
        assert used.get("all_gather") == {"mpi"} and used.get("reduce_scatter") == {"mpi"}, used  # FSDP2, chosen
        assert used.get("all_reduce") == {"mpi"}, used  # DTensor's Partial -> Replicate
