"""The MoE trainer's reference without mcr: stock DeepSpeed on plain gloo, mcr never imported.

    torchrun --nproc-per-node 2 moe_stock_deepspeed.py RUN_DIR OUT.json

Reads the resolved config.yaml, ds_config.json and summary.json (its thread count) an `apps.moe`
run wrote in RUN_DIR, builds the same model with the same seed, and trains it with
`deepspeed.init_distributed(dist_backend="gloo")` on the same batches and per-step seeds, in the
trainer's loop; rank 0 writes the mean training loss over ranks of each step to OUT.json. Only modules that do not import mcr are used (the
model, the token data and the seeds), and the script checks at the end that mcr never loaded.
"""

import json
import os
import sys

import deepspeed
import deepspeed.comm as dist
import torch
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from omegaconf import OmegaConf

from apps.common.data import TokenBatches
from apps.common.seed import seed_step
from apps.moe.model import GPTMoE, lm_loss

run_dir, out_path = sys.argv[1:3]
cfg = OmegaConf.load(os.path.join(run_dir, "config.yaml"))
with open(os.path.join(run_dir, "ds_config.json")) as f:
    ds_config = json.load(f)
t = cfg.train

deepspeed.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
with open(os.path.join(run_dir, "summary.json")) as f:
    torch.set_num_threads(json.load(f)["threads"])  # as many as the trainer used: the same kernels
torch.manual_seed(t.seed)
model = GPTMoE(cfg.model)
param_groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "p"})
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups, config=ds_config)
data = TokenBatches(cfg.data, cfg.model.vocab_size, cfg.model.seq_len, t.micro_batch, t.seed, rank)

losses = []
for step in range(1, t.steps + 1):
    seed_step(t.seed, step, rank)
    lm_sum = 0.0
    for micro in range(t.grad_accum):
        x, y = data.get((step - 1) * t.grad_accum + micro)
        logits, aux = engine(x)
        lm = lm_loss(logits, y)
        engine.backward(lm + cfg.model.aux_loss_coef * aux)
        engine.step()
        lm_sum += lm.item() / t.grad_accum
    buf = torch.tensor([lm_sum], dtype=torch.float64)
    dist.all_reduce(buf)
    losses.append(buf.item() / world)

assert torch.distributed.get_backend() == "gloo", torch.distributed.get_backend()
loaded = sorted(m for m in sys.modules if m == "mcr" or m.startswith("mcr."))
assert not loaded, f"the reference imported mcr: {loaded}"
if rank == 0:
    with open(out_path, "w") as f:
        json.dump(losses, f)
    print(f"reference: {len(losses)} steps on stock DeepSpeed over gloo, mcr not loaded", flush=True)
dist.barrier()
