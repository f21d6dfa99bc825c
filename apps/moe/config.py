"""The MoE trainer's config schema (typos are errors) and the checks a schema cannot express.

Presets live in configs/moe/; `python -m apps.moe --config configs/moe/tiny.yaml train.steps=50`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.common.checkpoint import CheckpointConfig
from apps.common.comm import CommConfig, check_comm
from apps.common.config import check, choice
from apps.common.data import DataConfig, check_data
from apps.common.parallel_dims import ParallelDims
from apps.moe.model import ModelConfig


@dataclass
class TrainConfig:
    steps: int = 100
    micro_batch: int = 8  # sequences per rank per micro-step
    grad_accum: int = 1
    lr: float = 1e-3
    warmup_steps: int = 10  # linear warm-up, then linear decay to 0 at `steps` (DeepSpeed WarmupDecayLR)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    zero_stage: int = choice(0, 1, 2)
    precision: str = choice("fp32", "bf16")
    seed: int = 1234
    threads: int = 0  # torch threads per rank (0: the job's CPUs per task, else cores / ranks on this node)
    stop_after: int = (
        0  # end this run after N steps (0: run to `steps`), e.g. for a job time limit; resume=true continues
    )


@dataclass
class MoEConfig:
    name: str = "moe"  # run directory: <out_dir>/<name>
    out_dir: str = "runs"
    resume: bool = False  # continue from <out_dir>/<name>/checkpoints/latest when there is one
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log_interval: int = 10
    eval_interval: int = 0  # validation loss every N steps (0: only at the end)
    eval_iters: int = 4  # validation batches per evaluation
    progress: bool = True  # a progress bar on rank 0 when its output is a terminal (else the step lines alone)
    wandb: str = choice("offline", "online", "disabled")


def parallel_dims(cfg, world_size: int) -> ParallelDims:
    """Every rank data parallel; experts spread over groups of `model.ep_size` ranks (0: all)."""
    return ParallelDims(world_size, ep=cfg.model.ep_size or world_size, keys={"ep": "model.ep_size"})


def validate(cfg, world_size: int) -> ParallelDims:
    """Every check that needs no process group: run before any is created. Returns the degrees."""
    m, t = cfg.model, cfg.train
    check(m.ep_size >= 0, "model.ep_size", f"must be >= 0 (0: the world size), got {m.ep_size}")
    dims = parallel_dims(cfg, world_size)
    ep = dims.ep
    check(m.d_model % m.n_head == 0, "model.d_model", f"{m.d_model} is not divisible by model.n_head={m.n_head}")
    check(m.moe_every >= 0, "model.moe_every", f"must be >= 0 (0: no MoE layers), got {m.moe_every}")
    check(m.num_experts >= 1, "model.num_experts", f"must be >= 1, got {m.num_experts}")
    check(
        m.top_k <= m.num_experts, "model.top_k", f"top-{m.top_k} needs at least {m.top_k} experts, got {m.num_experts}"
    )
    check(
        m.num_experts % ep == 0,
        "model.ep_size",
        f"expert-parallel size {ep} must divide model.num_experts={m.num_experts}",
    )
    check(m.capacity_factor > 0, "model.capacity_factor", f"must be > 0, got {m.capacity_factor}")
    for key in ("steps", "micro_batch", "grad_accum"):
        check(t[key] >= 1, f"train.{key}", f"must be >= 1, got {t[key]}")
    check(t.stop_after >= 0, "train.stop_after", f"must be >= 0, got {t.stop_after}")
    check(cfg.log_interval >= 1, "log_interval", f"must be >= 1, got {cfg.log_interval}")
    check(cfg.eval_iters >= 1, "eval_iters", f"must be >= 1, got {cfg.eval_iters}")
    check(cfg.checkpoint.interval >= 0, "checkpoint.interval", f"must be >= 0, got {cfg.checkpoint.interval}")
    check_data(cfg.data, m.vocab_size)
    check_comm(cfg.comm)
    return dims
