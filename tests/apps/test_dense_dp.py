"""Data parallelism in the dense trainer (apps.dense) against one process that reads every
replica's batches (tests/apps/scripts/dense_replicas.py): DP=2 on 2 ranks and TP=2 x DP=2 on 4.

Same seed, so the same initial weights; each replica reads its own batches, DeepSpeed averages
the gradients over the data-parallel group (through backend "mcr"), and the one process takes the
mean loss over all replicas' batches at once: the per-step losses, the validation loss and every
parameter after 8 Adam steps must agree. Tolerances as in tests/apps/test_dense.py (2e-5 on
losses ~4, fp32; only the order of some sums differs); parameters to rtol 1e-4 / atol 1e-5 (lr
1e-2: a replica's batches left out, or gradients summed instead of averaged and clipped
differently, move them by 1e-3 or more).
"""

import json
import os
import re

import pytest
import torch

from tests.apps.test_dense import TINY, TOL, losses, train
from tests.ranks import REPO, run_ranks

SCRIPT = os.path.join(REPO, "tests", "apps", "scripts", "dense_replicas.py")
MICRO_BATCH = 4  # tiny.yaml's, per replica


def reference(out_dir, name, replicas):
    """(its output, its metrics)."""
    result = run_ranks(
        1,
        [SCRIPT, str(replicas), "--config", TINY, f"out_dir={out_dir}", f"name={name}",
         f"train.micro_batch={MICRO_BATCH * replicas}"],
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.output[-6000:]
    return result.output, train_metrics(os.path.join(out_dir, name))


def train_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def final_params(run_dir, tp):
    """{name: tensor} of each TP rank's shard in the last checkpoint (ranks of one replica)."""
    ckpt = os.path.join(run_dir, "checkpoints")
    with open(os.path.join(ckpt, "latest")) as f:
        tag = f.read()
    return [
        torch.load(os.path.join(ckpt, tag, f"mp_rank_{r:02d}_model_states.pt"), weights_only=False)["module"]
        for r in range(tp)
    ]


def assert_same_params(shards, whole):
    """Each TP shard is the reference's slice along the dimension its shape is cut (whole if uncut)."""
    (ref,) = whole
    assert len(ref) > 10, sorted(ref)  # every layer's weights, not an empty state
    assert all(shard.keys() == ref.keys() for shard in shards), (sorted(shards[0]), sorted(ref))
    for name, want in ref.items():
        parts = [shard[name] for shard in shards]
        cut = [d for d in range(want.dim()) if parts[0].shape[d] != want.shape[d]]
        got = torch.cat(parts, dim=cut[0]) if cut else parts[0]
        assert got.shape == want.shape, (name, got.shape, want.shape)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
        for part in parts[1:] if not cut else ():  # a replicated parameter: every TP rank holds the same
            torch.testing.assert_close(part, want, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("tp, nprocs", [(1, 2), (2, 4)], ids=["dp2", "tp2-dp2"])
def test_data_parallel_matches_one_process_over_every_replicas_batches(tmp_path, tp, nprocs):
    replicas = nprocs // tp
    _, want = reference(str(tmp_path), "reference", replicas)
    output, got, run_dir = train(str(tmp_path), "dp", f"parallel.tensor={tp}", nprocs=nprocs)
    assert f"pp 1 x dp {replicas} x tp {tp}" in output, output[-3000:]
    assert len(got) == len(want) == 8
    assert losses(got) == pytest.approx(losses(want), abs=TOL)
    assert got[-1]["val_loss"] == pytest.approx(want[-1]["val_loss"], abs=TOL)
    assert_same_params(final_params(run_dir, tp), final_params(os.path.join(str(tmp_path), "reference"), 1))


def test_zero3_matches_one_process_over_every_replicas_batches_and_counts_the_whole_model(tmp_path):
    """ZeRO-3 (train.zero_stage=3) shards the parameters too: each rank holds half of every one,
    gathers them around its forward and backward and reduce-scatters the gradients (DeepSpeed's
    stage 3, through backend "mcr"). DP=2: the same losses, and the same final parameters, gathered
    from the checkpoint's shards by DeepSpeed's own zero_to_fp32; the banner counts the whole model,
    not the shard a rank holds (0.00M: the count broken)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    reference_output, want = reference(str(tmp_path), "reference", 2)
    output, got, run_dir = train(str(tmp_path), "zero3", "train.zero_stage=3")
    params = re.compile(r"ZeRO-(\d) fp32.* ([\d.]+M) params")
    assert params.search(output).groups() == ("3", params.search(reference_output).group(2)), output[-3000:]
    assert losses(got) == pytest.approx(losses(want), abs=TOL)
    assert got[-1]["val_loss"] == pytest.approx(want[-1]["val_loss"], abs=TOL)
    gathered = get_fp32_state_dict_from_zero_checkpoint(os.path.join(run_dir, "checkpoints"))
    assert_same_params([gathered], final_params(os.path.join(str(tmp_path), "reference"), 1))
