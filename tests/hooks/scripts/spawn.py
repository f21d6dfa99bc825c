"""Backend "mcr" in processes no launcher started, as torch's DDP tutorial starts them:

    python tests/hooks/scripts/spawn.py N      # N ranks by torch.multiprocessing.spawn, file:// rendezvous

Each rank prints `SPAWN <rank> <json>`: what the runtime says of its place, an all-reduce of
distinct data, who sent a receive from any source, and an all_gather_coalesced.
"""

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, init_file):
    import mcr

    dist.init_process_group("mcr", init_method=f"file://{init_file}", rank=rank, world_size=world)
    rt = mcr.runtime()
    t = torch.arange(4, dtype=torch.float32) + 10 * rank  # distinct per rank and element
    dist.all_reduce(t)
    # ranks 1..N-1 each send their rank to 0, which receives from any source, in arrival order
    senders = []
    if rank == 0:
        for _ in range(world - 1):
            got = torch.zeros(2)
            src = dist.recv(got)
            assert got.tolist() == [src, -src], (src, got)
            senders.append(src)
    else:
        dist.send(torch.tensor([float(rank), -float(rank)]), 0)
    a, b = torch.full((2,), float(rank)), torch.full((3,), 100.0 + rank)
    outs = [[torch.empty(2), torch.empty(3)] for _ in range(world)]
    dist.all_gather_coalesced(outs, [a, b])
    report = {
        "launcher": rt.info.launcher,
        "rank": rt.rank,
        "world": rt.world_size,
        "local_rank": rt.info.local_rank,
        "local_world": rt.info.local_world_size,
        "backends": sorted(rt.backends),
        "all_reduce": t.tolist(),
        "senders": sorted(senders),
        "coalesced": [[x.tolist() for x in per_rank] for per_rank in outs],
    }
    print(f"SPAWN {rank} {json.dumps(report)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(world, os.path.join(tmp, "init")), nprocs=world)
