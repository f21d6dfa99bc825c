"""Random interleaving of sync and async ops over every backend; same seed on every rank.

Usage: stress.py NUM_OPS SEED [TABLE.yaml [CANDIDATE,...]]. Every result is checked as a whole tensor against
one computed locally, with distinct values per rank, per chunk and per element, so a wrong
answer or a wrong chunk-to-rank mapping fails as loudly as a hang (which the watchdog turns
into a failure naming rank, op and backend). With a table that splits ops by message size, the
automatic choice differs by size, and uneven all-to-alls (whose local sizes differ by rank)
take the agreed-size path among the async ops. Ops run on the world and on a subgroup. Async AVG
all-reduces drop their handles; their results are checked after finalize().
CANDIDATE,...: node-aware candidates (node:mpi+gloo) drawn beside the backends as `backend=`.
"""

import random
import sys

import torch

import mcr
from mcr.tuning.table import TuningTable

num_ops, seed = int(sys.argv[1]), int(sys.argv[2])
rt = mcr.init()
if len(sys.argv) > 3 and sys.argv[3] != "-":
    rt.router.table = TuningTable.load(sys.argv[3])
rank, n = mcr.get_rank(), mcr.get_world_size()
rng = random.Random(seed)  # identical sequence of choices on every rank
backends = list(rt.backends) + [None, None]  # the automatic choice twice as often
if len(sys.argv) > 4:
    backends += sys.argv[4].split(",")
# float32/int64: exact for these small integers on every backend; float64 for the wide range;
# 16-bit floats: MPI reduces them with its own ops (upcast below 64 KiB, Python ops above)
HALF = (torch.float16, torch.bfloat16)
DTYPES = [torch.float32, torch.float64, torch.int64, *HALF]
# 16-bit values: element period, chosen so that every sum of n ranks' values stays an integer
# below 256 (exact in bfloat16); odd, so a chunk of a power-of-two size is not a whole period
PERIOD = max(3, (256 + n) // (n + n * (n - 1) // 2 + n * n * (n - 1)) // 2 * 2 - 1)
GROUPS = [(rt.world, list(range(n)))]
if n > 2:
    sub_ranks = [0, n - 1]
    GROUPS.append((mcr.new_group(sub_ranks), sub_ranks))
pending = []  # (handle, check, description) of async ops not yet waited
issued = checked = 0


def data(r, chunk, size, dtype):
    """Rank r's values for one chunk: distinct per rank, chunk and element."""
    if dtype in HALF:
        return (torch.arange(size) % PERIOD + PERIOD * (r + n * chunk)).to(dtype)
    return (torch.arange(size) % 89 + 1000 * r + 100 * chunk).to(dtype)


def all_reduce(g, ranks, b, asyn, size, dtype):
    t = data(rank, 0, size, dtype)
    want = sum(data(r, 0, size, dtype) for r in ranks)
    return mcr.all_reduce(t, group=g, backend=b, async_op=asyn), lambda: torch.equal(t, want)


DROPPED = object()  # what an op returns for an async op whose handle it dropped
dropped = []  # (check, description): checked once finalize() has completed every op


def avg_all_reduce(g, ranks, b, asyn, size, dtype):
    """AVG is a SUM, then a divide the runtime applies when the op completes: async, the handle is
    dropped, and the runtime must still divide (a chunked all-reduce too)."""
    dtype = torch.float64 if dtype == torch.int64 else dtype  # AVG needs a floating-point tensor
    t = data(rank, 0, size, dtype)
    want = torch.stack([data(r, 0, size, dtype) for r in ranks]).sum(0) / len(ranks)
    mcr.all_reduce(t, op=mcr.ReduceOp.AVG, group=g, backend=b, async_op=asyn)
    return DROPPED if asyn else None, lambda: torch.equal(t, want)


def all_gather(g, ranks, b, asyn, size, dtype):
    out = torch.empty(size * len(ranks), dtype=dtype)
    h = mcr.all_gather_into_tensor(out, data(rank, 0, size, dtype), group=g, backend=b, async_op=asyn)
    return h, lambda: torch.equal(out, torch.cat([data(r, 0, size, dtype) for r in ranks]))


def reduce_scatter(g, ranks, b, asyn, size, dtype):
    out = torch.empty(size, dtype=dtype)
    inp = torch.cat([data(rank, j, size, dtype) for j in range(len(ranks))])
    h = mcr.reduce_scatter_tensor(out, inp, group=g, backend=b, async_op=asyn)
    me = ranks.index(rank)
    return h, lambda: torch.equal(out, sum(data(r, me, size, dtype) for r in ranks))


def all_to_all(g, ranks, b, asyn, size, dtype):
    me, k = ranks.index(rank), len(ranks)
    unit = max(1, size // 8)
    in_splits = [((me + j) % 3 + 1) * unit for j in range(k)]  # uneven, and different on each rank
    out_splits = [((j + me) % 3 + 1) * unit for j in range(k)]
    inp = torch.cat([data(rank, j, s, dtype) for j, s in enumerate(in_splits)])
    out = torch.empty(sum(out_splits), dtype=dtype)
    h = mcr.all_to_all_single(out, inp, out_splits, in_splits, group=g, backend=b, async_op=asyn)
    want = torch.cat([data(ranks[j], me, s, dtype) for j, s in enumerate(out_splits)])
    return h, lambda: torch.equal(out, want)


def broadcast(g, ranks, b, asyn, size, dtype):
    root = ranks[-1]
    t = data(rank, 0, size, dtype)
    return mcr.broadcast(t, root, group=g, backend=b, async_op=asyn), lambda: torch.equal(t, data(root, 0, size, dtype))


def ring(g, ranks, b, asyn, size, dtype):
    me, k = ranks.index(rank), len(ranks)
    buf = torch.empty(size, dtype=dtype)
    s = mcr.isend(data(rank, 0, size, dtype), ranks[(me + 1) % k], group=g, backend=b)
    r = mcr.irecv(buf, ranks[(me - 1) % k], group=g, backend=b)
    prev = ranks[(me - 1) % k]
    if not asyn:
        s.wait(), r.wait()
        return None, lambda: torch.equal(buf, data(prev, 0, size, dtype))
    return _Both(s, r), lambda: torch.equal(buf, data(prev, 0, size, dtype))


class _Both:
    def __init__(self, *hs):
        self.hs = hs

    def wait(self):
        for h in self.hs:
            h.wait()


def settle(handle, check, what):
    global checked
    handle.wait()
    if not check():
        raise AssertionError(f"rank {rank}: async {what} gave a wrong result")
    checked += 1


OPS = [all_reduce, avg_all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, ring]
for i in range(num_ops):
    op, b, asyn = rng.choice(OPS), rng.choice(backends), rng.random() < 0.5
    # 256: uneven all-to-alls whose ranks sit on both sides of the table's 1 KiB boundary (4 ranks, float32;
    # 2, float64), so only the agreed size keeps their choices equal; 20000 and 140000: all-reduces the
    # table chunks (from 64 KiB); 140000: async MPI ops on the backend's worker thread (from 256 KiB), 16-bit too
    size, dtype = rng.choice([1, 7, 64, 256, 1000, 20000, 140000]), rng.choice(DTYPES)
    group, ranks = rng.choice(GROUPS)
    settle_now, pick = rng.random() < 0.3, rng.random()  # drawn by every rank, member or not
    if rank not in ranks:
        continue  # every rank draws the same numbers; only the group's members issue the op
    issued += 1
    what = f"op {i} {op.__name__} on {b} {dtype} x{size} group {ranks}"
    handle, check = op(group, ranks, b, asyn, size, dtype)
    if handle is DROPPED:
        dropped.append((check, what))
    elif asyn:
        pending.append((handle, check, what))
    elif not check():
        raise AssertionError(f"rank {rank}: {what} gave a wrong result")
    else:
        checked += 1
    # wait on a random earlier async op now and then, out of issue order
    if pending and settle_now:
        settle(*pending.pop(int(pick * len(pending))))
for entry in pending:
    settle(*entry)
mcr.barrier()
mcr.finalize()  # completes the ops whose handles were dropped
for check, what in dropped:
    if not check():
        raise AssertionError(f"rank {rank}: {what}, its handle dropped, gave a wrong result")
    checked += 1
print(f"rank {rank}: stress OK {num_ops} ops, {issued} issued, {checked} checked", flush=True)
