"""A group destroyed and made again with the same ranks, eight times (torch names such groups by
a hash of their ranks, `new_group(use_local_synchronization=True)`, so each is the same key to the
runtime): each must run on its own communicators. Rank 0 comes late to each creation, so rank 1
reads the store first: a gloo rendezvous under the previous group's key reads rank 0's old address
there and hangs. (Under mpiexec the MPI communicator is made first and lines the ranks up, so
the hang there is a race: 4 of 15 runs of three creations.)

    python -m launch.local -n 2 --launcher torchrun tests/hooks/regroup_script.py
"""

import time

import torch
import torch.distributed as dist

from mcr.hooks import torch_backend

torch_backend.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
for again in range(8):
    if rank == 0:
        time.sleep(0.2)
    group = dist.new_group(list(range(n)), use_local_synchronization=True)
    t = torch.arange(4.0) + 10 * rank + 100 * again  # distinct per rank, element and round
    dist.all_reduce(t, group=group)
    want = n * (torch.arange(4.0) + 100 * again) + 10 * sum(range(n))
    assert torch.equal(t, want), (again, t.tolist(), want.tolist())
    dist.destroy_process_group(group)
print(f"rank {rank}: regroup OK", flush=True)
dist.destroy_process_group()
