"""TorchRec on the runtime: sharders that offer every sharding type on CPU.

TorchRec's embedding-bag sharder lists only table-wise, column-wise, table-column-wise and
data-parallel for CPU; row-wise and table-row-wise work there too (fbgemm's fused CPU kernel
runs each row shard), so `RowWiseCPUSharder` offers them. With `backend="mcr"` the sharded
model's KJT input exchange (uneven all-to-all), pooled-embedding all-to-all and reduce-scatter,
and DDP's dense all-reduce all go through the runtime.

    from mcr.hooks.torchrec import cpu_sharders
    model = DistributedModelParallel(dlrm, device=torch.device("cpu"), sharders=cpu_sharders())
"""

from __future__ import annotations

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ShardingType

_ROW_SHARDINGS = [ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value]


class RowWiseCPUSharder(EmbeddingBagCollectionSharder):
    """EmbeddingBagCollectionSharder that also offers row-wise and table-row-wise on CPU."""

    def sharding_types(self, compute_device_type: str) -> list:
        types = super().sharding_types(compute_device_type)
        if compute_device_type == "cpu":
            types += [t for t in _ROW_SHARDINGS if t not in types]
        return types


def cpu_sharders(fused_params=None) -> list:
    """The sharders to hand DistributedModelParallel (and the planner) on CPU."""
    return [RowWiseCPUSharder(fused_params=fused_params)]
