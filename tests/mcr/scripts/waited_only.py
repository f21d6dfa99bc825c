"""A handle that its library marks done only inside its own wait() (torch's gloo reduce-scatter
and send/recv Works), waited on while this rank has an MPI receive posted whose send its peer
makes only after a later gloo op. Legal (a receive may be posted early; handles may be waited
in any order), and it must not hang: the wait cannot be polled, so MPI is driven beside it,
not instead of it. Usage: waited_only.py"""

import torch

import mcr

mcr.init()
rank, n = mcr.get_rank(), mcr.get_world_size()
assert n == 2
for kind in ("reduce_scatter", "recv"):
    # 1. the gloo op whose handle no test ever completes
    if kind == "reduce_scatter":
        got1 = torch.empty(4)
        h1 = mcr.reduce_scatter_tensor(got1, torch.arange(8.0) + 10 * rank, backend="gloo", async_op=True)
        want1 = 2 * torch.arange(4.0 * rank, 4.0 * rank + 4) + 10
    elif rank == 0:
        got1, want1 = torch.empty(4), torch.full((4,), 7.0)
        h1 = mcr.irecv(got1, 1, backend="gloo")
    else:
        got1 = want1 = torch.full((4,), 7.0)
        h1 = mcr.isend(got1, 0, backend="gloo")
    # 2. rank 0 posts an MPI receive that rank 1 matches only after step 3
    if rank == 0:
        got2 = torch.empty(1000)
        h2 = mcr.irecv(got2, 1, backend="mpi")
    h1.wait()  # must not wait for h2 to finish first: h2 needs step 3, which needs this rank
    # 3. a blocking gloo op both ranks take part in
    both = torch.ones(1)
    mcr.all_reduce(both, backend="gloo")
    # 4. the send that completes rank 0's receive
    if rank == 1:
        mcr.send(torch.arange(1000.0), 0, backend="mpi")
    else:
        h2.wait()
        assert torch.equal(got2, torch.arange(1000.0)), got2[:4]
    assert torch.equal(got1, want1) and both.item() == 2, (kind, got1, want1, both)
    print(f"rank {rank}: {kind} waited while an MPI receive is pending: OK", flush=True)
mcr.barrier()
print(f"rank {rank}: waited only OK", flush=True)
mcr.finalize()
