"""A group destroyed and made again with the same ranks, eight times (torch names such groups by
a hash of their ranks, `new_group(use_local_synchronization=True)`, so each is the same key to the
runtime): each must run on its own communicators. Rank 0 comes late to each creation, so rank 1
reads the store first: a gloo rendezvous under the previous group's key reads rank 0's old address
there and hangs. (Under mpiexec the MPI communicator is made first and lines the ranks up, so
the hang there is a race: 4 of 15 runs of three creations.) Each group also runs a node-aware
all-reduce (on one node: its intra-node phase), whose node groups are made for that group and
destroyed with it: the threads left at the end are those there were before the first group, and
under mpiexec the MPI communicators too (each is a context, and MPI has few).

    python -m launch.local -n 2 --launcher torchrun -m tests.hooks.scripts.regroup
"""

import gc
import os
import time

import torch
import torch.distributed as dist

import mcr
from mcr.hooks import torch_backend

torch_backend.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
warm = torch.arange(3.0) + rank
mcr.all_reduce(warm, backend="node:gloo+gloo")  # the world's node groups and any thread started once
assert torch.equal(warm, torch.arange(3.0) * 2 + 1), warm.tolist()
threads_before = len(os.listdir("/proc/self/task"))  # gloo's threads are not Python's
mpi = mcr.runtime().backends.get("mpi")  # under mpiexec: a destroyed group frees its MPI contexts
contexts_before = mpi.open_communicators if mpi is not None else None
for again in range(8):
    if rank == 0:
        time.sleep(0.2)
    group = dist.new_group(list(range(n)), use_local_synchronization=True)
    t = torch.arange(4.0) + 10 * rank + 100 * again  # distinct per rank, element and round
    dist.all_reduce(t, group=group)
    want = n * (torch.arange(4.0) + 100 * again) + 10 * sum(range(n))
    assert torch.equal(t, want), (again, t.tolist(), want.tolist())
    u = torch.arange(6.0) * (rank + 1) + again
    mcr.all_reduce(u, group=group.mcr_group, backend="node:gloo+gloo")
    assert torch.equal(u, torch.arange(6.0) * 3 + 2 * again), (again, u.tolist())
    dist.destroy_process_group(group)
del group
gc.collect()
# a destroyed group takes its communicators' threads along, its node groups' too
threads_after = len(os.listdir("/proc/self/task"))
assert threads_after == threads_before, f"threads: {threads_before} before the groups, {threads_after} after"
if mpi is not None:
    contexts_after = mpi.open_communicators
    assert contexts_after == contexts_before, f"MPI communicators: {contexts_before} before, {contexts_after} after"
print(f"rank {rank}: regroup OK", flush=True)
dist.destroy_process_group()
