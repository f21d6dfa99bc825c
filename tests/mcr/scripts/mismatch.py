"""Rank 1 makes a different collective call from rank 0 (MCR_DEBUG=detail must name both).
Usage: mismatch.py none|op|dtype|shape|skip|skip-last|reduce-op|subgroup
  reduce-op: rank 1 all-reduces with MAX where rank 0 sums
  subgroup:  (4 ranks) on a group of ranks 1, 2 and 3, rank 2 all-reduces with MAX where 1 and 3 sum"""

import sys

import torch

import mcr

mode = sys.argv[1]
mcr.init()
rank, n = mcr.get_rank(), mcr.get_world_size()
t = torch.arange(4, dtype=torch.float32) + rank
mcr.all_reduce(t)  # the same first call everywhere
assert torch.equal(t, n * torch.arange(4, dtype=torch.float32) + sum(range(n)))
odd = rank == 1
if mode == "subgroup":
    sub = mcr.new_group([1, 2, 3])  # every rank makes it, as torch's new_group
    if rank in (1, 2, 3):
        t = torch.arange(8, dtype=torch.float32) + 10 * rank
        mcr.all_reduce(t, op=mcr.ReduceOp.MAX if rank == 2 else mcr.ReduceOp.SUM, group=sub)
elif mode == "reduce-op" and odd:
    mcr.all_reduce(torch.ones(8), op=mcr.ReduceOp.MAX)
elif mode == "op" and odd:
    mcr.all_gather_into_tensor(torch.empty(8 * n), torch.ones(8))
elif mode == "dtype" and odd:
    mcr.all_reduce(torch.ones(8, dtype=torch.float64))
elif mode == "shape" and odd:
    mcr.all_reduce(torch.ones(9))
elif mode == "skip" and odd:
    pass
else:
    mcr.all_reduce(torch.ones(8))
# uneven all-to-all: sizes differ by rank, legitimately
splits = [rank + 1] * n
out = torch.empty(sum(r + 1 for r in range(n)))
if not (mode == "skip-last" and odd):
    mcr.all_to_all_single(out, torch.full((sum(splits),), float(rank)), [r + 1 for r in range(n)], splits)
    assert torch.equal(out, torch.cat([torch.full((r + 1,), float(r)) for r in range(n)]))
mcr.finalize()
print(f"rank {rank}: calls matched", flush=True)
