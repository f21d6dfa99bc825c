"""apps/common/device_check.py on a real GPU: the capability it reads is the GPU of this rank's
local rank, and a trainer's validate() refuses bf16 exactly where that capability is below 8.0
(tests/apps/test_device_check.py gives the rule the capabilities of GPUs the machine does not have)."""

from __future__ import annotations

import os

import pytest
import torch

from apps.common.config import ConfigError, load_config
from apps.common.device_check import BF16_CAPABILITY, rank_capability
from apps.moe.config import MoEConfig, validate
from mcr.env import discover
from tests.gpu.common import needs_gpu
from tests.ranks import LAUNCHER_NAMES, LAUNCHER_PREFIXES, REPO

pytestmark = needs_gpu
TINY = os.path.join(REPO, "configs", "moe", "tiny.yaml")
PER_NODE = 3  # local ranks on the node the test plays: more than a one- or two-GPU machine has


@pytest.mark.parametrize("local_rank", range(PER_NODE))
def test_the_capability_checked_is_that_of_the_gpu_this_local_rank_takes(monkeypatch, local_rank):
    """Rank 3 + L of 6, local rank L of 3 (torchrun's variables; no other launcher's left set):
    the trainers and the runtime take GPU L % count (`mcr.streams.bind_device`), so the capability
    checked must be that GPU's. With one GPU, local ranks 1 and 2 share device 0, as under a
    launcher that shows each rank only its own GPU: a rule without the modulo asks for device 1
    and raises (invalid device ordinal); on two or four GPUs, one that reads the global rank
    (3 + L) names another GPU than the trainer takes. What one GPU cannot show: a rule that always
    reads device 0 passes there (every local rank takes device 0)."""
    for name in list(os.environ):
        if name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)
    place = {"RANK": 3 + local_rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": 6, "LOCAL_WORLD_SIZE": PER_NODE}
    for name, value in place.items():
        monkeypatch.setenv(name, str(value))
    assert discover().local_rank == local_rank  # the place the test means, as the runtime reads it
    assert rank_capability() == tuple(torch.cuda.get_device_capability(local_rank % torch.cuda.device_count()))


def test_bf16_is_refused_by_validate_exactly_below_capability_8_and_nccl_is_allowed():
    cfg = load_config(MoEConfig, ["--config", TINY, "train.precision=bf16", "comm.backend=nccl"])
    if rank_capability() < BF16_CAPABILITY:
        with pytest.raises(ConfigError, match=r"'train\.precision'.*use train\.precision=fp32"):
            validate(cfg, 1)
    else:
        validate(cfg, 1)
