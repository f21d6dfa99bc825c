"""Train a GPT with DeepSpeed MoE layers, expert-parallel, data parallel across expert groups.

    python -m launch.local -n 2 -m apps.moe --config configs/moe/default.yaml [key=value ...]

Read top to bottom: config (all checks before any process group) -> communication (through
the mcr runtime) -> model -> DeepSpeed engine -> resume -> the training loop every trainer
shares (apps.common.loop: metrics, validation, checkpoints), given this file's step and
evaluation -> summary and communication table.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import torch

from apps.common.comm import finalize_comm, setup_deepspeed_comm
from apps.common.config import load_config, save_resolved, write_atomic
from apps.common.data import TokenBatches
from apps.common.deepspeed_config import deepspeed_config, engine_lr, load_engine, save_engine
from apps.common.loop import TrainLoop, all_ranks_mean, resume
from apps.common.metrics import LM_FIELDS
from apps.common.seed import seed_step
from apps.moe.config import MoEConfig, validate
from apps.moe.model import GPTMoE, count_params, lm_loss
from mcr.env import discover, threads_per_rank


def banner(cfg, dims, engine, model, start, end, run_dir) -> str:
    """The run's first line on rank 0: what runs where."""
    t, m = cfg.train, cfg.model
    total, expert = count_params(model)
    tuning = f" tuned by {cfg.comm.tuning}" if cfg.comm.tuning else ""
    return (
        f"moe: {dims.world_size} ranks, {engine.__class__.__name__} ZeRO-{t.zero_stage} {t.precision}, comm "
        f"mcr {cfg.comm.backend}{tuning}; {model.num_moe_layers()} MoE layers x {m.num_experts} experts "
        f"(ep {dims.ep} x dp {dims.dp // dims.ep}, top-{m.top_k}); "
        f"{total / 1e6:.2f}M params on rank 0 ({expert / 1e6:.2f}M expert); "
        f"{'resuming at step ' + str(start) if start else 'starting'} -> {end}; run dir {run_dir}"
    )


def train_step(engine, data, cfg, rank: int, step: int) -> dict:
    """One optimizer step over grad_accum micro-batches: this rank's mean LM and auxiliary losses."""
    t = cfg.train
    # Reseed per step: random token selection and dropout draw the same numbers whether the
    # run was interrupted or not, so a resumed run follows the same loss curve.
    seed_step(t.seed, step, rank)
    lm_sum = aux_sum = 0.0
    for micro in range(t.grad_accum):
        x, y = data.get((step - 1) * t.grad_accum + micro)
        logits, aux = engine(x.to(engine.device))
        lm = lm_loss(logits, y.to(engine.device))
        engine.backward(lm + cfg.model.aux_loss_coef * aux)
        engine.step()
        lm_sum += lm.item() / t.grad_accum
        aux_sum += aux.item() / t.grad_accum
    return {"loss": lm_sum, "aux_loss": aux_sum}


def evaluate(engine, data, iters: int) -> dict:
    """Validation loss, averaged over `iters` held-out batches and over the ranks."""
    engine.eval()
    with torch.no_grad():
        losses = [
            lm_loss(engine(x.to(engine.device))[0], y.to(engine.device)).item()
            for x, y in (data.get(i, "val") for i in range(iters))
        ]
    engine.train()
    return {"val_loss": all_ranks_mean([sum(losses) / len(losses)])[0]}


def main(argv=None) -> dict:
    # 1. Config: every check that needs no process group happens here.
    cfg = load_config(MoEConfig, sys.argv[1:] if argv is None else argv)
    launch = discover()
    dims = validate(cfg, launch.world_size)  # data parallel over all ranks, experts spread ep-wide
    run_dir = os.path.join(cfg.out_dir, cfg.name)
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    torch.set_num_threads(cfg.train.threads or threads_per_rank(launch.local_world_size))

    # 2. Communication: DeepSpeed's comm layer on the mcr runtime (mcr.hooks.deepspeed).
    setup_deepspeed_comm(cfg.comm, comm_log_json=os.path.join(run_dir, "comm_log.json"))
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    rank, world = dist.get_rank(), dist.get_world_size()
    cfg.model.ep_size = dims.ep  # 0 meant all ranks; the saved config says how many
    ds_config = deepspeed_config(cfg.train)
    if rank == 0:  # the run directory records what was asked and what DeepSpeed was given
        os.makedirs(run_dir, exist_ok=True)
        save_resolved(cfg, os.path.join(run_dir, "config.yaml"))
        write_atomic(os.path.join(run_dir, "ds_config.json"), json.dumps(ds_config, indent=1))

    # 3. Model: the same seed on every rank gives the same dense weights; the MoE layers hold
    #    num_experts / ep_size local experts each.
    torch.manual_seed(cfg.train.seed)
    model = GPTMoE(cfg.model)

    # 4. DeepSpeed engine: expert parameters get their own optimizer groups (reduced over the
    #    expert-data-parallel group only), as ZeRO with MoE requires.
    param_groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "params"}
    )
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups, config=ds_config)

    # 5. Resume from the latest complete checkpoint (start: its step, 0 without one).
    start = resume(cfg, ckpt_dir, partial(load_engine, engine, ckpt_dir))

    # 6. Data; the loop with its throughput meter and metrics log.
    t = cfg.train
    data = TokenBatches(cfg.data, cfg.model.vocab_size, cfg.model.seq_len, t.micro_batch, t.seed, rank)
    samples_per_step = t.micro_batch * t.grad_accum * world
    loop = TrainLoop(
        cfg, run_dir, start, LM_FIELDS, tokens=samples_per_step * cfg.model.seq_len, samples=samples_per_step
    )
    loop.log.print(banner(cfg, dims, engine, model, start, loop.end, run_dir))

    # 7. Training: the loop decides when to log, evaluate, checkpoint and stop (apps.common.loop).
    loop.run(
        train_step=partial(train_step, engine, data, cfg, rank),
        evaluate=partial(evaluate, engine, data, cfg.eval_iters),
        ckpt_dir=ckpt_dir,
        save=partial(save_engine, engine, ckpt_dir),
        lr=partial(engine_lr, engine),
    )

    # 8. Summary (rank 0 prints it and writes summary.json), the communication table, shutdown.
    summary = loop.finish(threads=torch.get_num_threads())
    dist.barrier()
    finalize_comm()
    return summary
