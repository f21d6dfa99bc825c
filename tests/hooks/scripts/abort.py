"""torch's abort on backend "mcr": rank 0 aborts with an async all-reduce in flight on BACKEND
that rank 1 never joins. abort() must return at once (torch's abort tears down without waiting).
WHAT world: the whole runtime is aborted, and the process then exits; rank 1 stays alive, out of
the op, until rank 0 has aborted. WHAT group: the op is on a subgroup, which alone is aborted;
the world's ops go on after it.

abort.py BACKEND world|group"""

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import mcr
from mcr.hooks import torch_backend

backend, what = sys.argv[1:3]
torch_backend.init_process_group()
group = dist.new_group([0, 1]) if what == "group" else None
dist.barrier()
store = dist.distributed_c10d._get_default_store()
rank = dist.get_rank()
if rank == 0:
    on = group.mcr_group if group is not None else None
    mcr.all_reduce(torch.ones(4), group=on, backend=backend, async_op=True)  # rank 1 never joins it
    start = time.monotonic()
    dist.distributed_c10d._abort_process_group(group)
    print(f"rank 0 aborted in {time.monotonic() - start:.2f} s", flush=True)
    store.set("aborted", "1")
    if what == "world":
        print(f"mcr initialized after abort: {mcr.is_initialized()}", flush=True)
        sys.exit(0)
else:
    store.wait(["aborted"], timedelta(seconds=120))
    print("rank 1 saw rank 0 abort", flush=True)
if what == "group":  # the world was not aborted: its ops go on, on every backend
    ranks = torch.full((2,), float(rank + 1))
    dist.all_reduce(ranks)
    mcr.all_reduce(ranks, backend=backend)
    print(f"rank {rank} after the group's abort: {ranks.tolist()}", flush=True)
    dist.destroy_process_group()
