"""Start and finalize the runtime again and again in one process, as scripts that call
init_process_group / destroy_process_group per phase (and torch's own test runner) do: each
start must get the MPI resources back that the last one freed (user reduce ops, communicators).

    restart.py TIMES     prints "rank R: restarted TIMES times" when every round's results were right
"""

import sys

import torch

import mcr

times = int(sys.argv[1])
for round in range(times):
    rt = mcr.init(backend="mpi")
    rank, n = mcr.get_rank(), mcr.get_world_size()
    t = (torch.arange(6, dtype=torch.float32) + 100 * rank + round).to(torch.bfloat16)  # a 16-bit op: MPI user ops
    mcr.all_reduce(t)
    want = sum(torch.arange(6, dtype=torch.float32) + 100 * r + round for r in range(n)).to(torch.bfloat16)
    assert torch.equal(t, want), (round, t, want)
    pair = mcr.new_group(range(n))  # a communicator and its twin each round
    x = torch.tensor([float(rank + round)])
    mcr.all_reduce(x, group=pair)
    assert x.item() == sum(r + round for r in range(n)), (round, x)
    mcr.finalize()
print(f"rank {rank}: restarted {times} times", flush=True)
