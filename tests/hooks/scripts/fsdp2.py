"""FSDP2 (`fully_shard`) training and DTensor redistributes on 2+ ranks; prints what each gives.

    python -m launch.local -n 2 -m tests.hooks.scripts.fsdp2 mcr          # backend "mcr" (any launcher)
    python -m launch.local -n 2 --launcher torchrun -m tests.hooks.scripts.fsdp2 gloo

Prints `LOSSES fsdp2 <rank> <json>`, `DTENSOR <rank> <json>` (each redistribute's result,
gathered whole) and, for mcr, `COMMLOG all <rank> <json>` (the runtime's calls: op, backend,
bytes, count). Both go through torch's functional collectives, as torchtitan's do.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from tests.hooks import fit, stock_exit
from tests.report import report


def fsdp2_losses(rank, mesh, steps=5):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return fit.losses(model, torch.optim.SGD(model.parameters(), lr=0.1), rank, steps)


def redistributes(rank, n, mesh):
    whole = torch.arange(4 * n * 3, dtype=torch.float32).view(4 * n, 3)  # the same on every rank
    sharded = distribute_tensor(whole, mesh, [Shard(0)])
    results = {"shard->replicate": sharded.redistribute(mesh, [Replicate()]).to_local()}  # all-gather
    results["replicate->shard(1)"] = (
        distribute_tensor(whole, mesh, [Replicate()]).redistribute(mesh, [Shard(1)]).full_tensor()
    )
    # each rank's own partial value: sum over ranks on redistribute (all-reduce), or scattered (reduce-scatter)
    mine = torch.full((2 * n, 3), float(rank + 1)) + torch.arange(2 * n * 3, dtype=torch.float32).view(2 * n, 3)
    partial = torch.distributed.tensor.DTensor.from_local(mine, mesh, [Partial()])
    results["partial->replicate"] = partial.redistribute(mesh, [Replicate()]).to_local()
    results["partial->shard(0)"] = partial.redistribute(mesh, [Shard(0)]).full_tensor()
    return {key: value.tolist() for key, value in results.items()}


def main(mode):
    if mode == "mcr":
        from mcr.hooks import torch_backend

        torch_backend.init_process_group(comm_log=True)
    else:
        dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    report("LOSSES", "fsdp2", rank, value=fsdp2_losses(rank, mesh))
    report("DTENSOR", rank, value=redistributes(rank, n, mesh))
    if mode == "mcr":
        import mcr

        rows = [[r["op"], r["backend"], r["bytes"], r["count"]] for r in mcr.runtime().comm_log.rows()]
        report("COMMLOG", "all", rank, value=rows)
    if mode != "mcr":
        stock_exit.leave()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
