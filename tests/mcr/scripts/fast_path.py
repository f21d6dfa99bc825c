"""The MPI fast path on 2 ranks, every result compared whole against a local reference:
16-bit reductions (mcr's own MPI ops), a chunked all-reduce and how the comm log shows it.
Usage: fast_path.py TABLE (a tuning table that chunks all-reduces from 1 MiB up).
Prints `rank R: OK N checks`."""

import sys

import torch

import mcr

rt = mcr.init(comm_log=True, tuning=sys.argv[1])
rank, n = rt.rank, rt.world_size
assert n == 2, "the 16-bit reference rounds once: exact on 2 ranks"
NUMEL = (3 << 19) + 7  # 1.5 Mi elements and an odd tail: many MPI segments and chunks, none a round size
checks = 0


def data(r, dtype, numel=NUMEL):
    """Rank r's input: distinct per rank and per element, in a range where 16-bit sums round."""
    return (torch.randn(numel, generator=torch.Generator().manual_seed(100 + r)) * 3).to(dtype)


def reference(op, dtype, numel=NUMEL):
    """Each element's inputs combined in float32, rounded once to `dtype`."""
    a, b = (data(r, dtype, numel).float() for r in range(n))
    exact = {"sum": a + b, "avg": a + b, "product": a * b, "min": torch.minimum(a, b), "max": torch.maximum(a, b)}
    out = exact[op].to(dtype)
    return out.div_(n) if op == "avg" else out  # AVG: the rounded sum, divided (by 2: exact)


def expect(got, want, what):
    global checks
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        raise AssertionError(f"rank {rank}: {what}: {bad.numel()} elements differ, first at {bad[0].tolist()}")
    checks += 1


# 16-bit reductions run on MPI
for dtype in (torch.bfloat16, torch.float16):
    assert rt.router.choose("all_reduce", 64, rt.world, dtype, "cpu")[0].name == "mpi"  # no fallback to gloo
    for op in ("sum", "avg", "product", "min", "max"):
        t = data(rank, dtype)
        mcr.all_reduce(t, op=op, backend="mpi")
        expect(t, reference(op, dtype), f"all_reduce {op} {dtype}")
    t = data(rank, dtype)
    mcr.all_reduce(t, async_op=True, backend="mpi").wait()
    expect(t, reference("sum", dtype), f"async all_reduce {dtype}")
    for async_op in (False, True):  # small: summed on a float32 copy
        t = data(rank, dtype, 1003)
        handle = mcr.all_reduce(t, op="avg", async_op=async_op, backend="mpi")
        if handle is not None:
            handle.wait()
        expect(t, reference("avg", dtype, 1003), f"small all_reduce async={async_op} {dtype}")
    t = data(rank, dtype)
    mcr.all_reduce(t)  # the table's choice: MPI in 1 MiB chunks
    expect(t, reference("sum", dtype), f"chunked all_reduce {dtype}")
    t = data(rank, dtype)
    mcr.all_reduce(t, backend="gloo")  # gloo's native 16-bit sum gives the same bits
    expect(t, reference("sum", dtype), f"gloo all_reduce {dtype}")
    t = data(rank, dtype)
    mcr.reduce(t, dst=1, backend="mpi")
    if rank == 1:
        expect(t, reference("sum", dtype), f"reduce {dtype}")
    even = NUMEL // 2 * 2  # reduce-scatter: each rank gets its half of the summed input
    want = reference("sum", dtype)[:even].view(n, -1)[rank]
    out = torch.empty(even // n, dtype=dtype)
    mcr.reduce_scatter_tensor(out, data(rank, dtype)[:even], backend="mpi")
    expect(out, want, f"reduce_scatter_tensor {dtype}")
    out = torch.empty(even // n, dtype=dtype)
    mcr.reduce_scatter(out, list(data(rank, dtype)[:even].chunk(n)), async_op=True, backend="mpi").wait()
    expect(out, want, f"async reduce_scatter {dtype}")

# a chunked float32 all-reduce is logged once, whole, under its candidate's name
rt.comm_log = mcr.commlog.CommLog()
for async_op in (False, True):
    t = data(rank, torch.float32)
    handle = mcr.all_reduce(t, async_op=async_op)
    if handle is not None:
        handle.wait()
    expect(t, reference("sum", torch.float32), f"chunked float32 all_reduce async={async_op}")
rows = [(r["op"], r["backend"], r["bytes"], r["count"]) for r in rt.comm_log.rows()]
assert rows == [("all_reduce", "mpi/chunk=1M", NUMEL * 4, 2)], rows
# async MPI ops the caller waits on leave the runtime's list of handles to drive: an MPI-only
# job must not keep every handle it ever made
for _ in range(1000):
    mcr.all_reduce(torch.ones(1), async_op=True, backend="mpi").wait()
driven = rt.in_flight.sizes()[1]
assert driven <= 64, f"rank {rank}: {driven} handles kept"
print(f"rank {rank}: OK {checks} checks", flush=True)
mcr.finalize()
