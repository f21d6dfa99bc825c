"""The config fields every trainer has, declared once, and their one check.

    @dataclass
    class MoEConfig(TrainerConfig):          # name, out_dir, resume, comm, checkpoint, log_interval, ...
        name: str = "moe"
        model: ModelConfig = field(default_factory=ModelConfig)
        train: TrainConfig = ...              # a subclass of this module's TrainConfig

    check_trainer(cfg)                        # in the app's validate(), before any process group

Each app adds its own model, data and train sections (its train section extends `TrainConfig`)
and checks what only it has; `check_trainer` checks the rest, with errors that name the key and
say what it accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .checkpoint import CheckpointConfig
from .comm import CommConfig, check_comm
from .config import check
from .device_check import check_device, rank_capability
from .schema import choice


@dataclass
class TrainConfig:
    steps: int = 100  # optimizer steps in the whole schedule
    lr: float = 1e-3
    seed: int = 1234
    threads: int = 0  # torch threads per rank (0: the job's CPUs per task, else cores / ranks on this node)
    stop_after: int = (
        0  # end this run after N steps (0: run to `steps`), e.g. for a job time limit; resume=true continues
    )


@dataclass
class TrainerConfig:
    name: str = "run"  # run directory: <out_dir>/<name>
    out_dir: str = "runs"
    resume: bool = False  # continue from <out_dir>/<name>/checkpoints/latest when there is one
    comm: CommConfig = field(default_factory=CommConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log_interval: int = 10  # a metrics line every N steps (and at the last)
    eval_interval: int = 0  # evaluate every N steps (0: only at the end)
    progress: bool = True  # a progress bar on rank 0 when its output is a terminal (else the step lines alone)
    wandb: str = choice("offline", "online", "disabled")


def check_trainer(cfg) -> None:
    """The checks of the fields `TrainerConfig` and `TrainConfig` declare, for every app, then
    what this rank's device rules out (apps.common.device_check)."""
    t, c = cfg.train, cfg.checkpoint
    check(t.steps >= 1, "train.steps", f"must be >= 1 (optimizer steps to train), got {t.steps}")
    check(t.lr > 0, "train.lr", f"must be > 0 (the optimizer's learning rate), got {t.lr}")
    check(t.threads >= 0, "train.threads", f"must be >= 0 (0: cores / ranks on this node), got {t.threads}")
    check(t.stop_after >= 0, "train.stop_after", f"must be >= 0 (0: run to train.steps), got {t.stop_after}")
    check(cfg.log_interval >= 1, "log_interval", f"must be >= 1 (a metrics line every N steps), got {cfg.log_interval}")
    check(
        cfg.eval_interval >= 0, "eval_interval", f"must be >= 0 (0: evaluate only at the end), got {cfg.eval_interval}"
    )
    check(c.interval >= 0, "checkpoint.interval", f"must be >= 0 (0: save only at the end), got {c.interval}")
    check(c.keep >= 0, "checkpoint.keep", f"must be >= 0 (0: keep every checkpoint), got {c.keep}")
    check_comm(cfg.comm)
    check_device(cfg, rank_capability())  # what this rank's GPU (or its lack of one) rules out
