"""Tensor parallelism against one rank, on N real ranks (run by tests/apps/test_dense_tp.py).

    python -m launch.local -n 2 tests/apps/scripts/dense_tp.py STEPS

Every rank builds three copies of the same GPT (same seeds): the single-rank reference (no
group: no communication), the tensor-parallel model over all ranks, and the same with sequence
parallelism. Each trains STEPS Adam steps on the same batches (a new batch per step). Every
step compares the losses, and every parameter's gradient with the matching slice of the
reference's gradient (whole tensors). Prints one JSON line per rank with the largest
differences, and "OK <rank>".
"""

import json
import sys

import torch

import mcr
from apps.common.tensor_parallel import gather_from_tensor_parallel_region, scatter_to_tensor_parallel_region
from apps.dense.model import GPT, ModelConfig, TensorParallel, lm_loss

LOSS_TOL = 1e-5  # fp32, losses ~5.5: only the order of a few sums differs
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6  # relative to the gradient; atol for entries near zero


def expected_grad(ref_param, param, rank, size):
    if getattr(param, "tensor_model_parallel", False):
        return ref_param.grad.chunk(size, dim=param.partition_dim)[rank]
    return ref_param.grad


def check_scatter_gather(group):
    """The two last-dim mappings the GPT does not use: forward and backward against the math."""
    rank, n = group.rank, group.size
    x = torch.arange(6.0).view(2, 3) + 100 * rank
    x.requires_grad_(True)
    out = gather_from_tensor_parallel_region(x, group)
    want = torch.cat([torch.arange(6.0).view(2, 3) + 100 * r for r in range(n)], dim=-1)
    assert torch.equal(out, want), (out, want)
    w = torch.arange(float(out.numel())).view_as(out)
    (out * w).sum().backward()
    assert torch.equal(x.grad, w.chunk(n, dim=-1)[rank]), x.grad
    full = torch.arange(4.0 * n).view(2, 2 * n).requires_grad_(True)
    part = scatter_to_tensor_parallel_region(full, group)
    assert torch.equal(part, full.detach().chunk(n, dim=-1)[rank])
    (part * (rank + 1)).sum().backward()  # the gradient is all-gathered: every rank's slice arrives
    want = torch.cat([torch.full((2, 2), float(r + 1)) for r in range(n)], dim=-1)
    assert torch.equal(full.grad, want), full.grad


def main(steps):
    mcr.init(backend="auto", overrides={"all_reduce": "mpi", "all_gather": "gloo"})
    group = mcr.new_group()
    rank, n = group.rank, group.size
    check_scatter_gather(group)

    cfg = ModelConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32)
    models = {
        "ref": GPT(cfg, TensorParallel(None), seed=7),
        "tp": GPT(cfg, TensorParallel(group), seed=7),
        "sp": GPT(cfg, TensorParallel(group, sequence_parallel=True), seed=7),
    }
    groups = {"ref": None, "tp": group, "sp": group}
    optims = {k: torch.optim.Adam(m.parameters(), lr=1e-2) for k, m in models.items()}
    ref_params = dict(models["ref"].named_parameters())
    worst = {"loss": 0.0, "grad": 0.0}
    for step in range(steps):
        g = torch.Generator().manual_seed(step)  # the same batch on every rank, a new one each step
        x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), generator=g)
        y = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), generator=g)
        losses = {}
        for key, model in models.items():
            optims[key].zero_grad()
            loss = lm_loss(model(x), y, groups[key])
            loss.backward()
            losses[key] = loss.item()
        sp_hidden = models["sp"][0](x)  # sequence parallel: each rank holds seq_len / n positions
        assert sp_hidden.shape == (cfg.seq_len // n, 4, cfg.d_model), sp_hidden.shape
        for key in ("tp", "sp"):
            diff = abs(losses[key] - losses["ref"])
            worst["loss"] = max(worst["loss"], diff)
            assert diff <= LOSS_TOL, f"rank {rank} step {step} {key}: loss {losses[key]} vs {losses['ref']}"
            for name, param in models[key].named_parameters():
                want = expected_grad(ref_params[name], param, rank, n)
                assert param.grad.shape == want.shape, (name, param.grad.shape, want.shape)
                err = (param.grad - want).abs().max().item()
                worst["grad"] = max(worst["grad"], err / max(want.abs().max().item(), 1e-12))
                torch.testing.assert_close(param.grad, want, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=f"{key} {name}")
        for opt in optims.values():
            opt.step()
    print(json.dumps({"rank": rank, "losses": losses, "worst": worst}), flush=True)
    print(f"OK {rank}", flush=True)
    mcr.finalize()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
