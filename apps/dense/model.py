"""A Megatron-style GPT built from the tensor-parallel layers in `apps.common.tensor_parallel`.

The model is a flat list of layers, which is what DeepSpeed's `PipelineModule` cuts into
stages: an embedding layer, `n_layer` transformer layers, and a head (final LayerNorm and the
vocabulary-parallel output projection; untied from the input embedding, as Megatron's
`--untie-embeddings-and-output-weights`). Activations between layers are [seq, batch, hidden]
(Megatron's layout: sequence parallelism splits dim 0). The head returns this rank's slice of
the vocabulary logits; `lm_loss` is the vocabulary-parallel cross-entropy.

Each layer draws its weights from its own generator (seed, layer index), so a layer has the
same weights whether it is built on one rank, on a tensor-parallel group (as slices) or on
any pipeline stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from apps.common.tensor_parallel import (
    ColumnParallelLinear,
    LayerNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    scatter_to_sequence_parallel_region,
    vocab_parallel_cross_entropy,
)
from apps.common.tensor_parallel.mappings import group_size


@dataclass
class ModelConfig:
    vocab_size: int = 256  # 256 = the byte-level tokenizer
    seq_len: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 64
    ffn_mult: int = 4  # MLP hidden size = ffn_mult * d_model
    init_std: float = 0.02  # output projections use init_std / sqrt(2 n_layer), as GPT-2 and Megatron


@dataclass
class TensorParallel:
    """What every layer needs to know about tensor parallelism: the mcr group (None: none)."""

    group: object = None
    sequence_parallel: bool = False


def _generator(seed: int, layer: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1009 + layer)


class Embedding(nn.Module):
    """Token ids (batch, seq) -> hidden states (seq, batch, hidden); vocabulary-parallel table,
    replicated learned positions; under sequence parallelism each rank keeps its sequence slice."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel, seed: int):
        super().__init__()
        g = _generator(seed, 0)
        self.tp = tp
        self.tok = VocabParallelEmbedding(cfg.vocab_size, cfg.d_model, tp.group, generator=g, init_std=cfg.init_std)
        self.pos = nn.Parameter(torch.empty(cfg.seq_len, cfg.d_model).normal_(0.0, cfg.init_std, generator=g))

    def forward(self, ids):
        x = (self.tok(ids) + self.pos[: ids.shape[1]]).transpose(0, 1).contiguous()
        if self.tp.sequence_parallel:
            x = scatter_to_sequence_parallel_region(x, self.tp.group)
        return x


class TransformerLayer(nn.Module):
    """Pre-LayerNorm block: causal self-attention (QKV column-parallel by heads, output
    row-parallel), then the MLP (column-parallel up, row-parallel down)."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel, seed: int, index: int):
        super().__init__()
        g = _generator(seed, index)
        d, group, sp = cfg.d_model, tp.group, tp.sequence_parallel
        out_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
        self.heads = cfg.n_head // group_size(group)  # this rank's heads
        self.head_dim = d // cfg.n_head
        self.ln1 = LayerNorm(d, group, sp)
        # QKV output features are ordered (head, q|k|v, head_dim): a contiguous slice holds whole heads
        self.qkv = ColumnParallelLinear(d, 3 * d, group, generator=g, sequence_parallel=sp, init_std=cfg.init_std)
        self.proj = RowParallelLinear(d, d, group, generator=g, sequence_parallel=sp, init_std=out_std)
        self.ln2 = LayerNorm(d, group, sp)
        hidden = cfg.ffn_mult * d
        self.fc = ColumnParallelLinear(d, hidden, group, generator=g, sequence_parallel=sp, init_std=cfg.init_std)
        self.fc_out = RowParallelLinear(hidden, d, group, generator=g, sequence_parallel=sp, init_std=out_std)

    def attention(self, x):
        qkv = self.qkv(x)  # (seq, batch, heads * 3 * head_dim), the whole sequence
        s, b, _ = qkv.shape
        q, k, v = qkv.view(s, b, self.heads, 3, self.head_dim).permute(3, 1, 2, 0, 4)  # 3 x (b, heads, s, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    """Final LayerNorm and the output projection to this rank's vocabulary slice."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel, seed: int):
        super().__init__()
        g = _generator(seed, cfg.n_layer + 1)
        self.ln = LayerNorm(cfg.d_model, tp.group, tp.sequence_parallel)
        self.out = ColumnParallelLinear(
            cfg.d_model,
            cfg.vocab_size,
            tp.group,
            generator=g,
            bias=False,
            sequence_parallel=tp.sequence_parallel,
            init_std=cfg.init_std,
        )

    def forward(self, x):
        return self.out(self.ln(x))  # (seq, batch, vocab / tp)


def layer_specs(cfg: ModelConfig, tp: TensorParallel, seed: int) -> list:
    """(class, args) for every layer in order: what `PipelineModule` builds stage by stage."""
    return (
        [(Embedding, (cfg, tp, seed))]
        + [(TransformerLayer, (cfg, tp, seed, i + 1)) for i in range(cfg.n_layer)]
        + [(Head, (cfg, tp, seed))]
    )


class GPT(nn.Sequential):
    """All layers on this rank (no pipeline): token ids -> vocabulary-parallel logits."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel, seed: int):
        super().__init__(*(cls(*args) for cls, args in layer_specs(cfg, tp, seed)))


def lm_loss(logits, targets, group=None):
    """Mean next-token loss. logits (seq, batch, vocab / tp), targets (batch, seq)."""
    return vocab_parallel_cross_entropy(logits, targets.transpose(0, 1), group).mean()


def count_params(model: nn.Module, tp: int) -> int:
    """Parameters of the whole model, from this rank's share (sliced ones count tp times; ZeRO-3's
    partitioned ones by their full size, `ds_numel`)."""
    return sum(
        getattr(p, "ds_numel", p.numel()) * (tp if getattr(p, "tensor_model_parallel", False) else 1)
        for p in model.parameters()
    )
