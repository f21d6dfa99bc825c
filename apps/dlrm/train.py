"""Train TorchRec's DLRM on Criteo-shaped data: embedding tables sharded over the ranks, every
all-to-all, reduce-scatter and all-reduce through the mcr runtime (torch backend "mcr").

    python -m launch.local -n 2 -m apps.dlrm --config configs/dlrm/default.yaml [key=value ...]

Read top to bottom, in the order of TorchRec's DLRM example: config (all checks before any
process group) -> model with its tables on the meta device -> sparse optimizer fused into the
backward -> sharding plan (a table that does not fit fails here) -> communication ->
DistributedModelParallel -> tables and dense optimizer -> resume -> TrainPipelineSparseDist
loop with held-out log loss and AUC, checkpoints -> summary and communication table.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time

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

from apps.common.checkpoint import latest_tag, mark_latest, step_of, tag_for
from apps.common.comm import comm_seconds, finalize_comm, setup_torch_comm
from apps.common.config import ConfigError, load_config, save_resolved, to_dict, write_atomic
from apps.common.metrics import STEP_TIME, UNIT_TEXT, Meter, MetricsLog
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
    device = torch.device(f"cuda:{launch.local_rank}") if cuda else torch.device("cpu")
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
        lambda params: torch.optim.Adagrad(params, lr=t.lr, eps=t.eps),
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense_optimizer])

    # 7. Resume from the latest complete checkpoint: torch.distributed.checkpoint reads each
    #    rank's shards of the tables and of the fused optimizer state into the live tensors.
    def checkpoint_state():
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    start = 0
    tag = latest_tag(ckpt_dir) if cfg.resume else None
    if tag is not None:
        state = checkpoint_state()
        dcp.load(without_empty_shards(state), checkpoint_id=os.path.join(ckpt_dir, tag))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = step_of(tag)
    end = min(t.steps, start + t.stop_after) if t.stop_after else t.steps

    # 8. Data, metrics, the pipeline. TrainPipelineSparseDist starts batch i+1's input
    #    all-to-all while batch i computes; on CPU it runs without CUDA streams.
    data = make_data(cfg.data, table_rows(cfg.model), t.batch_size, t.seed, rank, world)
    warmup = max(1, (end - start) // 10)  # the first steps warm up; the summary skips them
    meter = Meter(warmup, samples=t.batch_size * world)
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
        fields=DLRM_FIELDS,
    )
    kinds = sorted({p["sharding_type"] for p in applied.values()})
    log.print(
        f"dlrm: {world} ranks on {device.type}, comm mcr {cfg.comm.backend}"
        f"{' tuned by ' + cfg.comm.tuning if cfg.comm.tuning else ''}; {type(model.module.model).__name__} "
        f"26 tables x {cfg.model.embedding_dim} dims, {sum(table_rows(cfg.model)):,} rows; sharding "
        f"{', '.join(kinds)}; batch {t.batch_size}/rank; {cfg.data.kind} data; "
        f"{'resuming at step ' + str(start) if start else 'starting'} -> {end}; run dir {run_dir}"
    )
    log.print("sharding plan (TorchRec's, as applied; full plan in sharding_plan.txt):\n" + plan_lines(applied))
    pipeline = TrainPipelineSparseDist(model, optimizer, device) if t.pipeline else None

    def train_step(batch_iter):
        if pipeline is not None:
            loss, _, _ = pipeline.progress(batch_iter)
            return loss
        batch = next(batch_iter).to(device)
        optimizer.zero_grad()
        loss, _ = model(batch)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def all_ranks_sum(values):
        buf = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(buf)
        return buf.tolist()

    def evaluate():
        """Held-out log loss and AUC (torchmetrics' BinaryAUROC gathers every rank's predictions)."""
        net = pipeline.detach() if pipeline is not None else model  # TorchRec's own forward, not the pipeline's
        net.eval()
        auroc = BinaryAUROC().to(device)
        loss_sum = count = 0.0
        with torch.no_grad():
            for batch in itertools.islice(data.batches("val"), cfg.eval_batches):
                _, (_, logits, labels) = net(batch.to(device))
                labels = labels.float()  # TorchRec's Criteo readers give int labels
                loss_sum += F.binary_cross_entropy_with_logits(logits, labels, reduction="sum").item()
                count += len(labels)
                auroc.update(torch.sigmoid(logits), labels.long())
        auc = auroc.compute().item()
        net.train()
        loss_sum, count = all_ranks_sum([loss_sum, count])
        return {"val_loss": loss_sum / count, "auc": auc}

    def save_checkpoint(step):
        dcp.save(checkpoint_state(), checkpoint_id=os.path.join(ckpt_dir, tag_for(step)))
        if rank == 0:  # dcp.save returns on the coordinator after every rank's files are written
            mark_latest(ckpt_dir, tag_for(step), keep=cfg.checkpoint.keep)

    # 9. Training loop.
    batches = data.batches("train", start)
    loss_sum, seen = 0.0, 0
    started = time.perf_counter()
    for step in range(start + 1, end + 1):
        comm0, t0 = comm_seconds(), time.perf_counter()
        loss = train_step(batches)
        loss_sum += loss.item()
        seconds = time.perf_counter() - t0
        comm = None if comm0 is None else comm_seconds() - comm0
        meter.step(seconds, comm)
        seen += 1
        log.advance()

        if step % cfg.log_interval == 0 or step == end:
            values = {"loss": all_ranks_sum([loss_sum / seen])[0] / world, **meter.interval()}
            if (cfg.eval_interval and step % cfg.eval_interval == 0) or step == t.steps:
                values.update(evaluate())
            log.write(step, **values)
            loss_sum, seen = 0.0, 0
        if cfg.checkpoint.enabled and (
            (cfg.checkpoint.interval and step % cfg.checkpoint.interval == 0) or step == end
        ):
            save_checkpoint(step)

    # 10. Summary, the communication table, shutdown.
    summary = meter.summary(
        steps=end - start,
        world_size=world,
        comm_backend=to_dict(cfg.comm)["backend"],
        wall_s=time.perf_counter() - started,
        sharding=kinds,
        model=type(model.module.model).__name__,
        data=cfg.data.kind,
    )
    log.close(summary)  # rank 0 prints its line and writes summary.json
    dist.barrier()
    finalize_comm()
    return summary
