"""DeepSpeed where each rank sees one GPU (jsrun resource sets, Polaris' affinity script,
`srun --gpus-per-task=1`): two ranks, each with CUDA_VISIBLE_DEVICES=0. mcr binds cuda:0 on both
(local rank % 1); DeepSpeed named its device by LOCAL_RANK, so local rank 1 died with "invalid
device ordinal" in the engine (`set_device(1)`) and in ZeRO-3 (`device_name(LOCAL_RANK)`).

What DeepSpeed takes, on the real GPU (tests/hooks/scripts/deepspeed_device.py; its CPU twin is
in tests/hooks/test_deepspeed.py), then the trainers: the MoE tiny preset and the dense tiny
preset under ZeRO-3, each a few steps.
"""

from __future__ import annotations

import json
import os

from tests.gpu.common import launch, needs_gpu
from tests.ranks import REPO
from tests.report import tagged

pytestmark = needs_gpu
ONE_GPU = {"CUDA_VISIBLE_DEVICES": "0"}


def test_deepspeed_engine_and_zero3_take_the_bound_device_on_every_rank():
    result = launch(2, "tests.hooks.scripts.deepspeed_device", "gpu", env=ONE_GPU, timeout=120)
    got = tagged(result.output, "DEVICE")
    assert sorted(got) == ["0", "1"] and result.returncode == 0, result.output[-4000:]
    for rank in (0, 1):
        seen = got[str(rank)]
        assert seen["launcher local rank"] == seen["engine local_rank"] == rank, seen
        for key in ("mcr", "engine device", "zero3 local_device", "current device"):
            assert seen[key] == "cuda:0", (rank, key, seen)
        assert seen["engine set_device"] == seen["zero3 set_device"] == ["cuda:0"], seen


def train(tmp_path, app: str, preset: str, *overrides) -> list:
    """Run a trainer's preset on the two ranks for 4 steps; its metrics (rank 0's lines)."""
    out = str(tmp_path)
    args = ["--config", os.path.join(REPO, "configs", preset), f"out_dir={out}", "name=run", "train.steps=4"]
    result = launch(2, app, *args, "log_interval=1", *overrides, env=ONE_GPU, timeout=120)
    assert result.returncode == 0, result.output[-6000:]
    with open(os.path.join(out, "run", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_moe_tiny_trains_on_two_ranks_that_each_see_one_gpu(tmp_path):
    metrics = train(tmp_path, "apps.moe", "moe/tiny.yaml")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4], metrics


def test_dense_tiny_under_zero3_trains_on_two_ranks_that_each_see_one_gpu(tmp_path):
    metrics = train(tmp_path, "apps.dense", "dense/tiny.yaml", "train.zero_stage=3")
    with open(os.path.join(tmp_path, "run", "ds_config.json")) as f:
        assert json.load(f)["zero_optimization"] == {"stage": 3}
    assert [m["step"] for m in metrics] == [1, 2, 3, 4], metrics
