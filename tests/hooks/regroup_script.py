"""A group destroyed and made again with the same ranks, three times (torch names such groups by
a hash of their ranks, `new_group(use_local_synchronization=True)`, so each is the same key to the
runtime): each must run on its own communicators.

    python -m launch.local -n 2 tests/hooks/regroup_script.py
"""

import torch
import torch.distributed as dist

from mcr.hooks import torch_backend

torch_backend.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
for again in range(3):
    group = dist.new_group(list(range(n)), use_local_synchronization=True)
    t = torch.arange(4.0) + 10 * rank + 100 * again  # distinct per rank, element and round
    dist.all_reduce(t, group=group)
    want = n * (torch.arange(4.0) + 100 * again) + 10 * sum(range(n))
    assert torch.equal(t, want), (again, t.tolist(), want.tolist())
    dist.destroy_process_group(group)
print(f"rank {rank}: regroup OK", flush=True)
dist.destroy_process_group()
