"""Megatron-style tensor parallelism on the mcr runtime, in three tiers: `mappings` (the only
code that communicates, and its autograd pairs), `layers` (column/row-parallel linear,
vocabulary-parallel embedding, LayerNorm under sequence parallelism) and `cross_entropy`.
Groups are mcr groups (`mcr.new_group`); None means no tensor parallelism."""

from .cross_entropy import vocab_parallel_cross_entropy
from .layers import ColumnParallelLinear, LayerNorm, RowParallelLinear, VocabParallelEmbedding, divide
from .mappings import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)

__all__ = [
    "ColumnParallelLinear",
    "LayerNorm",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "copy_to_tensor_parallel_region",
    "divide",
    "gather_from_sequence_parallel_region",
    "gather_from_tensor_parallel_region",
    "reduce_from_tensor_parallel_region",
    "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region",
    "scatter_to_tensor_parallel_region",
    "vocab_parallel_cross_entropy",
]
