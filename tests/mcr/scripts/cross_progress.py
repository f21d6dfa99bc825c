"""An async MPI op still in flight on one rank while that rank blocks in gloo, and its peer
waits for the MPI op first: legal (each rank may wait on its handles in any order), and it
must not deadlock, whether the gloo wait is a blocking op or a wait on a gloo handle, and
whether the MPI op is a collective or a send. Usage: cross_progress.py"""

import torch

import mcr

mcr.init()
rank, n = mcr.get_rank(), mcr.get_world_size()
assert n == 2
N = 1 << 20  # 4 MiB: MPI needs many rounds of progress from both ranks
base = torch.arange(N, dtype=torch.float32)
for how in ("blocking gloo op", "wait on a gloo handle"):
    for kind in ("all_reduce", "send"):
        big = base + rank
        if kind == "all_reduce":
            h = mcr.all_reduce(big, backend="mpi", async_op=True)
            want = 2 * base + 1
        elif rank == 0:
            h = mcr.isend(big, 1, backend="mpi")
            want = base
        else:
            h = mcr.irecv(big, 0, backend="mpi")
            want = base
        small = torch.full((4,), float(rank + 1))
        if rank == 1:
            h.wait()  # waits on MPI while rank 0 is already blocked in gloo below
        if how == "blocking gloo op":
            mcr.all_reduce(small, backend="gloo")
        else:
            mcr.all_reduce(small, backend="gloo", async_op=True).wait()
        h.wait()
        assert torch.equal(big, want), (how, kind, big[:4])
        assert torch.equal(small, torch.full((4,), 3.0)), (how, kind, small)
        print(f"rank {rank}: {kind} then {how}: OK", flush=True)
mcr.barrier()
print(f"rank {rank}: cross progress OK", flush=True)
mcr.finalize()
