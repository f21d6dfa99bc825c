"""One call of each op family without naming a backend (unless argv says `explicit`), so the
comm log shows which backend each rung of the choice gave it. The test sets the user's knobs
(MCR_BACKEND, MCR_BACKEND_<OP>, MCR_TUNING_FILE) and reads MCR_COMM_LOG_JSON. `forced`: the
calls three times, the second under force_backend("gloo").
Usage: precedence.py [explicit | forced]"""

import sys

import torch

import mcr

mcr.init(comm_log=True)
rank, n = mcr.get_rank(), mcr.get_world_size()
explicit = "mpi" if sys.argv[1:] == ["explicit"] else None


def run_ops():
    t = torch.arange(8, dtype=torch.float32) + rank
    mcr.all_reduce(t, backend=explicit)  # only all_reduce ever names a backend
    assert torch.equal(t, n * torch.arange(8, dtype=torch.float32) + sum(range(n)))
    out = torch.empty(8 * n)
    mcr.all_gather_into_tensor(out, torch.full((8,), float(rank)))
    assert torch.equal(out, torch.arange(n).float().repeat_interleave(8))
    part = torch.empty(8)
    mcr.reduce_scatter_tensor(part, torch.arange(8.0 * n) + rank)
    assert torch.equal(part, n * torch.arange(8.0 * rank, 8.0 * (rank + 1)) + sum(range(n)))
    inp = torch.arange(4.0 * n) + 100 * rank
    got = torch.empty(4 * n)
    mcr.all_to_all_single(got, inp)
    assert torch.equal(got, torch.cat([torch.arange(4.0 * rank, 4.0 * (rank + 1)) + 100 * r for r in range(n)]))
    b = torch.full((8,), float(rank))
    mcr.broadcast(b, n - 1)
    assert torch.equal(b, torch.full((8,), float(n - 1)))


if sys.argv[1:] == ["forced"]:  # the same calls again: each pass must choose afresh, not reuse the last
    run_ops()
    mcr.runtime().router.force_backend("gloo")
    run_ops()
    mcr.runtime().router.force_backend(None)
run_ops()
print(f"rank {rank}: precedence ran", flush=True)
mcr.finalize()
