"""Run on every rank: every op on every available backend and on the automatic choice, for
each dtype and reduce op, checked against a reference computed locally from known inputs.

Usage: check_ops.py [node:INTRA+INTER ...] [RANKS ...]: node-aware candidates to run every op
on instead of the backends and the automatic choice (each op with a node-aware form runs as
phases inside and between nodes, the others flat; the flat runs are what a run without
candidates checks), and groups beyond the world, the subgroup and the singletons, each given as
comma-separated ranks (e.g. `0,1 2,3 1,2`: each node's ranks, and a pair across nodes); every
rank creates each one, its members run the ops on it."""

import itertools
import socket
import sys

import torch

import mcr

R = mcr.ReduceOp
REDUCE = {"sum": R.SUM, "max": R.MAX, "min": R.MIN, "product": R.PRODUCT, "avg": R.AVG}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]

rt = mcr.init(comm_log=True)
rank, n = mcr.get_rank(), mcr.get_world_size()
labels = [arg for arg in sys.argv[1:] if arg.startswith("node:")]
backends = labels or list(rt.backends) + [None]  # None: the automatic choice
checked = 0


def value(r, dtype, numel=5):
    """Rank r's input: distinct per rank and element, small integers so every reduction is
    exact in every dtype (products of 4 ranks' values stay within float16's integers)."""
    return (torch.arange(numel) + r + 1).to(dtype)


def reference(op, dtype, ranks):
    values = [value(r, torch.float64) for r in ranks]
    stacked = torch.stack(values)
    out = {
        "sum": stacked.sum(0),
        "max": stacked.max(0).values,
        "min": stacked.min(0).values,
        "product": stacked.prod(0),
        "avg": stacked.mean(0),
    }[op]
    return out.to(dtype)


def expect(got, want, what):
    global checked
    tol = 1e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-6
    if not torch.allclose(got.double(), want.double(), rtol=tol, atol=tol):
        raise AssertionError(f"rank {rank}: {what}: got {got.tolist()} want {want.tolist()}")
    checked += 1


def run(group, ranks):
    me = group.rank
    gsize = group.size
    for b, dtype, asyn in itertools.product(backends, DTYPES, (False, True)):
        tag = f"backend={b} dtype={dtype} async={asyn} group={ranks}"

        def done(h, asyn=asyn, tag=tag):
            if asyn:
                assert h is not None and h.wait() and h.is_completed(), tag
            else:
                assert h is None, tag

        for name, op in REDUCE.items():
            if name == "avg" and not dtype.is_floating_point:
                continue
            t = value(rank, dtype)
            done(mcr.all_reduce(t, op=op, group=group, async_op=asyn, backend=b))
            expect(t, reference(name, dtype, ranks), f"all_reduce {name} {tag}")
            root = ranks[-1]
            t = value(rank, dtype)
            done(mcr.reduce(t, root, op=op, group=group, async_op=asyn, backend=b))
            if rank == root:
                expect(t, reference(name, dtype, ranks), f"reduce {name} {tag}")
            # reduce_scatter: chunk j of rank r holds value(r + 4j), so every chunk differs and
            # group rank `me` must get the reduction of everyone's chunk `me`
            chunk = [r + 4 * me for r in ranks]
            out = torch.empty(5, dtype=dtype)
            inp = torch.cat([value(rank + 4 * j, dtype) for j in range(gsize)])
            done(mcr.reduce_scatter_tensor(out, inp, op=op, group=group, async_op=asyn, backend=b))
            expect(out, reference(name, dtype, chunk), f"reduce_scatter_tensor {name} {tag}")
            out = torch.empty(5, dtype=dtype)
            ins = [value(rank + 4 * j, dtype) for j in range(gsize)]
            done(mcr.reduce_scatter(out, ins, op=op, group=group, async_op=asyn, backend=b))
            expect(out, reference(name, dtype, chunk), f"reduce_scatter {name} {tag}")

        src = ranks[0]
        t = value(rank, dtype)
        done(mcr.broadcast(t, src, group=group, async_op=asyn, backend=b))
        expect(t, value(src, dtype), f"broadcast {tag}")

        outs = [torch.empty(5, dtype=dtype) for _ in range(gsize)]
        done(mcr.all_gather(outs, value(rank, dtype), group=group, async_op=asyn, backend=b))
        for r, o in zip(ranks, outs):
            expect(o, value(r, dtype), f"all_gather {tag}")
        out = torch.empty(5 * gsize, dtype=dtype)
        done(mcr.all_gather_into_tensor(out, value(rank, dtype), group=group, async_op=asyn, backend=b))
        expect(out, torch.cat([value(r, dtype) for r in ranks]), f"all_gather_into_tensor {tag}")

        dst = ranks[-1]
        gl = [torch.empty(5, dtype=dtype) for _ in range(gsize)] if rank == dst else None
        done(mcr.gather(value(rank, dtype), gl, dst=dst, group=group, async_op=asyn, backend=b))
        if rank == dst:
            for r, o in zip(ranks, gl):
                expect(o, value(r, dtype), f"gather {tag}")

        sl = [value(r * 10, dtype) for r in ranks] if rank == src else None
        out = torch.empty(5, dtype=dtype)
        done(mcr.scatter(out, sl, src=src, group=group, async_op=asyn, backend=b))
        expect(out, value(rank * 10, dtype), f"scatter {tag}")

        # even all_to_all_single: chunk j of rank r holds value(100*r + j)
        inp = torch.cat([value(100 * rank + j, dtype, 2) for j in range(gsize)])
        out = torch.empty_like(inp)
        done(mcr.all_to_all_single(out, inp, group=group, async_op=asyn, backend=b))
        expect(out, torch.cat([value(100 * r + me, dtype, 2) for r in ranks]), f"all_to_all_single even {tag}")

        # uneven: rank r sends (r + j + 1) rows of width 3 to group rank j
        width = 3
        in_splits = [me + j + 1 for j in range(gsize)]
        out_splits = [j + me + 1 for j in range(gsize)]
        inp = torch.cat([torch.full((s, width), 100 * me + j, dtype=dtype) for j, s in enumerate(in_splits)])
        out = torch.empty(sum(out_splits), width, dtype=dtype)
        done(mcr.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=asyn, backend=b))
        want = torch.cat([torch.full((s, width), 100 * j + me, dtype=dtype) for j, s in enumerate(out_splits)])
        expect(out, want, f"all_to_all_single uneven {tag}")

        # list all_to_all, uneven lengths
        ins = [torch.full((me + j + 1,), 10 * me + j, dtype=dtype) for j in range(gsize)]
        outs = [torch.empty(j + me + 1, dtype=dtype) for j in range(gsize)]
        done(mcr.all_to_all(outs, ins, group=group, async_op=asyn, backend=b))
        for j, o in enumerate(outs):
            expect(o, torch.full((j + me + 1,), 10 * j + me, dtype=dtype), f"all_to_all list {tag}")

        # ring send/recv within the group
        nxt, prv = ranks[(me + 1) % gsize], ranks[(me - 1) % gsize]
        buf = torch.empty(5, dtype=dtype)
        if gsize == 1:
            pass  # no backend sends to itself (torch.distributed neither)
        elif asyn:
            hs = mcr.isend(value(rank, dtype), nxt, group=group, backend=b)
            hr = mcr.irecv(buf, prv, group=group, backend=b)
            hs.wait(), hr.wait()
        elif me % 2 == 0:
            mcr.send(value(rank, dtype), nxt, group=group, backend=b)
            mcr.recv(buf, prv, group=group, backend=b)
        else:
            mcr.recv(buf, prv, group=group, backend=b)
            mcr.send(value(rank, dtype), nxt, group=group, backend=b)
        if gsize > 1:
            expect(buf, value(prv, dtype), f"send/recv {tag}")
        done(mcr.barrier(group=group, async_op=asyn, backend=b))


run(rt.world, list(range(n)))
# a subgroup of the odd ranks plus rank 0 (size 2 of 3, or 2 of 2), and a singleton group
sub_ranks = sorted({0} | set(range(1, n, 2)))
sub = mcr.new_group(sub_ranks)
if rank in sub_ranks:
    run(sub, sub_ranks)
solo = [mcr.new_group([r]) for r in range(n)][rank]
run(solo, [rank])
for ranks in [sorted(int(r) for r in arg.split(",")) for arg in sys.argv[1:] if arg not in labels]:
    group = mcr.new_group(ranks)
    if rank in ranks:
        run(group, ranks)
mcr.barrier()
print(f"rank {rank}: OK {checked} checks on backends {list(rt.backends)} on {socket.gethostname()}", flush=True)
mcr.finalize()
