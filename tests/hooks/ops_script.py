"""Every torch.distributed op on backend "mcr" against the expected values (run on 2+ ranks).

    python -m launch.local -n 2 tests/hooks/ops_script.py [mcr|helper]

"mcr": dist.init_process_group(backend="mcr") (torchrun); "helper": the runtime first, via
mcr.hooks.torch_backend.init_process_group (any launcher). Prints "OK <rank> <backends>".
"""

import sys

import torch
import torch.distributed as dist

import mcr
from mcr.hooks import torch_backend


def check(name, got, want):
    if not torch.equal(got, want):
        raise AssertionError(f"rank {dist.get_rank()}: {name}: got {got.tolist()}, want {want.tolist()}")


def main(mode):
    if mode == "helper":
        torch_backend.init_process_group(comm_log=True)
    else:
        dist.init_process_group(backend="mcr", pg_options={"comm_log": True})
    rank, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "mcr", dist.get_backend()
    ranks_sum = float(sum(range(n)))

    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    check("all_reduce", t, torch.full((3,), ranks_sum))
    t = torch.full((3,), float(rank))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check("all_reduce avg", t, torch.full((3,), ranks_sum / n))
    t = torch.full((2,), float(rank))
    w = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
    assert w.wait()
    check("all_reduce async max", t, torch.full((2,), float(n - 1)))
    check("work future", w.get_future().value()[0], torch.full((2,), float(n - 1)))

    ts = [torch.full((2,), float(rank)), torch.full((3,), float(rank + 1))]
    dist.all_reduce_coalesced(ts)
    check("all_reduce_coalesced[0]", ts[0], torch.full((2,), ranks_sum))
    check("all_reduce_coalesced[1]", ts[1], torch.full((3,), ranks_sum + n))

    t = torch.full((2,), float(rank))
    dist.broadcast(t, src=n - 1)
    check("broadcast", t, torch.full((2,), float(n - 1)))
    t = torch.full((2,), float(rank))
    dist.reduce(t, dst=0)
    if rank == 0:
        check("reduce", t, torch.full((2,), ranks_sum))

    outs = [torch.empty(2) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    check("all_gather", torch.stack(outs), torch.arange(n, dtype=torch.float).repeat_interleave(2).view(n, 2))
    out = torch.empty(2 * n)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    check("all_gather_into_tensor", out, torch.arange(n, dtype=torch.float).repeat_interleave(2))

    # coalesced: torch's output lists are per rank, then per tensor
    outs = [[torch.empty(2), torch.empty(3)] for _ in range(n)]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(rank)), torch.arange(3.0) + 10 * rank])
    for r, (a, b) in enumerate(outs):
        check(
            f"all_gather_coalesced from rank {r}",
            torch.cat([a, b]),
            torch.tensor([r, r, 10 * r, 10 * r + 1, 10 * r + 2.0]),
        )

    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(rank + i)) for i in range(n)])
    check("reduce_scatter", out, torch.full((2,), ranks_sum + n * rank))
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.arange(2 * n, dtype=torch.float))
    check("reduce_scatter_tensor", out, n * torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float))

    # uneven all-to-all: rank r sends r+1 rows to every peer
    inp = torch.full((n * (rank + 1),), float(rank))
    out = torch.empty(sum(r + 1 for r in range(n)))
    dist.all_to_all_single(out, inp, [r + 1 for r in range(n)], [rank + 1] * n)
    check("all_to_all_single uneven", out, torch.cat([torch.full((r + 1,), float(r)) for r in range(n)]))
    outs = [torch.empty(1) for _ in range(n)]
    dist.all_to_all(outs, [torch.tensor([float(rank * 10 + i)]) for i in range(n)])
    check("all_to_all", torch.cat(outs), torch.tensor([float(r * 10 + rank) for r in range(n)]))

    gl = [torch.empty(1) for _ in range(n)] if rank == 0 else None
    dist.gather(torch.tensor([float(rank)]), gl, dst=0)
    if rank == 0:
        check("gather", torch.cat(gl), torch.arange(n, dtype=torch.float))
    t = torch.empty(1)
    dist.scatter(t, [torch.tensor([float(i)]) for i in range(n)] if rank == 0 else None, src=0)
    check("scatter", t, torch.tensor([float(rank)]))

    if rank < 2:
        peer = 1 - rank
        t = torch.tensor([float(rank)])
        if rank == 0:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)
        check("send/recv", t, torch.tensor([0.0]))
        ops = [dist.P2POp(dist.isend, torch.tensor([float(rank)]), peer), dist.P2POp(dist.irecv, t, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check("batch_isend_irecv", t, torch.tensor([float(peer)]))
        if rank == 0:  # from any source: the receiver picks the sender's route from size and dtype
            got = torch.zeros(2)
            src = dist.recv(got)
            check("recv from any source", got, torch.tensor([1.0, -1.0]))
            assert src == 1, f"recv from any source names rank {src}, not the sender 1"
        else:
            dist.send(torch.tensor([1.0, -1.0]), 0)
    dist.barrier()

    # a subgroup, created on every rank as torch requires; members get an mcr group
    sub = dist.new_group([0])
    if rank == 0:
        t = torch.ones(1)
        dist.all_reduce(t, group=sub)
        check("subgroup all_reduce", t, torch.ones(1))
    pair = dist.new_group(list(range(n)))
    t = torch.ones(1)
    dist.all_reduce(t, group=pair)
    check("new_group all_reduce", t, torch.full((1,), float(n)))
    outs = [torch.empty(1) for _ in range(n)]  # a group built by its members: MPI's list all-to-all has its twin
    dist.all_to_all(outs, [torch.tensor([float(rank * 10 + i)]) for i in range(n)], group=pair)
    check("new_group all_to_all", torch.cat(outs), torch.tensor([float(r * 10 + rank) for r in range(n)]))

    backends = sorted({b for (_, b, _, _) in mcr.runtime().comm_log._rows})
    print(f"OK {rank} {','.join(backends)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mcr")
