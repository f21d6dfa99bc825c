"""The DLRM of TorchRec's example (`torchrec.models.dlrm`), its tables, and a table init that
does not depend on the sharding.

    model = build_model(cfg.model)          # DLRMTrain(DLRM or DLRM_DCN), tables on the meta device
    ... DistributedModelParallel(model, ...)
    init_tables(dmp_model, seed)            # each rank fills the rows and columns it holds

Why our own init: TorchRec initialises each shard of a meta-device table on its own, so a
row-wise and a table-wise run of the same seed would start from different tables. Here a
table's rows are drawn in fixed blocks from generators seeded by (seed, table, block), and each
rank draws only the blocks that overlap its shards: every sharding, and an unsharded model,
starts from the same weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, INT_FEATURE_COUNT
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain

from apps.common.config import choice

INIT_BLOCK_ROWS = 4096


@dataclass
class ModelConfig:
    interaction: str = choice("dot", "dcn")  # dot: DLRM's pairwise dot products; dcn: DLRM_DCN's cross net
    embedding_dim: int = 16
    num_embeddings: int = 1000  # rows of every table, unless num_embeddings_per_feature is given
    num_embeddings_per_feature: Optional[List[int]] = None  # 26 values, one per Criteo category
    dense_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 16])  # the last = embedding_dim
    over_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 1])  # the last = 1 (the logit)
    dcn_num_layers: int = 3  # interaction=dcn only
    dcn_low_rank_dim: int = 64  # interaction=dcn only


def table_rows(cfg: ModelConfig) -> list:
    return list(cfg.num_embeddings_per_feature or [cfg.num_embeddings] * len(DEFAULT_CAT_NAMES))


def table_names() -> list:
    return [f"t_{name}" for name in DEFAULT_CAT_NAMES]


def build_model(cfg: ModelConfig, device: torch.device) -> DLRMTrain:
    """DLRMTrain (the loss inside, as TorchRec's pipeline expects) around DLRM or DLRM_DCN; the
    tables on the meta device, so no rank allocates a table before it is sharded."""
    tables = [
        EmbeddingBagConfig(name=name, embedding_dim=cfg.embedding_dim, num_embeddings=rows, feature_names=[feature])
        for name, feature, rows in zip(table_names(), DEFAULT_CAT_NAMES, table_rows(cfg))
    ]
    common = dict(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        dense_in_features=INT_FEATURE_COUNT,
        dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
        over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
        dense_device=device,
    )
    if cfg.interaction == "dcn":
        dlrm = DLRM_DCN(**common, dcn_num_layers=cfg.dcn_num_layers, dcn_low_rank_dim=cfg.dcn_low_rank_dim)
    else:
        dlrm = DLRM(**common)
    return DLRMTrain(dlrm)


def table_block(seed: int, table: int, block: int, rows: int, dim: int) -> torch.Tensor:
    """Rows [block * INIT_BLOCK_ROWS, ...) of table `table`: uniform in +-sqrt(1/rows), TorchRec's default."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + table) * 1_000_033 + block)
    n = min(INIT_BLOCK_ROWS, rows - block * INIT_BLOCK_ROWS)
    bound = math.sqrt(1.0 / rows)
    return torch.empty(n, dim).uniform_(-bound, bound, generator=g)


def fill_rows(out: torch.Tensor, seed: int, table: int, rows: int, dim: int, row0: int = 0, col0: int = 0) -> None:
    """Fill `out` with rows [row0, row0 + len(out)) and columns [col0, col0 + out.shape[1]) of the table."""
    r, c = out.shape
    for block in range(row0 // INIT_BLOCK_ROWS, (row0 + r - 1) // INIT_BLOCK_ROWS + 1):
        data = table_block(seed, table, block, rows, dim)
        lo = max(row0, block * INIT_BLOCK_ROWS)
        hi = min(row0 + r, block * INIT_BLOCK_ROWS + len(data))
        out[lo - row0 : hi - row0] = data[lo - block * INIT_BLOCK_ROWS : hi - block * INIT_BLOCK_ROWS, col0 : col0 + c]


@torch.no_grad()
def init_tables(model: torch.nn.Module, cfg: ModelConfig, seed: int) -> None:
    """Give every table the sharding-independent weights; a sharded model's ranks each fill
    the shards they hold (ShardedTensor local shards), a replicated table is filled whole."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    index = {name: i for i, name in enumerate(table_names())}
    rows = table_rows(cfg)
    state = model.state_dict()
    for key, value in state.items():
        parts = key.split(".")
        if len(parts) < 3 or parts[-3] != "embedding_bags" or parts[-1] != "weight":
            continue
        t = index[parts[-2]]
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                row0, col0 = shard.metadata.shard_offsets
                fill_rows(shard.tensor, seed, t, rows[t], cfg.embedding_dim, row0, col0)
        else:
            fill_rows(value, seed, t, rows[t], cfg.embedding_dim)
