"""Megatron's tensor-parallel layers (megatron/core/tensor_parallel/layers.py), communicating
only through `mappings`.

Each layer draws its full ("master") weight from the generator it is given and keeps its own
slice, as Megatron's CPU initialisation does: the same generator state gives the same model
whatever the tensor-parallel degree, so a TP run can be checked against one rank. Sliced
parameters carry `tensor_model_parallel = True` and `partition_dim`, which DeepSpeed reads to
count them once in the gradient norm.

With `sequence_parallel=True` the activations between the linear layers are split along the
sequence (dim 0 of [seq, batch, hidden]): a column-parallel layer all-gathers its input, a
row-parallel layer reduce-scatters its output, and replicated parameters that see only this
rank's tokens (LayerNorm, the row-parallel bias) all-reduce their gradients.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .mappings import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    group_rank,
    group_size,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what} {numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


def _sliced_parameter(shape, dim, group, generator, std) -> nn.Parameter:
    """This rank's slice along `dim` of a full normal(0, std) weight drawn from `generator`."""
    full = torch.empty(shape).normal_(0.0, std, generator=generator)
    part = full.chunk(group_size(group), dim=dim)[group_rank(group)].clone()
    param = nn.Parameter(part)
    param.tensor_model_parallel = group_size(group) > 1
    param.partition_dim = dim
    return param


def _sequence_parallel_grads(param, group, sequence_parallel):
    """A replicated parameter under sequence parallelism: its gradient covers this rank's tokens
    only, so it is all-reduced over the TP group (in backward, through the copy mapping)."""
    return copy_to_tensor_parallel_region(param, group) if sequence_parallel else param


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A split by rows (output features): each rank computes its slice of y."""

    def __init__(
        self,
        in_features,
        out_features,
        group=None,
        *,
        generator,
        bias=True,
        gather_output=False,
        sequence_parallel=False,
        init_std=0.02,
    ):
        super().__init__()
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        out_local = divide(out_features, group_size(group), "output features")
        self.weight = _sliced_parameter((out_features, in_features), 0, group, generator, init_std)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_local))
            self.bias.tensor_model_parallel = group_size(group) > 1
            self.bias.partition_dim = 0

    def forward(self, x):
        if self.sequence_parallel:
            x = gather_from_sequence_parallel_region(x, self.group)
        else:
            x = copy_to_tensor_parallel_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_tensor_parallel_region(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A split by columns (input features): each rank holds a slice of x and
    computes a partial y; the partial sums are all-reduced (or reduce-scattered along the
    sequence), then the replicated bias is added once."""

    def __init__(
        self,
        in_features,
        out_features,
        group=None,
        *,
        generator,
        bias=True,
        input_is_parallel=True,
        sequence_parallel=False,
        init_std=0.02,
    ):
        super().__init__()
        self.group, self.input_is_parallel, self.sequence_parallel = group, input_is_parallel, sequence_parallel
        divide(in_features, group_size(group), "input features")
        self.weight = _sliced_parameter((out_features, in_features), 1, group, generator, init_std)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x, self.group)
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(partial, self.group)
        else:
            y = reduce_from_tensor_parallel_region(partial, self.group)
        if self.bias is None:
            return y
        return y + _sequence_parallel_grads(self.bias, self.group, self.sequence_parallel)


class VocabParallelEmbedding(nn.Module):
    """The embedding table split by vocabulary rows: a rank looks up the ids in its range,
    zeros the rest, and the ranks' lookups are all-reduced."""

    def __init__(self, num_embeddings, embedding_dim, group=None, *, generator, init_std=0.02):
        super().__init__()
        self.group = group
        per_rank = divide(num_embeddings, group_size(group), "vocabulary size")
        self.vocab_start = group_rank(group) * per_rank
        self.vocab_end = self.vocab_start + per_rank
        self.weight = _sliced_parameter((num_embeddings, embedding_dim), 0, group, generator, init_std)

    def forward(self, ids):
        if group_size(self.group) == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tensor_parallel_region(out, self.group)


class LayerNorm(nn.Module):
    """LayerNorm with replicated parameters; under sequence parallelism it sees this rank's
    slice of the sequence, so its parameter gradients are all-reduced over the TP group."""

    def __init__(self, dim, group=None, sequence_parallel=False, eps=1e-5):
        super().__init__()
        self.group, self.sequence_parallel, self.eps = group, sequence_parallel, eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        weight = _sequence_parallel_grads(self.weight, self.group, self.sequence_parallel)
        bias = _sequence_parallel_grads(self.bias, self.group, self.sequence_parallel)
        return F.layer_norm(x, (x.shape[-1],), weight, bias, self.eps)
