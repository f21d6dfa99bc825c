"""Tensor-parallel layers (apps.common.tensor_parallel) on 2 real ranks against one rank.

Tolerance: fp32 throughout. Tensor parallelism changes only the order of some sums (a
row-parallel matmul adds two half-width partial products; the cross-entropy sums its
exponentials per vocabulary slice), so losses agree to ~5e-7 and gradients to ~6e-6 of their
largest entry over 6 Adam steps; the script allows 1e-5 (loss) and rtol 1e-4 / atol 1e-6 (grads).
"""

import json

from tests.ranks import REPO, run_script


def test_tensor_and_sequence_parallel_match_one_rank_in_loss_and_every_gradient():
    result = run_script(2, f"{REPO}/tests/apps/scripts/dense_tp.py", 6, timeout=240).check()
    assert result.output.count("OK ") == 2, result.output[-3000:]
    reports = [json.loads(line) for line in result.output.splitlines() if line.startswith('{"rank"')]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for r in reports:
        assert r["losses"]["tp"] != 0 and r["worst"]["loss"] <= 1e-5
