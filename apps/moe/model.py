"""A GPT-style decoder whose MLPs are, every `moe_every` layers, DeepSpeed MoE layers.

Token + position embeddings, pre-LayerNorm blocks (causal self-attention, then an MLP or a
`deepspeed.moe.layer.MoE` of the same MLPs), a final LayerNorm and a head tied to the token
embedding. `forward` returns the logits and the sum of the MoE layers' load-balancing losses,
which the trainer adds to the language-model loss. The MoE layers need DeepSpeed's process
groups, so build the model after the communication layer is up (`deepspeed.initialize`
then creates the expert-parallel groups).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from apps.common.schema import choice


@dataclass
class ModelConfig:
    vocab_size: int = 256  # 256 = the byte-level tokenizer
    seq_len: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 64
    ffn_mult: int = 4  # MLP hidden size = ffn_mult * d_model
    dropout: float = 0.0
    moe_every: int = 2  # every moe_every-th MLP is an MoE layer (2: every other, as DS-MoE); 0: dense model
    num_experts: int = 4
    top_k: int = choice(1, 2)  # experts per token (DeepSpeed's top-1 and top-2 gates)
    capacity_factor: float = 1.0
    eval_capacity_factor: float = 1.0
    min_capacity: int = 4
    ep_size: int = 0  # expert-parallel group size (0: the world size); divides num_experts and the world size
    drop_tokens: bool = True
    use_rts: bool = True  # random token selection (DeepSpeed's default)
    aux_loss_coef: float = 0.01  # weight of the load-balancing loss in the training loss


class MLP(nn.Module):
    def __init__(self, d_model, hidden, dropout):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.proj = nn.Linear(hidden, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, seq, width))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, use_moe: bool):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        mlp = MLP(cfg.d_model, cfg.ffn_mult * cfg.d_model, cfg.dropout)
        self.use_moe = use_moe
        if use_moe:
            from deepspeed.moe.layer import MoE  # imported here: the dense model needs no DeepSpeed

            self.mlp = MoE(
                hidden_size=cfg.d_model,
                expert=mlp,
                num_experts=cfg.num_experts,
                ep_size=cfg.ep_size,
                k=cfg.top_k,
                capacity_factor=cfg.capacity_factor,
                eval_capacity_factor=cfg.eval_capacity_factor,
                min_capacity=cfg.min_capacity,
                drop_tokens=cfg.drop_tokens,
                use_rts=cfg.use_rts,
            )
        else:
            self.mlp = mlp

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        if not self.use_moe:
            return x + self.mlp(self.ln2(x)), x.new_zeros(())
        out, aux_loss, _expert_counts = self.mlp(self.ln2(x))
        return x + out, aux_loss


class GPTMoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg, use_moe=cfg.moe_every > 0 and (i + 1) % cfg.moe_every == 0) for i in range(cfg.n_layer)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx):
        """idx: (batch, seq) token ids -> (logits (batch, seq, vocab), summed MoE aux loss)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        aux_total = x.new_zeros(())
        for block in self.blocks:
            x, aux = block(x)
            aux_total = aux_total + aux
        return self.head(self.ln_f(x)), aux_total

    def num_moe_layers(self) -> int:
        return sum(b.use_moe for b in self.blocks)


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def count_params(model: nn.Module) -> tuple[int, int]:
    """(parameters on this rank, of which expert parameters)."""
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".deepspeed_moe.experts." in n)
    return total, expert
