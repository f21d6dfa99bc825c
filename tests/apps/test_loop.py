"""What the three trainers share, checked once for all of them (in-process, no process group):
the config fields every trainer has, and where a run ends. The loop itself runs in every
trainer's own tests (test_moe, test_dense, test_dlrm) and in test_faults."""

import os

import pytest

from apps.common.config import ConfigError, load_config
from apps.common.loop import Cadence, end_step
from tests.ranks import REPO


def validated(app: str, *overrides: str):
    """Load configs/<app>/tiny.yaml with `overrides` and run the app's own validate()."""
    argv = ["--config", os.path.join(REPO, "configs", app, "tiny.yaml"), *overrides]
    if app == "moe":
        from apps.moe.config import MoEConfig, validate

        return validate(load_config(MoEConfig, argv), 2)
    if app == "dense":
        from apps.dense.config import DenseConfig, validate

        return validate(load_config(DenseConfig, argv), 2)
    from apps.dlrm.config import DLRMConfig, validate

    return validate(load_config(DLRMConfig, argv))


@pytest.mark.parametrize("app", ["moe", "dense", "dlrm"])
@pytest.mark.parametrize(
    "override, message",
    [
        ("eval_interval=-1", r"'eval_interval': must be >= 0 \(0: evaluate only at the end\), got -1"),
        ("train.lr=0", r"'train\.lr': must be > 0 .*got 0"),
        ("train.steps=0", r"'train\.steps': must be >= 1"),
        ("train.stop_after=-1", r"'train\.stop_after': must be >= 0 \(0: run to train\.steps\)"),
        ("log_interval=0", r"'log_interval': must be >= 1"),
        ("checkpoint.interval=-2", r"'checkpoint\.interval': must be >= 0"),
        ("checkpoint.keep=-1", r"'checkpoint\.keep': must be >= 0"),
        ("comm.backend=nccl2", r"'comm\.backend'; choose one of auto, mpi, gloo, nccl"),
    ],
)
def test_every_trainer_refuses_a_shared_field_out_of_range_naming_the_key(app, override, message):
    with pytest.raises(ConfigError, match=message):
        validated(app, override)


@pytest.mark.parametrize("app", ["moe", "dense", "dlrm"])
def test_every_trainer_has_the_shared_top_level_keys(app):
    with pytest.raises(ConfigError, match=r"valid keys at the top level: name, out_dir, resume, comm, checkpoint"):
        validated(app, "no_such_key=1")


def test_a_run_ends_at_train_steps_or_stop_after_steps_past_its_start():
    class Train:
        steps, stop_after = 30, 0

    assert end_step(Train, 0) == 30
    Train.stop_after = 13
    assert (end_step(Train, 0), end_step(Train, 13), end_step(Train, 26)) == (13, 26, 30)


def test_a_run_evaluates_every_eval_interval_steps_on_a_line_of_its_own_between_log_steps():
    # eval_interval 5 with log_interval 2 evaluated at step 10 only: evaluation ran on log steps
    from apps.moe.config import MoEConfig

    def loaded(*overrides):
        return load_config(MoEConfig, ["--config", os.path.join(REPO, "configs", "moe", "tiny.yaml"), *overrides])

    cfg = loaded("train.steps=10", "log_interval=2", "eval_interval=5")
    cadence = Cadence(cfg, end_step(cfg.train, 0))
    steps = range(1, 11)
    assert [s for s in steps if cadence.evaluates_at(s)] == [5, 10]
    assert [s for s in steps if cadence.logs_at(s)] == [2, 4, 5, 6, 8, 10]
    cadence = Cadence(loaded("train.steps=10", "eval_interval=0", "log_interval=4"), 10)
    assert [s for s in steps if cadence.evaluates_at(s)] == [10]  # 0: at the end only
    assert [s for s in steps if cadence.logs_at(s)] == [4, 8, 10]
