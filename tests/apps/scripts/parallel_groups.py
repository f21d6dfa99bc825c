"""Build ParallelDims' groups on real ranks and check each one by talking over it.

    parallel_groups.py torch|deepspeed TP PP EP

Starts communication the way an app of that kind does (setup_torch_comm or
setup_deepspeed_comm), builds every group, then on each of this rank's groups gathers the
members' global ranks with every available backend: the result must be the group's ranks in
the layout's order, so a wrong member, a wrong order or a group object that talks to the
wrong ranks all fail.
"""

import sys

import torch

import mcr
from apps.common.comm import CommConfig, finalize_comm, setup_deepspeed_comm, setup_torch_comm
from apps.common.parallel_dims import ParallelDims
from mcr.env import discover

kind, tp, pp, ep = sys.argv[1], *map(int, sys.argv[2:5])
launch = discover()
dims = ParallelDims(launch.world_size, tp=tp, pp=pp, ep=ep)  # checked before any process group
comm = CommConfig(backend="auto", log=False)
if kind == "torch":
    setup_torch_comm(comm)
    assert torch.distributed.get_backend() == "mcr", torch.distributed.get_backend()
else:
    setup_deepspeed_comm(comm)
    import deepspeed.comm as ds_dist

    assert ds_dist.is_initialized()
rank = mcr.get_rank()
groups = dims.build_groups(rank, experts=ep > 1)
c = groups.coords
assert dims.rank_of(c.pp, c.dp, c.tp) == rank, (c, rank)

checked = 0
for dim in ("tp", "dp", "pp") + (("ep", "ep_dp") if ep > 1 else ()):
    group = getattr(groups, dim)
    expected = next(ranks for ranks in dims.group_ranks(dim) if rank in ranks)
    for backend in mcr.runtime().backends:  # every started backend: each has its own communicator
        out = torch.full((len(expected),), -1, dtype=torch.int64)
        mcr.all_gather_into_tensor(out, torch.tensor([rank]), group=group, backend=backend)
        assert out.tolist() == expected, (dim, backend, out.tolist(), expected)
        checked += 1
print(f"OK rank {rank} coords {tuple(c)} checked {checked}", flush=True)
finalize_comm()
