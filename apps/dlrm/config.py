"""The DLRM trainer's config schema (typos are errors) and the checks a schema cannot express.

Presets live in configs/dlrm/; `python -m apps.dlrm --config configs/dlrm/tiny.yaml train.steps=50`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apps.common.config import ConfigError, check
from apps.common.trainer_config import TrainConfig, TrainerConfig, check_trainer
from apps.dlrm.data import DataConfig, check_data
from apps.dlrm.model import ModelConfig, table_names

# TorchRec's names; row-wise and table-row-wise on CPU come from mcr.hooks.torchrec's sharder.
SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")


@dataclass
class ShardingConfig:
    # null: TorchRec's planner chooses per table; one type for every table; or {table: type}
    # (tables are t_cat_0 ... t_cat_25; a table left out is the planner's choice)
    types: Any = None
    memory_gb: float = 0.0  # memory per rank the planner may fill (0: TorchRec's default for the device)


@dataclass
class DLRMTrainConfig(TrainConfig):  # steps, lr, seed, threads, stop_after
    lr: float = 0.05  # the dense part's Adagrad
    batch_size: int = 512  # samples per rank per step
    embedding_lr: float = 0.05  # the tables' row-wise Adagrad, fused into the backward
    eps: float = 1e-8
    pipeline: bool = True  # TorchRec's TrainPipelineSparseDist (input exchange overlaps compute)


@dataclass
class DLRMConfig(TrainerConfig):  # name, out_dir, resume, comm, checkpoint, log_interval, eval_interval, ...
    name: str = "dlrm"
    model: ModelConfig = field(default_factory=ModelConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: DLRMTrainConfig = field(default_factory=DLRMTrainConfig)
    eval_batches: int = 4  # held-out batches per rank per evaluation (log loss and AUC)


def sharding_types(cfg) -> dict:
    """{table: sharding type} for the tables the config pins; the others are the planner's."""
    types = cfg.sharding.types
    if types is None:
        return {}
    if isinstance(types, str):
        return {t: types for t in table_names()}
    return dict(types.items())


def validate(cfg) -> None:
    """Every check that needs no process group: run before any is created."""
    m, t = cfg.model, cfg.train
    types = cfg.sharding.types
    if not (types is None or isinstance(types, str) or hasattr(types, "items")):
        raise ConfigError(f"bad value {types!r} for config key 'sharding.types'; give null, one type, or a map")
    for table, kind in sharding_types(cfg).items():
        if table not in table_names():
            raise ConfigError(
                f"unknown table {table!r} in config key 'sharding.types'; tables are t_cat_0 ... t_cat_25"
            )
        if kind not in SHARDING_TYPES:
            where = "sharding.types" if isinstance(types, str) else f"sharding.types.{table}"
            raise ConfigError(
                f"unknown sharding type {kind!r} for config key '{where}'; choose one of {', '.join(SHARDING_TYPES)}"
            )
    check(cfg.sharding.memory_gb >= 0, "sharding.memory_gb", f"must be >= 0, got {cfg.sharding.memory_gb}")
    rows = m.num_embeddings_per_feature
    if rows is not None:
        check(len(rows) == 26, "model.num_embeddings_per_feature", f"needs 26 values (one per table), got {len(rows)}")
        check(min(rows) >= 1, "model.num_embeddings_per_feature", f"every table needs >= 1 row, got {list(rows)}")
    check(m.num_embeddings >= 1, "model.num_embeddings", f"must be >= 1, got {m.num_embeddings}")
    check(m.embedding_dim >= 1, "model.embedding_dim", f"must be >= 1, got {m.embedding_dim}")
    check(
        len(m.dense_arch_layer_sizes) >= 1 and m.dense_arch_layer_sizes[-1] == m.embedding_dim,
        "model.dense_arch_layer_sizes",
        f"the last size must equal model.embedding_dim={m.embedding_dim}, got {list(m.dense_arch_layer_sizes)}",
    )
    check(
        len(m.over_arch_layer_sizes) >= 1 and m.over_arch_layer_sizes[-1] == 1,
        "model.over_arch_layer_sizes",
        f"the last size must be 1 (the click logit), got {list(m.over_arch_layer_sizes)}",
    )
    check(t.batch_size >= 1, "train.batch_size", f"must be >= 1, got {t.batch_size}")
    for key in ("embedding_lr", "eps"):
        check(t[key] > 0, f"train.{key}", f"must be > 0, got {t[key]}")
    check(cfg.eval_batches >= 1, "eval_batches", f"must be >= 1, got {cfg.eval_batches}")
    check_data(cfg.data)
    check_trainer(cfg)
