"""A short run with a known set of ops on every rank, traced (MCR_TRACE_DIR), for test_trace.py:
per step 2 blocking all-reduces, 1 async all-gather, 1 broadcast on a subgroup, and a ring of
sends (rank r to r+1) and receives (from r-1). `traced.py profile OUT_{rank}.json`: all under
a torch.profiler, whose trace goes to OUT."""

import sys
import time

import torch

import mcr

STEPS = 3
mcr.init()
rank, n = mcr.get_rank(), mcr.get_world_size()
pair = mcr.new_group([0, 1])
profiler = None
if sys.argv[1:2] == ["profile"]:
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    profiler.__enter__()
for step in range(STEPS):
    t = torch.arange(16, dtype=torch.float32) + 100 * rank + step
    mcr.all_reduce(t)
    out = torch.empty(16 * n)
    if rank == 1:
        time.sleep(0.05)  # rank 0's gather is in flight while it issues the next all-reduce
    handle = mcr.all_gather_into_tensor(out, t, async_op=True)
    mcr.all_reduce(torch.ones(1 << 14))  # 64 KiB while the gather may still be in flight
    handle.wait()
    if rank in (0, 1):
        mcr.broadcast(t, 0, group=pair)
    right, left = (rank + 1) % n, (rank - 1) % n
    got = torch.empty(16)
    if rank % 2 == 0:
        mcr.send(t, right)
        mcr.recv(got, left)
    else:
        mcr.recv(got, left)
        mcr.send(t, right)
if profiler is not None:
    profiler.__exit__(None, None, None)
    profiler.export_chrome_trace(sys.argv[2].replace("{rank}", str(rank)))
mcr.finalize()
print(f"rank {rank} traced OK", flush=True)
