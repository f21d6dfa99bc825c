"""The training loop the hooks' scripts share (imported from the script's own folder): SGD on an
MSE fit of a small model, data distinct per rank and step, so that a wrong reduction shows."""

import torch
import torch.nn as nn


def losses(model, opt, rank: int, steps: int) -> list:
    """`steps` steps of `model` (16 x 8 in, 16 x 4 out); `opt` None: the model steps itself
    (DDP's fused optimizer)."""
    out = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)  # distinct data per rank and step
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        if opt is not None:
            opt.zero_grad()
        loss.backward()
        if opt is not None:
            opt.step()
        out.append(loss.item())
    return out
