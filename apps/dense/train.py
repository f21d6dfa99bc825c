"""Train a Megatron-style GPT: tensor parallel inside each layer, DeepSpeed's pipeline across
layers, data parallel (and ZeRO) across model replicas; every collective through the mcr runtime.

    python -m launch.local -n 2 -m apps.dense --config configs/dense/default.yaml [key=value ...]

Read top to bottom: config (all checks before any process group) -> communication -> model
(this rank's pipeline stage, its tensor-parallel slice; the tensor/pipeline/data-parallel groups
are DeepSpeed's, built once by its grid) -> DeepSpeed engine -> resume -> the training loop
every trainer shares (apps.common.loop: metrics, validation, checkpoints), given this file's
step, evaluation and save -> summary and communication table.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from functools import partial

import torch

from apps.common.checkpoint import latest_tag
from apps.common.comm import finalize_comm, setup_deepspeed_comm
from apps.common.config import load_config, save_resolved, write_atomic
from apps.common.data import TokenBatches
from apps.common.deepspeed_config import deepspeed_config as shared_deepspeed_config
from apps.common.deepspeed_config import engine_lr, load_engine, save_engine
from apps.common.loop import TrainLoop, all_ranks_mean, resume
from apps.common.metrics import LM_FIELDS
from apps.common.seed import seed_step
from apps.dense.config import LAYOUT_FILE, DenseConfig, check_resume_layout, checkpoint_layout, validate
from apps.dense.model import GPT, TensorParallel, count_params, layer_specs, lm_loss
from apps.dense.partition import plan_parts
from mcr.env import discover, threads_per_rank


def deepspeed_config(cfg) -> dict:
    ds_config = shared_deepspeed_config(cfg.train)
    # DeepSpeed may send 1/TP of an activation between stages and all-gather it over TP on
    # arrival: right for activations every TP rank holds whole, wrong for sequence-parallel
    # ones (each TP rank holds a different slice of the sequence).
    ds_config["pipeline"] = {
        "activation_checkpoint_interval": 0,
        "pipe_partitioned": not cfg.parallel.sequence,
        "grad_partitioned": not cfg.parallel.sequence,
    }
    return ds_config


def stage_boundaries(cfg, dims, rank, run_dir, resuming, dist):
    """DeepSpeed `parts` (a list) or method name for `parallel.partition`; with the planner, rank
    0 profiles and plans (or, resuming, reuses the saved stages) and every rank gets the result."""
    saved = os.path.join(run_dir, "partition.json")
    if cfg.parallel.partition != "planner":
        return cfg.parallel.partition, None
    parts, plan = torch.zeros(dims.pp + 1, dtype=torch.long), None
    if rank == 0:
        if resuming and os.path.isfile(saved):  # the checkpoint's optimizer state fits those stages
            with open(saved) as f:
                previous = json.load(f)
            found, plan = previous["parts"], previous["plan"]
        else:
            found, plan = plan_parts(cfg, dims.pp, dims.dp, os.path.join(run_dir, "profile.json"))
        parts = torch.tensor(found)
    dist.broadcast(parts, 0)
    return parts.tolist(), plan


def mark_replicated_params(model, tp_rank):
    """DeepSpeed's gradient norm counts a parameter that is not TP-sliced only on rank 0 of the
    pipe x tensor group, i.e. only stage 0's; marking the replicated ones `model_parallel` on
    every stage's TP rank 0 counts each exactly once, so clipping matches one rank's."""
    for param in model.parameters():
        if not getattr(param, "tensor_model_parallel", False):
            param.model_parallel = tp_rank == 0


def banner(cfg, dims, engine, params, parts, start, end, run_dir) -> str:
    """The run's first line on rank 0: what runs where."""
    t, p = cfg.train, cfg.parallel
    tuning = f" tuned by {cfg.comm.tuning}" if cfg.comm.tuning else ""
    return (
        f"dense: {dims.world_size} ranks = {dims}{' (sequence parallel)' if p.sequence else ''}, "
        f"{engine.__class__.__name__} ZeRO-{t.zero_stage} {t.precision}, comm mcr {cfg.comm.backend}{tuning}; "
        f"{cfg.model.n_layer} layers, {params / 1e6:.2f}M params in rank 0's stage"
        + (f"; stages {parts} ({p.partition})" if dims.pp_enabled else "")
        + f"; {'resuming at step ' + str(start) if start else 'starting'} -> {end}; run dir {run_dir}"
    )


def batches(engine, data, first: int, count: int, split: str = "train") -> list:
    return [tuple(v.to(engine.device) for v in data.get(first + i, split)) for i in range(count)]


def train_step(engine, data, cfg, pipelined: bool, groups, step: int) -> dict:
    """One optimizer step over grad_accum micro-batches: their mean loss."""
    t = cfg.train
    seed_step(t.seed, step, groups.coords.dp)  # the TP and PP ranks of a replica draw alike
    micro = batches(engine, data, (step - 1) * t.grad_accum, t.grad_accum)
    if pipelined:  # 1F1B over the micro-batches; the loss arrives on every stage
        return {"loss": engine.train_batch(iter(micro)).item()}
    total = 0.0
    for x, y in micro:
        loss = lm_loss(engine(x), y, groups.tp)
        engine.backward(loss)
        engine.step()
        total += loss.item() / t.grad_accum
    return {"loss": total}


def evaluate(engine, data, iters: int, pipelined: bool, tp_group) -> dict:
    val = batches(engine, data, 0, iters, "val")
    if pipelined:
        loss = engine.eval_batch(iter(val), num_micro_batches=len(val)).item()
    else:
        engine.eval()
        with torch.no_grad():
            loss = sum(lm_loss(engine(x), y, tp_group).item() for x, y in val) / len(val)
        engine.train()
    return {"val_loss": all_ranks_mean([loss])[0]}  # TP and PP ranks agree; the mean is over replicas


def save_checkpoint(engine, ckpt_dir: str, layout: dict, rank: int, tag: str, step: int) -> None:
    """DeepSpeed's save (each rank its TP/PP shard), then the layout it was cut with, which a
    resume checks before loading (apps.dense.config.check_resume_layout)."""
    save_engine(engine, ckpt_dir, tag, step)
    if rank == 0:  # save_engine ends with a barrier: every rank's shard is complete
        write_atomic(os.path.join(ckpt_dir, tag, LAYOUT_FILE), json.dumps(layout, indent=1))


def main(argv=None) -> dict:
    # 1. Config: every check that needs no process group happens here.
    cfg = load_config(DenseConfig, sys.argv[1:] if argv is None else argv)
    launch = discover()
    dims = validate(cfg, launch.world_size)  # tensor x pipeline, data parallel fills the rest
    run_dir = os.path.join(cfg.out_dir, cfg.name)
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    check_resume_layout(cfg, dims, ckpt_dir, latest_tag(ckpt_dir))  # a checkpoint cut another way
    torch.set_num_threads(cfg.train.threads or threads_per_rank(launch.local_world_size))

    # 2. Communication: DeepSpeed's comm layer on the mcr runtime (mcr.hooks.deepspeed). The
    #    groups come with the model: DeepSpeed's grid builds them over the topology's ranks (pipe,
    #    data, tensor; TP ranks adjacent, as `dims` lays them out), each once.
    setup_deepspeed_comm(cfg.comm, comm_log_json=os.path.join(run_dir, "comm_log.json"))
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.pipe import LayerSpec
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

    rank = dist.get_rank()
    topology = PipeModelDataParallelTopology(num_pp=dims.pp, num_mp=dims.tp, num_dp=dims.dp)
    resuming = cfg.resume and latest_tag(ckpt_dir) is not None
    ds_config = deepspeed_config(cfg)
    if rank == 0:  # the run directory records what was asked and what DeepSpeed was given
        os.makedirs(run_dir, exist_ok=True)
        save_resolved(cfg, os.path.join(run_dir, "config.yaml"))
        write_atomic(os.path.join(run_dir, "ds_config.json"), json.dumps(ds_config, indent=1))

    # 3. Model: each layer draws its weights from its own seed, so every rank builds exactly its
    #    slice of the same model, whatever the degrees. A pipeline builds only this stage's layers.
    #    The layers' TP collectives run on DeepSpeed's tensor-slicing group, taken from its grid
    #    before any layer is built (a PipelineModule builds its grid, then its layers, in one call).
    tensor_parallel = TensorParallel(sequence_parallel=cfg.parallel.sequence)  # its group: below

    def take_tp_group(grid):
        tensor_parallel.group = dims.groups_from_grid(grid).tp

    specs = layer_specs(cfg.model, tensor_parallel, cfg.train.seed)
    parts, plan, mpu = None, None, None
    if dims.pp_enabled:
        from bapipe.planned_pipeline import planned_pipeline_module

        parts, plan = stage_boundaries(cfg, dims, rank, run_dir, resuming, dist)
        model = planned_pipeline_module(
            [LayerSpec(cls, *args) for cls, args in specs],
            parts,
            on_grid=take_tp_group,
            topology=topology,
            loss_fn=lambda out, y: lm_loss(out, y, tensor_parallel.group),  # over the last stage's vocab slices
        )
        parts, grid = [int(v) for v in model.parts], model.mpu()  # what DeepSpeed built
    else:
        grid = mpu = PipelineParallelGrid(topology)  # the plain engine's groups (DeepSpeed's `mpu`)
        take_tp_group(grid)
        model = GPT(cfg.model, tensor_parallel, cfg.train.seed)
    groups = dims.groups_from_grid(grid)  # this rank's TP, DP and PP groups: DeepSpeed's
    mark_replicated_params(model, groups.coords.tp)
    held = sorted({int(name.split(".")[0]) for name, _ in model.named_parameters()})  # "<layer>.<name>"

    # 4. DeepSpeed engine: the pipeline engine (1F1B, train_batch) for a PipelineModule, the plain
    #    one otherwise; both take their data-parallel and tensor groups from the topology.
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=list(model.parameters()), config=ds_config, mpu=mpu
    )

    # 5. Resume from the latest complete checkpoint (each rank loads its TP/PP shard).
    start = resume(cfg, ckpt_dir, partial(load_engine, engine, ckpt_dir))

    # 6. Data (each data-parallel replica reads its own batches, its TP and PP ranks the same
    #    ones), the loop with its meter and metrics log, and where this rank's layers are.
    t, c = cfg.train, groups.coords
    data = TokenBatches(cfg.data, cfg.model.vocab_size, cfg.model.seq_len, t.micro_batch, t.seed, c.dp)
    samples_per_step = t.micro_batch * t.grad_accum * dims.dp
    loop = TrainLoop(
        cfg, run_dir, start, LM_FIELDS, tokens=samples_per_step * cfg.model.seq_len, samples=samples_per_step
    )
    host = socket.gethostname()  # on a cluster: which node holds these layers (a TP group should share one)
    placement = {"rank": rank, "host": host, "stage": c.pp, "data": c.dp, "tensor": c.tp, "layers": held}
    write_atomic(os.path.join(run_dir, "placement", f"rank{rank}.json"), json.dumps(placement))
    if rank == 0 and dims.pp_enabled:
        partition = {"method": cfg.parallel.partition, "parts": parts, "plan": plan}
        write_atomic(os.path.join(run_dir, "partition.json"), json.dumps(partition, indent=1))
    loop.log.print(banner(cfg, dims, engine, count_params(model, dims.tp), parts, start, loop.end, run_dir))

    # 7. Training: the loop decides when to log, evaluate, checkpoint and stop (apps.common.loop).
    loop.run(
        train_step=partial(train_step, engine, data, cfg, dims.pp_enabled, groups),
        evaluate=partial(evaluate, engine, data, cfg.eval_iters, dims.pp_enabled, groups.tp),
        ckpt_dir=ckpt_dir,
        save=partial(save_checkpoint, engine, ckpt_dir, checkpoint_layout(cfg, dims), rank),
        lr=partial(engine_lr, engine),
    )

    # 8. Summary (rank 0 prints it and writes summary.json), the communication table, shutdown.
    summary = loop.finish(parallel=str(dims), threads=torch.get_num_threads())
    dist.barrier()
    finalize_comm()
    return summary
