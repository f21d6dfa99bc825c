"""Train a small model with DDP (or FSDP) on 2 ranks; print each rank's losses.

    python -m launch.local -n 2 tests/hooks/ddp_script.py mcr [fsdp]    # backend "mcr" (any launcher)
    python -m launch.local -n 2 --launcher torchrun tests/hooks/ddp_script.py gloo [fsdp]

Prints `LOSSES <rank> <json>` and, for mcr, `COMMLOG <rank> <json>` (op, backend, bytes, count).
"""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def wrap(model, how):
    if how == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    return DDP(model, bucket_cap_mb=0.01)  # ~10 KB buckets: several all-reduces per step


def main(mode, how):
    if mode == "mcr":
        from mcr.hooks import torch_backend

        torch_backend.init_process_group(comm_log=True)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = wrap(model, how)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    for step in range(5):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"LOSSES {rank} {json.dumps(losses)}", flush=True)
    if mode == "mcr":
        import mcr

        rows = [[r["op"], r["backend"], r["bytes"], r["count"]] for r in mcr.runtime().comm_log.rows()]
        print(f"COMMLOG {rank} {json.dumps(rows)}", flush=True)
    dist.barrier()  # no rank tears gloo down while its peer still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "ddp")
