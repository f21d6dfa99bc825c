"""Train a small model with DDP, then with FSDP, on 2 ranks; print each rank's losses.

    python -m launch.local -n 2 -m tests.hooks.scripts.ddp mcr     # backend "mcr" (any launcher)
    python -m launch.local -n 2 --launcher torchrun -m tests.hooks.scripts.ddp gloo

Prints `LOSSES <ddp|fsdp> <rank> <json>` and, for mcr, `COMMLOG <ddp|fsdp> <rank> <json>`
(the runtime's calls during that run: op, backend, bytes, count).
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.hooks import fit, stock_exit
from tests.report import report


def wrap(model, how):
    if how == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    return DDP(model, bucket_cap_mb=0.01)  # ~10 KB buckets: several all-reduces per step


def comm_counts():
    import mcr

    return {(r["op"], r["backend"], r["bytes"], r["group_size"]): r["count"] for r in mcr.runtime().comm_log.rows()}


def train(how, rank):
    torch.manual_seed(0)
    model = wrap(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)), how)
    losses = fit.losses(model, torch.optim.SGD(model.parameters(), lr=0.1), rank, 5)
    report("LOSSES", how, rank, value=losses)


def main(mode):
    if mode == "mcr":
        from mcr.hooks import torch_backend

        torch_backend.init_process_group(comm_log=True)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    for how in ("ddp", "fsdp"):
        before = comm_counts() if mode == "mcr" else {}
        train(how, rank)
        if mode == "mcr":  # the runtime's rows this wrapper added: [op, backend, bytes, calls]
            rows = [[*key[:3], n - before.get(key, 0)] for key, n in comm_counts().items() if n > before.get(key, 0)]
            report("COMMLOG", how, rank, value=rows)
    if mode != "mcr":
        stock_exit.leave()
    dist.barrier()  # no rank tears gloo down while its peer still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
