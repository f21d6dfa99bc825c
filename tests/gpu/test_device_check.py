"""apps/common/device_check.py on a real GPU: the capability it reads is this GPU's, and a trainer's
validate() refuses bf16 exactly where that capability is below 8.0 (tests/apps/test_device_check.py
gives the rule the capabilities of GPUs the machine does not have)."""

from __future__ import annotations

import os

import pytest
import torch

from apps.common.config import ConfigError, load_config
from apps.common.device_check import BF16_CAPABILITY, rank_capability
from apps.moe.config import MoEConfig, validate
from tests.gpu.common import needs_gpu
from tests.ranks import REPO

pytestmark = needs_gpu
TINY = os.path.join(REPO, "configs", "moe", "tiny.yaml")


def test_the_capability_checked_is_this_gpus():
    assert rank_capability() == tuple(torch.cuda.get_device_capability(0))


def test_bf16_is_refused_by_validate_exactly_below_capability_8_and_nccl_is_allowed():
    cfg = load_config(MoEConfig, ["--config", TINY, "train.precision=bf16", "comm.backend=nccl"])
    if rank_capability() < BF16_CAPABILITY:
        with pytest.raises(ConfigError, match=r"'train\.precision'.*use train\.precision=fp32"):
            validate(cfg, 1)
    else:
        validate(cfg, 1)
