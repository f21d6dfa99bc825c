"""Train a DeepSpeed-MoE model (expert parallel 2) and a ZeRO-2 model on 2 ranks, on CPU.

    DS_ACCELERATOR=cpu python -m launch.local -n 2 -m tests.hooks.scripts.deepspeed_hook mcr|gloo

"gloo": stock `deepspeed.init_distributed("gloo")`. "mcr": `mcr.hooks.deepspeed.install()` instead
of it. "after": `deepspeed.init_distributed("gloo")`, then `install()`.
Every rank prints `LOSSES <model> <rank> <json>`; in mcr mode also `COMMLOG <rank> <json>`
(the runtime's rows: op family, backend, bytes, count).
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: E402

from tests.hooks import stock_exit  # noqa: E402
from tests.report import report

HIDDEN, STEPS, MICRO = 16, 4, 8


class MoENet(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, HIDDEN)
        expert = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN))
        # drop_tokens=False: the gate all-reduces the largest expert load (the gating all-reduce)
        self.moe = MoE(hidden_size=HIDDEN, expert=expert, num_experts=2, ep_size=2, k=1, drop_tokens=False)
        self.out = nn.Linear(HIDDEN, 4)

    def forward(self, x):
        h, aux, _ = self.moe(torch.relu(self.inp(x)))
        return self.out(h), aux


class DenseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.body(x), torch.zeros(())


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(MICRO, 8, generator=g), torch.randn(MICRO, 4, generator=g)


def train(name, model, zero_stage, rank, world):
    params = [{"params": list(model.parameters()), "name": "all"}]
    if zero_stage:
        params = split_params_into_different_moe_groups_for_optimizer(params)
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "train_batch_size": MICRO * world,
        "zero_optimization": {
            "stage": zero_stage,
            "reduce_bucket_size": 500,
            "allgather_bucket_size": 500,
            "contiguous_gradients": False,
        },  # ZeRO-3: reduce-scatter the gradients
        "zero_allow_untested_optimizer": True,  # torch SGD: no JIT-built DeepSpeed optimizer
        "steps_per_print": 10**6,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(params, lr=0.1), config=config)
    losses = []
    for step in range(STEPS):
        x, y = batch(rank, step)
        out, aux = engine(x)
        loss = nn.functional.mse_loss(out, y) + 0.01 * aux
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    report("LOSSES", name, rank, value=losses)


def main(mode):
    if mode in ("gloo", "after"):
        deepspeed.init_distributed(dist_backend="gloo")
    if mode in ("mcr", "after"):
        import mcr.hooks.deepspeed

        mcr.hooks.deepspeed.install({"backend": "auto", "comm_log": True})
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    torch.manual_seed(0)
    train("moe", MoENet(), 0, rank, world)
    torch.manual_seed(0)
    train("zero2", DenseNet(), 2, rank, world)
    torch.manual_seed(0)
    train("zero3", DenseNet(), 3, rank, world)
    if mode != "gloo":
        import mcr

        rows = [[r["op"], r["backend"], r["bytes"], r["count"]] for r in mcr.runtime().comm_log.rows()]
        report("COMMLOG", rank, value=rows)
    # DeepSpeed's engines hold plain gloo groups in every mode (its own helper groups), so every
    # mode leaves as stock torch's gloo reference runs do
    stock_exit.leave()


if __name__ == "__main__":
    main(sys.argv[1])
