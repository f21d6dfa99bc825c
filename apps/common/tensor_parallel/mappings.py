"""Tensor-parallel communication, in Megatron's shape (megatron/core/tensor_parallel/mappings.py).

Tier 1, the private helpers at the top, are the only code here that communicates: each calls
the mcr runtime (`mcr.all_reduce`, `mcr.all_gather_into_tensor`, `mcr.reduce_scatter_tensor`)
on the tensor-parallel group, so every call's backend is chosen per tensor. Tier 2 pairs them
into autograd functions whose backward is the forward's opposite. Tier 3, the public wrappers
at the bottom, are what the layers call.

A group of None (or of one rank) is no tensor parallelism: every mapping is the identity, so
the same layers build the single-rank reference model without any communication.

Layouts: the "last dim" mappings split hidden features (column/row-parallel linears); the
"first dim" mappings split the sequence (sequence parallelism; activations are [seq, batch, hidden]).
"""

from __future__ import annotations

import torch

import mcr


# --- tier 1: the only calls into the runtime -----------------------------------------------------
def group_size(group) -> int:
    return 1 if group is None else group.size


def group_rank(group) -> int:
    return 0 if group is None else group.rank


def all_reduce_(tensor: torch.Tensor, group, op: str = "sum") -> torch.Tensor:
    """In place over the group (plain, no autograd): for the vocab-parallel cross-entropy."""
    if group_size(group) > 1:
        mcr.all_reduce(tensor, op=op, group=group)
    return tensor


def _reduce(x, group):
    """All-reduce (sum) a fresh contiguous copy: autograd may still hold `x`."""
    if group_size(group) == 1:
        return x
    out = x.contiguous().clone()
    mcr.all_reduce(out, group=group)
    return out


def _split_last_dim(x, group):
    n = group_size(group)
    if n == 1:
        return x
    return x.chunk(n, dim=-1)[group_rank(group)].contiguous()


def _gather_last_dim(x, group):
    n = group_size(group)
    if n == 1:
        return x
    out = x.new_empty((n * x.shape[0],) + tuple(x.shape[1:]))
    mcr.all_gather_into_tensor(out, x.contiguous(), group=group)
    return torch.cat(out.chunk(n, dim=0), dim=-1).contiguous()


def _split_first_dim(x, group):
    n = group_size(group)
    if n == 1:
        return x
    return x.chunk(n, dim=0)[group_rank(group)].contiguous()


def _gather_first_dim(x, group):
    n = group_size(group)
    if n == 1:
        return x
    out = x.new_empty((n * x.shape[0],) + tuple(x.shape[1:]))
    mcr.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _reduce_scatter_first_dim(x, group):
    n = group_size(group)
    if n == 1:
        return x
    out = x.new_empty((x.shape[0] // n,) + tuple(x.shape[1:]))
    mcr.reduce_scatter_tensor(out, x.contiguous(), group=group)
    return out


# --- tier 2: autograd pairs, backward = the forward's opposite -----------------------------------
class _CopyToTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _reduce(grad, ctx.group), None


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last_dim(grad, ctx.group), None


class _GatherFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_last_dim(grad, ctx.group), None


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first_dim(grad, ctx.group), None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather the sequence before a column-parallel linear; its input gradient is a partial
    sum on each rank (each holds some of the features), so backward reduce-scatters it."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_first_dim(grad, ctx.group), None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first_dim(grad, ctx.group), None


# --- tier 3: what the layers call ------------------------------------------------------------------
def copy_to_tensor_parallel_region(x, group):
    """Identity forward; all-reduce the gradient (the input feeds every rank's shard)."""
    return _CopyToTensorParallelRegion.apply(x, group)


def reduce_from_tensor_parallel_region(x, group):
    """All-reduce the partial sums of a row-parallel layer; identity backward."""
    return _ReduceFromTensorParallelRegion.apply(x, group)


def scatter_to_tensor_parallel_region(x, group):
    """Keep this rank's slice of the last dim; all-gather the gradient."""
    return _ScatterToTensorParallelRegion.apply(x, group)


def gather_from_tensor_parallel_region(x, group):
    """All-gather the last dim; keep this rank's slice of the gradient."""
    return _GatherFromTensorParallelRegion.apply(x, group)


def scatter_to_sequence_parallel_region(x, group):
    """Keep this rank's slice of the sequence (dim 0); all-gather the gradient."""
    return _ScatterToSequenceParallelRegion.apply(x, group)


def gather_from_sequence_parallel_region(x, group):
    """All-gather the sequence (dim 0); reduce-scatter the gradient."""
    return _GatherFromSequenceParallelRegion.apply(x, group)


def reduce_scatter_to_sequence_parallel_region(x, group):
    """Reduce-scatter partial sums along the sequence (dim 0); all-gather the gradient."""
    return _ReduceScatterToSequenceParallelRegion.apply(x, group)
