"""Every torch.distributed op on backend "mcr" against the expected values (run on 2+ ranks).

    python -m launch.local -n 2 -m tests.hooks.scripts.torch_ops [mcr|helper]

"mcr": dist.init_process_group(backend="mcr") (torchrun); "helper": the runtime first, via
mcr.hooks.torch_backend.init_process_group (any launcher). Prints "OK <rank> <backends>".
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

import mcr
from mcr.hooks import torch_backend


def check(name, got, want):
    if not torch.equal(got, want):
        raise AssertionError(f"rank {dist.get_rank()}: {name}: got {got.tolist()}, want {want.tolist()}")


def distinct(rank, k, salt=0):
    """k values that no other rank, element or op's input shares: 100 x rank + salt + i."""
    return torch.arange(k, dtype=torch.float) + 100 * rank + salt


def main(mode):
    if mode == "helper":
        torch_backend.init_process_group(comm_log=True)
    else:
        dist.init_process_group(backend="mcr", pg_options={"comm_log": True})
    rank, n = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "mcr", dist.get_backend()

    def summed(k, salt=0):  # what a SUM over every rank's distinct(r, k, salt) gives
        return torch.stack([distinct(r, k, salt) for r in range(n)]).sum(0)

    t = distinct(rank, 3)
    dist.all_reduce(t)
    check("all_reduce", t, summed(3))
    t = distinct(rank, 3)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check("all_reduce avg", t, summed(3) / n)
    t = distinct(rank, 2)
    w = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
    assert w.wait()
    check("all_reduce async max", t, distinct(n - 1, 2))
    check("work future", w.get_future().value()[0], distinct(n - 1, 2))

    ts = [distinct(rank, 2), distinct(rank, 3, salt=50)]
    dist.all_reduce_coalesced(ts)
    check("all_reduce_coalesced[0]", ts[0], summed(2))
    check("all_reduce_coalesced[1]", ts[1], summed(3, salt=50))

    t = distinct(rank, 2)
    dist.broadcast(t, src=n - 1)
    check("broadcast", t, distinct(n - 1, 2))
    t = distinct(rank, 2)
    dist.reduce(t, dst=0)
    if rank == 0:
        check("reduce", t, summed(2))

    outs = [torch.empty(2) for _ in range(n)]
    dist.all_gather(outs, distinct(rank, 2))
    check("all_gather", torch.stack(outs), torch.stack([distinct(r, 2) for r in range(n)]))
    out = torch.empty(2 * n)
    dist.all_gather_into_tensor(out, distinct(rank, 2))
    check("all_gather_into_tensor", out, torch.cat([distinct(r, 2) for r in range(n)]))

    # coalesced: torch's output lists are per rank, then per tensor
    outs = [[torch.empty(2), torch.empty(3)] for _ in range(n)]
    dist.all_gather_coalesced(outs, [distinct(rank, 2), distinct(rank, 3, salt=50)])
    for r, (a, b) in enumerate(outs):
        check(f"all_gather_coalesced from rank {r}", torch.cat([a, b]), torch.cat([distinct(r, 2), distinct(r, 3, 50)]))

    out = torch.empty(2)
    dist.reduce_scatter(out, [distinct(rank, 2, salt=10 * i) for i in range(n)])
    check("reduce_scatter", out, summed(2, salt=10 * rank))
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, distinct(rank, 2 * n))
    check("reduce_scatter_tensor", out, summed(2 * n)[2 * rank : 2 * rank + 2])

    # uneven all-to-all: rank r sends its r+1 values for each peer, in peer order
    inp = distinct(rank, n * (rank + 1))
    out = torch.empty(sum(r + 1 for r in range(n)))
    dist.all_to_all_single(out, inp, [r + 1 for r in range(n)], [rank + 1] * n)
    want = torch.cat([distinct(r, n * (r + 1))[rank * (r + 1) : (rank + 1) * (r + 1)] for r in range(n)])
    check("all_to_all_single uneven", out, want)
    outs = [torch.empty(1) for _ in range(n)]
    dist.all_to_all(outs, [torch.tensor([float(rank * 10 + i)]) for i in range(n)])
    check("all_to_all", torch.cat(outs), torch.tensor([float(r * 10 + rank) for r in range(n)]))

    gl = [torch.empty(2) for _ in range(n)] if rank == 0 else None
    dist.gather(distinct(rank, 2), gl, dst=0)
    if rank == 0:
        check("gather", torch.cat(gl), torch.cat([distinct(r, 2) for r in range(n)]))
    t = torch.empty(2)
    dist.scatter(t, [distinct(i, 2, salt=7) for i in range(n)] if rank == 0 else None, src=0)
    check("scatter", t, distinct(rank, 2, salt=7))

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

    # torch's coalescing manager with a device, as DeepSpeed ZeRO-3's all_gather_coalesced uses it:
    # the block's ops run as issued, and the Work it ends with waits for all of them
    outs = [torch.empty(2 * n) for _ in range(2)]
    with _coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for i, o in enumerate(outs):
            dist.all_gather_into_tensor(o, distinct(rank, 2, salt=30 * i), async_op=True)
    cm.wait()
    for i, o in enumerate(outs):
        check(f"coalesced all_gather_into_tensor {i}", o, torch.cat([distinct(r, 2, salt=30 * i) for r in range(n)]))
    t = distinct(rank, 2, salt=60)
    with _coalescing_manager(device=torch.device("cpu")):
        dist.all_reduce(t)
    check("coalesced all_reduce", t, summed(2, salt=60))
    dist.barrier()

    # a subgroup, created on every rank as torch requires; members get an mcr group
    sub = dist.new_group([0])
    if rank == 0:
        t = distinct(0, 2)
        dist.all_reduce(t, group=sub)
        check("subgroup all_reduce", t, distinct(0, 2))
    pair = dist.new_group(list(range(n)))
    t = distinct(rank, 2)
    dist.all_reduce(t, group=pair)
    check("new_group all_reduce", t, summed(2))
    outs = [torch.empty(1) for _ in range(n)]  # a group built by its members: MPI's list all-to-all has its twin
    dist.all_to_all(outs, [torch.tensor([float(rank * 10 + i)]) for i in range(n)], group=pair)
    check("new_group all_to_all", torch.cat(outs), torch.tensor([float(r * 10 + rank) for r in range(n)]))

    backends = sorted({b for (_, b, _, _) in mcr.runtime().comm_log._rows})
    print(f"OK {rank} {','.join(backends)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mcr")
