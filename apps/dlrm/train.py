"""Train TorchRec's DLRM on Criteo-shaped data: embedding tables sharded over the ranks, every
all-to-all, reduce-scatter and all-reduce through the mcr runtime (torch backend "mcr").

    python -m launch.local -n 2 -m apps.dlrm --config configs/dlrm/default.yaml [key=value ...]

Read top to bottom, in the order of TorchRec's DLRM example: config (all checks before any
process group) -> model with its tables on the meta device -> sparse optimizer fused into the
backward -> sharding plan (a table that does not fit fails here) -> communication ->
DistributedModelParallel -> tables and dense optimizer -> resume -> the training loop every
trainer shares (apps.common.loop), given this file's TrainPipelineSparseDist step, held-out log
loss and AUC, and torch.distributed.checkpoint save -> summary and communication table.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from functools import partial

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torchmetrics.classification import BinaryAUROC
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.types import PlannerError
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from apps.common.comm import finalize_comm, setup_torch_comm
from apps.common.config import ConfigError, load_config, save_resolved, write_atomic
from apps.common.loop import TrainLoop, all_ranks_sum, resume
from apps.common.metrics import STEP_TIME, UNIT_TEXT
from apps.dlrm.config import DLRMConfig, sharding_types, validate
from apps.dlrm.data import make_data
from apps.dlrm.model import build_model, init_tables, table_rows
from mcr.env import discover, threads_per_rank
from mcr.hooks.torchrec import cpu_sharders

# The step line: `step 20/40 | loss 0.5712 | val 0.5801 | auc 0.7113 | 1,234 samples/s | step 830.2 ms (...)`
DLRM_FIELDS = (
    ("loss", "loss {:.4f}"),
    ("val_loss", "val {:.4f}"),
    ("auc", "auc {:.4f}"),
    ("samples_per_s", UNIT_TEXT["samples_per_s"]),
    STEP_TIME,
)


def plan_sharding(cfg, model, sharders, launch, device):
    """TorchRec's planner for this launch's topology, with the tables the config pins. Planning
    needs no process group, so it runs before one starts: a table too large fails here."""
    topology = Topology(
        world_size=launch.world_size,
        local_world_size=launch.local_world_size,
        compute_device=device.type,
        **({"ddr_cap": int(cfg.sharding.memory_gb * 1024**3)} if cfg.sharding.memory_gb else {}),
        **(
            {"hbm_cap": int(cfg.sharding.memory_gb * 1024**3)}
            if cfg.sharding.memory_gb and device.type == "cuda"
            else {}
        ),
    )
    constraints = {table: ParameterConstraints(sharding_types=[kind]) for table, kind in sharding_types(cfg).items()}
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=cfg.train.batch_size, constraints=constraints)
    try:
        return planner.plan(model, sharders)
    except PlannerError as exc:
        dim = cfg.model.embedding_dim
        total = sum(table_rows(cfg.model)) * dim * 4 / 1024**3
        largest = max(table_rows(cfg.model)) * dim * 4 / 1024**3
        memory = f"sharding.memory_gb={cfg.sharding.memory_gb:g}" if cfg.sharding.memory_gb else "the device's memory"
        raise ConfigError(
            f"bad value for config key 'sharding': the tables ({total:.3g} GiB of weights in all, the largest "
            f"{largest:.3g} GiB, plus optimizer state) do not fit in {memory} per rank on {launch.world_size} "
            f"rank(s) with sharding.types={cfg.sharding.types}; raise sharding.memory_gb, use more ranks or a "
            f"sharding that splits tables, or shrink model.num_embeddings (TorchRec's planner: "
            f"{str(exc).strip().splitlines()[0]})"
        ) from None


def plan_lines(applied: dict) -> str:
    """`  row_wise: t_cat_0 t_cat_1 ...` per sharding type (the full plan goes to sharding_plan.txt)."""
    by_kind = {}
    for table, p in applied.items():
        by_kind.setdefault(p["sharding_type"], []).append(table)
    return "\n".join(f"  {kind}: {' '.join(tables)}" for kind, tables in sorted(by_kind.items()))


def plan_table(model) -> dict:
    """{table: {sharding_type, compute_kernel, ranks}} as DistributedModelParallel applied it."""
    return {
        table: {"sharding_type": p.sharding_type, "compute_kernel": p.compute_kernel, "ranks": p.ranks}
        for module_plan in model.plan.plan.values()
        for table, p in module_plan.items()
    }


def without_empty_shards(state):
    """`state` less the ShardedTensors with no shard on this rank (a table-wise table held
    elsewhere): they have nothing to read here, and torch.distributed.checkpoint asks them for
    their device, which torch answers only for a "gloo" group (else it assumes CUDA)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if not isinstance(state, dict):
        return state
    return {
        k: without_empty_shards(v)
        for k, v in state.items()
        if not (isinstance(v, ShardedTensor) and not v.local_shards())
    }


def banner(cfg, model, kinds, device, start: int, end: int, run_dir: str) -> str:
    """The run's first line on rank 0: what runs where."""
    t, world = cfg.train, dist.get_world_size()
    tuning = f" tuned by {cfg.comm.tuning}" if cfg.comm.tuning else ""
    return (
        f"dlrm: {world} ranks on {device.type}, comm mcr {cfg.comm.backend}{tuning}; "
        f"{type(model.module.model).__name__} 26 tables x {cfg.model.embedding_dim} dims, "
        f"{sum(table_rows(cfg.model)):,} rows; sharding {', '.join(kinds)}; batch {t.batch_size}/rank; "
        f"{cfg.data.kind} data; {'resuming at step ' + str(start) if start else 'starting'} -> {end}; run dir {run_dir}"
    )


def checkpoint_state(model, optimizer) -> dict:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def load_checkpoint(model, optimizer, ckpt_dir: str, tag: str) -> None:
    """torch.distributed.checkpoint reads each rank's shards of the tables and of the fused
    optimizer state into the live tensors."""
    state = checkpoint_state(model, optimizer)
    dcp.load(without_empty_shards(state), checkpoint_id=os.path.join(ckpt_dir, tag))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


def save_checkpoint(model, optimizer, ckpt_dir: str, tag: str, step: int) -> None:
    """Each rank writes its shards; dcp.save returns on the coordinator (rank 0) only after every
    rank's files are written, as the loop needs before it points `latest` here."""
    dcp.save(checkpoint_state(model, optimizer), checkpoint_id=os.path.join(ckpt_dir, tag))


def train_step(model, optimizer, pipeline, batches, device, step: int) -> dict:
    """One step on the next batch of `batches`: this rank's loss."""
    if pipeline is not None:
        loss, _, _ = pipeline.progress(batches)
        return {"loss": loss.item()}
    batch = next(batches).to(device)
    optimizer.zero_grad()
    loss, _ = model(batch)
    loss.backward()
    optimizer.step()
    return {"loss": loss.detach().item()}


def evaluate(model, pipeline, data, eval_batches: int, device) -> dict:
    """Held-out log loss and AUC (torchmetrics' BinaryAUROC gathers every rank's predictions)."""
    net = pipeline.detach() if pipeline is not None else model  # TorchRec's own forward, not the pipeline's
    net.eval()
    auroc = BinaryAUROC().to(device)
    loss_sum = count = 0.0
    with torch.no_grad():
        for batch in itertools.islice(data.batches("val"), eval_batches):
            _, (_, logits, labels) = net(batch.to(device))
            labels = labels.float()  # TorchRec's Criteo readers give int labels
            loss_sum += F.binary_cross_entropy_with_logits(logits, labels, reduction="sum").item()
            count += len(labels)
            auroc.update(torch.sigmoid(logits), labels.long())
    auc = auroc.compute().item()
    net.train()
    loss_sum, count = all_ranks_sum([loss_sum, count])
    return {"val_loss": loss_sum / count, "auc": auc}


def main(argv=None) -> dict:
    # 1. Config: every check that needs no process group happens here.
    cfg = load_config(DLRMConfig, sys.argv[1:] if argv is None else argv)
    validate(cfg)
    launch = discover()
    run_dir = os.path.join(cfg.out_dir, cfg.name)
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    # TorchRec reads the node size from the environment (table-row-wise groups); not every
    # launcher sets it (srun, jsrun), and TorchRec assumes 8 when none is set.
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(launch.local_world_size))
    torch.set_num_threads(cfg.train.threads or threads_per_rank(launch.local_world_size))
    t = cfg.train
    cuda = torch.cuda.is_available()
    # % count: a launcher that shows each rank only its own GPU (srun --gpus-per-task, a wrapper) leaves one
    device = torch.device("cuda", launch.local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    # 2. Model: DLRM (or DLRM_DCN) with its 26 tables on the meta device; the same seed on every
    #    rank gives the same dense weights. The tables' row-wise Adagrad runs inside the backward
    #    (TorchRec fuses it into the embedding kernels), so the tables never hold a gradient.
    torch.manual_seed(t.seed)
    model = build_model(cfg.model, device)
    apply_optimizer_in_backward(
        RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": t.embedding_lr, "eps": t.eps}
    )

    # 3. Sharding plan: TorchRec's planner for this launch (on CPU, mcr.hooks.torchrec's sharder
    #    adds row-wise and table-row-wise to the types TorchRec offers there).
    sharders = get_default_sharders() if cuda else cpu_sharders()
    plan = plan_sharding(cfg, model, sharders, launch, device)

    # 4. Communication: torch.distributed's default group on backend "mcr" (the runtime picks
    #    gloo, MPI or NCCL per call). Rank 0's plan is the one every rank uses, as TorchRec's
    #    collective_plan does.
    setup_torch_comm(cfg.comm, comm_log_json=os.path.join(run_dir, "comm_log.json"))
    rank, world = dist.get_rank(), dist.get_world_size()
    shared = [plan]
    dist.broadcast_object_list(shared, src=0)
    plan = shared[0]
    if rank == 0:
        os.makedirs(run_dir, exist_ok=True)
        save_resolved(cfg, os.path.join(run_dir, "config.yaml"))

    # 5. DistributedModelParallel: shards the tables as planned (the KJT input exchange and the
    #    pooled-embedding all-to-all / reduce-scatter), wraps the dense part in DDP. Then every
    #    table gets the same weights whatever the sharding (apps.dlrm.model.init_tables).
    model = DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders)
    init_tables(model, cfg.model, t.seed)
    applied = plan_table(model)
    if rank == 0:
        write_atomic(os.path.join(run_dir, "sharding_plan.txt"), str(model.plan) + "\n")
        write_atomic(os.path.join(run_dir, "sharding_plan.json"), json.dumps(applied, indent=1))

    # 6. Optimizers: the fused table optimizer and Adagrad on the dense part, one optimizer.
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        partial(torch.optim.Adagrad, lr=t.lr, eps=t.eps),  # given the dense parameters
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense_optimizer])

    # 7. Resume from the latest complete checkpoint (start: its step, 0 without one).
    start = resume(cfg, ckpt_dir, partial(load_checkpoint, model, optimizer, ckpt_dir))

    # 8. Data, the loop with its meter and metrics log, the pipeline. TrainPipelineSparseDist
    #    starts batch i+1's input all-to-all while batch i computes; on CPU it runs without CUDA
    #    streams.
    data = make_data(cfg.data, table_rows(cfg.model), t.batch_size, t.seed, rank, world)
    loop = TrainLoop(cfg, run_dir, start, DLRM_FIELDS, samples=t.batch_size * world)
    kinds = sorted({p["sharding_type"] for p in applied.values()})
    loop.log.print(banner(cfg, model, kinds, device, start, loop.end, run_dir))
    loop.log.print("sharding plan (TorchRec's, as applied; full plan in sharding_plan.txt):\n" + plan_lines(applied))
    pipeline = TrainPipelineSparseDist(model, optimizer, device) if t.pipeline else None

    # 9. Training: the loop decides when to log, evaluate, checkpoint and stop (apps.common.loop).
    loop.run(
        train_step=partial(train_step, model, optimizer, pipeline, data.batches("train", start), device),
        evaluate=partial(evaluate, model, pipeline, data, cfg.eval_batches, device),
        ckpt_dir=ckpt_dir,
        save=partial(save_checkpoint, model, optimizer, ckpt_dir),
    )

    # 10. Summary (rank 0 prints it and writes summary.json), the communication table, shutdown.
    summary = loop.finish(sharding=kinds, model=type(model.module.model).__name__, data=cfg.data.kind)
    dist.barrier()
    finalize_comm()
    return summary
