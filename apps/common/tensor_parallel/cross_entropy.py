"""Cross-entropy over vocabulary-parallel logits (Megatron's vocab_parallel_cross_entropy):
each rank holds the logits of its slice of the vocabulary; the full softmax is never gathered.

Forward: all-reduce (max) the per-token maxima, then one all-reduce (sum) of the target's logit
(held by one rank, zero elsewhere) stacked with the local sums of exponentials. Backward needs
no communication: softmax minus one-hot on this rank's slice.
"""

from __future__ import annotations

import torch

from .mappings import all_reduce_, group_rank


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group):
        logits, target = logits.float(), target.contiguous()
        vocab_local = logits.shape[-1]
        start = group_rank(group) * vocab_local
        logits_max = all_reduce_(logits.max(dim=-1).values, group, op="max")
        shifted = logits - logits_max.unsqueeze(-1)

        outside = (target < start) | (target >= start + vocab_local)
        local_target = (target - start).masked_fill(outside, 0)
        flat = shifted.view(-1, vocab_local)
        rows = torch.arange(flat.shape[0], device=flat.device)
        target_logit = flat[rows, local_target.view(-1)].masked_fill(outside.view(-1), 0.0).view_as(target)
        exp = shifted.exp()
        sums = torch.stack([target_logit, exp.sum(dim=-1)])
        target_logit, sum_exp = all_reduce_(sums, group, op="sum")

        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_target, outside)
        return torch.log(sum_exp) - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, outside = ctx.saved_tensors
        grad = softmax.clone().view(-1, softmax.shape[-1])
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local_target.view(-1)] -= 1.0 - outside.view(-1).float()
        return grad.view_as(softmax) * grad_loss.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group=None) -> torch.Tensor:
    """Per-token loss, shaped like `target`; `logits[..., v]` is this rank's vocabulary slice."""
    return _VocabParallelCrossEntropy.apply(logits, target, group)
