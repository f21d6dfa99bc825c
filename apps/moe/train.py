"""Train a GPT with DeepSpeed MoE layers, expert-parallel, data parallel across expert groups.

    python -m launch.local -n 2 -m apps.moe --config configs/moe/default.yaml [key=value ...]

Read top to bottom: config (all checks before any process group) -> communication (through
the mcr runtime) -> model -> DeepSpeed engine -> resume -> training loop with metrics,
validation and checkpoints -> communication table.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from apps.common.checkpoint import latest_tag, mark_latest, step_of, tag_for
from apps.common.comm import comm_seconds, finalize_comm, setup_deepspeed_comm
from apps.common.config import load_config, save_resolved, to_dict, write_atomic
from apps.common.data import TokenBatches
from apps.common.deepspeed_config import deepspeed_config
from apps.common.metrics import LM_FIELDS, Meter, MetricsLog
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


def all_ranks_mean(values: list, world: int) -> list:
    import deepspeed.comm as dist

    buf = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(buf)
    return (buf / world).tolist()


def evaluate(engine, data, iters: int, world: int) -> float:
    """Validation loss, averaged over `iters` held-out batches and over the ranks."""
    engine.eval()
    with torch.no_grad():
        losses = [
            lm_loss(engine(x.to(engine.device))[0], y.to(engine.device)).item()
            for x, y in (data.get(i, "val") for i in range(iters))
        ]
    engine.train()
    return all_ranks_mean([sum(losses) / len(losses)], world)[0]


def save_checkpoint(engine, ckpt_dir: str, step: int, keep: int, rank: int) -> None:
    engine.save_checkpoint(ckpt_dir, tag=tag_for(step), client_state={"step": step}, save_latest=False)
    if rank == 0:  # save_checkpoint ends with a barrier: every rank's files are complete
        mark_latest(ckpt_dir, tag_for(step), keep=keep)


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
    device = engine.device

    # 5. Resume from the latest complete checkpoint.
    start = 0
    tag = latest_tag(ckpt_dir) if cfg.resume else None
    if tag is not None:
        engine.load_checkpoint(ckpt_dir, tag=tag)
        start = step_of(tag)
    end = min(cfg.train.steps, start + cfg.train.stop_after) if cfg.train.stop_after else cfg.train.steps

    # 6. Data, metrics.
    t = cfg.train
    data = TokenBatches(cfg.data, cfg.model.vocab_size, cfg.model.seq_len, t.micro_batch, t.seed, rank)
    samples_per_step = t.micro_batch * t.grad_accum * world
    warmup = max(1, (end - start) // 10)  # the first steps warm up; the summary skips them
    meter = Meter(warmup, tokens=samples_per_step * cfg.model.seq_len, samples=samples_per_step)
    log = MetricsLog(
        run_dir,
        rank,
        t.steps,
        wandb_mode=cfg.wandb,
        run_name=cfg.name,
        config=to_dict(cfg),
        resume=start > 0,
        progress=cfg.progress,
        start_step=start,
        fields=LM_FIELDS,
    )
    log.print(banner(cfg, dims, engine, model, start, end, run_dir))

    # 7. Training loop.
    lm_sum = aux_sum = 0.0
    seen = 0
    started = time.perf_counter()
    for step in range(start + 1, end + 1):
        # Reseed per step: random token selection and dropout draw the same numbers whether the
        # run was interrupted or not, so a resumed run follows the same loss curve.
        seed_step(t.seed, step, rank)
        comm0, t0 = comm_seconds(), time.perf_counter()
        for micro in range(t.grad_accum):
            x, y = data.get((step - 1) * t.grad_accum + micro)
            logits, aux = engine(x.to(device))
            lm = lm_loss(logits, y.to(device))
            engine.backward(lm + cfg.model.aux_loss_coef * aux)
            engine.step()
            lm_sum += lm.item() / t.grad_accum
            aux_sum += aux.item() / t.grad_accum
        seconds = time.perf_counter() - t0
        comm = None if comm0 is None else comm_seconds() - comm0
        meter.step(seconds, comm)
        seen += 1
        log.advance()

        if step % cfg.log_interval == 0 or step == end:
            loss, aux_loss = all_ranks_mean([lm_sum / seen, aux_sum / seen], world)
            values = {"loss": loss, "aux_loss": aux_loss, **meter.interval(), "lr": engine.get_lr()[0]}
            if (cfg.eval_interval and step % cfg.eval_interval == 0) or step == cfg.train.steps:
                values["val_loss"] = evaluate(engine, data, cfg.eval_iters, world)
            log.write(step, **values)
            lm_sum = aux_sum = 0.0
            seen = 0
        if cfg.checkpoint.enabled and (
            (cfg.checkpoint.interval and step % cfg.checkpoint.interval == 0) or step == end
        ):
            save_checkpoint(engine, ckpt_dir, step, cfg.checkpoint.keep, rank)

    # 8. Summary (rank 0 prints it and writes summary.json), the communication table, shutdown.
    backend = to_dict(cfg.comm)["backend"]
    wall_s, threads = time.perf_counter() - started, torch.get_num_threads()
    summary = meter.summary(steps=end - start, world_size=world, comm_backend=backend, wall_s=wall_s, threads=threads)
    log.close(summary)
    dist.barrier()
    finalize_comm()
    return summary
