"""Random interleaving of sync and async ops over every backend; same seed on every rank.

Usage: stress.py NUM_OPS SEED. Every result is checked, so a wrong answer fails as loudly as
a hang (which the watchdog turns into a failure naming rank, op and backend).
"""

import random
import sys

import torch

import mcr

num_ops, seed = int(sys.argv[1]), int(sys.argv[2])
rt = mcr.init()
rank, n = mcr.get_rank(), mcr.get_world_size()
rng = random.Random(seed)  # identical sequence of choices on every rank
backends = list(rt.backends) + [None]
pending = []  # (handle, check) of async ops not yet waited


def all_reduce(b, asyn, size):
    t = torch.full((size,), float(rank + 1))
    want = n * (n + 1) / 2
    return mcr.all_reduce(t, backend=b, async_op=asyn), lambda: bool((t == want).all())


def all_gather(b, asyn, size):
    out = torch.empty(size * n)
    h = mcr.all_gather_into_tensor(out, torch.full((size,), float(rank)), backend=b, async_op=asyn)
    return h, lambda: bool((out.view(n, size)[:, 0] == torch.arange(n).float()).all())


def reduce_scatter(b, asyn, size):
    out = torch.empty(size)
    h = mcr.reduce_scatter_tensor(out, torch.ones(size * n), backend=b, async_op=asyn)
    return h, lambda: bool((out == n).all())


def all_to_all(b, asyn, size):
    splits = [(rank + j) % 3 + 1 for j in range(n)]  # uneven
    inp = torch.cat([torch.full((s,), float(rank * 100 + j)) for j, s in enumerate(splits)])
    out_splits = [(j + rank) % 3 + 1 for j in range(n)]
    out = torch.empty(sum(out_splits))
    h = mcr.all_to_all_single(out, inp, out_splits, splits, backend=b, async_op=asyn)
    want = torch.cat([torch.full((s,), float(j * 100 + rank)) for j, s in enumerate(out_splits)])
    return h, lambda: bool(torch.equal(out, want))


def broadcast(b, asyn, size):
    t = torch.full((size,), float(rank))
    return mcr.broadcast(t, n - 1, backend=b, async_op=asyn), lambda: bool((t == n - 1).all())


def ring(b, asyn, size):
    buf = torch.empty(size)
    s = mcr.isend(torch.full((size,), float(rank)), (rank + 1) % n, backend=b)
    r = mcr.irecv(buf, (rank - 1) % n, backend=b)
    if not asyn:
        s.wait(), r.wait()
        return None, lambda: bool((buf == (rank - 1) % n).all())
    return _Both(s, r), lambda: bool((buf == (rank - 1) % n).all())


class _Both:
    def __init__(self, *hs):
        self.hs = hs

    def wait(self):
        for h in self.hs:
            h.wait()


OPS = [all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, ring]
for i in range(num_ops):
    op, b, asyn = rng.choice(OPS), rng.choice(backends), rng.random() < 0.5
    size = rng.choice([1, 7, 64, 1000, 20000])
    handle, check = op(b, asyn, size)
    if asyn:
        pending.append((handle, check, op.__name__, b))
    elif not check():
        raise AssertionError(f"rank {rank}: op {i} {op.__name__} on {b} gave a wrong result")
    # wait on a random earlier async op now and then, out of issue order
    if pending and rng.random() < 0.3:
        h, chk, name, bb = pending.pop(rng.randrange(len(pending)))
        h.wait()
        if not chk():
            raise AssertionError(f"rank {rank}: async {name} on {bb} gave a wrong result")
for h, chk, name, bb in pending:
    h.wait()
    assert chk(), f"rank {rank}: async {name} on {bb} gave a wrong result"
mcr.barrier()
print(f"rank {rank}: stress OK {num_ops} ops", flush=True)
mcr.finalize()
