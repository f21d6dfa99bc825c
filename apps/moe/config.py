"""The MoE trainer's config schema (typos are errors) and the checks a schema cannot express.

Presets live in configs/moe/; `python -m apps.moe --config configs/moe/tiny.yaml train.steps=50`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.common.config import check
from apps.common.data import DataConfig, check_data
from apps.common.deepspeed_config import DeepSpeedTrainConfig, check_deepspeed_train
from apps.common.parallel_dims import ParallelDims
from apps.common.trainer_config import TrainerConfig, check_trainer
from apps.moe.model import ModelConfig


@dataclass
class MoEConfig(TrainerConfig):  # name, out_dir, resume, comm, checkpoint, log_interval, eval_interval, ...
    name: str = "moe"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: DeepSpeedTrainConfig = field(default_factory=DeepSpeedTrainConfig)
    eval_iters: int = 4  # validation batches per evaluation


def parallel_dims(cfg, world_size: int) -> ParallelDims:
    """Every rank data parallel; experts spread over groups of `model.ep_size` ranks (0: all)."""
    return ParallelDims(world_size, ep=cfg.model.ep_size or world_size, keys={"ep": "model.ep_size"})


def validate(cfg, world_size: int) -> ParallelDims:
    """Every check that needs no process group: run before any is created. Returns the degrees."""
    m = cfg.model
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
    check(cfg.eval_iters >= 1, "eval_iters", f"must be >= 1, got {cfg.eval_iters}")
    check_data(cfg.data, m.vocab_size)
    check_trainer(cfg)
    check_deepspeed_train(cfg.train)
    return dims
