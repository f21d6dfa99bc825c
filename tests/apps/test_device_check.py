"""apps/common/device_check.py: what a GPU's compute capability, or no GPU, rules out of a config,
given the real presets and the capabilities of a V100 (7.0), A100 (8.0), H100 (9.0) and no GPU;
then the trainers refusing such a config before any process group (in-process and launched)."""

import os

import pytest
import torch

from apps.common.config import ConfigError, load_config
from apps.common.device_check import check_device
from apps.dense.config import DenseConfig
from apps.dlrm.config import DLRMConfig
from apps.moe.config import MoEConfig
from tests.ranks import REPO, run_ranks

SCHEMAS = {"moe": MoEConfig, "dense": DenseConfig, "dlrm": DLRMConfig}
PRESETS = [(app, name) for app in SCHEMAS for name in sorted(os.listdir(os.path.join(REPO, "configs", app)))]
CAPABILITIES = [(7, 0), (8, 0), (9, 0), None]
BF16_PRESETS = {("moe", "paper-350m-128e.yaml"), ("dense", "paper-1.3b-32gpu.yaml")}  # train.precision: bf16
on_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="NCCL on a GPU is allowed: nothing to refuse")


def preset(app: str, name: str, *overrides: str):
    return load_config(SCHEMAS[app], ["--config", os.path.join(REPO, "configs", app, name), *overrides])


@pytest.mark.parametrize("capability", CAPABILITIES, ids=str)
@pytest.mark.parametrize("app, name", PRESETS)
def test_only_the_bf16_presets_are_refused_and_only_below_capability_8(app, name, capability):
    cfg = preset(app, name)
    if (app, name) in BF16_PRESETS and capability == (7, 0):
        with pytest.raises(ConfigError, match=r"'train\.precision'.*capability 7\.0.*>= 8\.0.*train\.precision=fp32"):
            check_device(cfg, capability)
    else:
        check_device(cfg, capability)


def test_the_bf16_presets_are_the_ones_the_test_expects():
    found = {(app, name) for app, name in PRESETS if preset(app, name).train.get("precision") == "bf16"}
    assert found == BF16_PRESETS


@pytest.mark.parametrize("capability", [(7, 0), (7, 5)], ids=str)
def test_bf16_asked_on_the_command_line_is_refused_on_a_gpu_before_ampere(capability):
    cfg = preset("moe", "tiny.yaml", "train.precision=bf16")
    with pytest.raises(ConfigError, match=r"bad value 'bf16' for config key 'train\.precision'"):
        check_device(cfg, capability)
    check_device(preset("moe", "tiny.yaml", "train.precision=fp32"), capability)


@pytest.mark.parametrize(
    "override, key",
    [
        ("comm.backend=nccl", "comm.backend"),
        ("comm.backend={all_to_all: nccl, default: gloo}", "comm.backend.all_to_all"),
    ],
)
@pytest.mark.parametrize("app", SCHEMAS)
def test_nccl_is_refused_without_a_gpu_naming_its_key(app, override, key):
    cfg = preset(app, "tiny.yaml", override)
    with pytest.raises(ConfigError, match=rf"'nccl' for config key '{key}': NCCL needs a GPU.*use auto, gloo or mpi"):
        check_device(cfg, None)
    for capability in CAPABILITIES[:-1]:
        check_device(cfg, capability)


@on_cpu_only
def test_the_trainer_refuses_nccl_here_before_any_process_group():
    from apps.dlrm.train import main

    with pytest.raises(ConfigError, match=r"'comm\.backend': NCCL needs a GPU"):
        main(["--config", os.path.join(REPO, "configs", "dlrm", "tiny.yaml"), "comm.backend=nccl"])
    assert not torch.distributed.is_initialized()


@on_cpu_only
def test_a_launched_trainer_with_nccl_here_exits_with_one_message_before_the_runtime_starts(tmp_path):
    tiny = os.path.join(REPO, "configs", "dlrm", "tiny.yaml")
    result = run_ranks(
        2, ["-m", "apps.dlrm", "--config", tiny, f"out_dir={tmp_path}", "comm.backend=nccl"], timeout=120
    )
    assert result.returncode != 0, result.output[-3000:]
    assert result.output.count("config error: bad value 'nccl' for config key 'comm.backend'") == 1, result.output
    assert "mcr: 2 ranks" not in result.output  # the runtime's start-up line: no process group was made
    assert not os.listdir(tmp_path)  # nor a run directory
