"""The blocking all-reduce's hot path on 2 ranks: a route made ready by one call is reused only
by calls that would choose it (same size, dtype, explicit backend, forced backend), each call
recorded once. Every result is compared whole. Prints `rank R: hot path OK N checks`."""

import torch

import mcr

rt = mcr.init(comm_log=True)
rank, n = rt.rank, rt.world_size
others = sum(range(n)) - rank  # what the other ranks add, per element, above their own data
checks = 0


def check(got, want, what):
    global checks
    assert torch.equal(got, want), f"rank {rank}: {what}: got {got.tolist()[:8]}, want {want.tolist()[:8]}"
    checks += 1


def ran_on():
    """(backend, bytes, count) of each all-reduce since the last call, and a fresh log."""
    rows = {(r["backend"], r["bytes"], r["count"]) for r in rt.comm_log.rows() if r["op"] == "all_reduce"}
    rt.comm_log = mcr.commlog.CommLog()
    return rows


def summed(base, dtype=torch.float32):
    """Each rank's input `base + 100 * rank`, and the sum every rank must hold after."""
    mine = (base + 100 * rank).to(dtype)
    return mine, (n * base + 100 * (rank + others)).to(dtype)


base = torch.arange(4, dtype=torch.float32)
assert rt.direct, "no debug checks or profiler spans here: the api runs ready routes itself"
x = torch.empty(4)
before = len(rt.recorder.entries())
long_way = []  # the calls that went through Runtime.call: only the first makes the route ready
call = rt.call
rt.call = lambda request: (long_way.append(request.family), call(request))[1]
for step in range(5):  # one tensor, new data each time: the route is made once and reused
    mine, want = summed(base + step)
    x.copy_(mine)
    mcr.all_reduce(x)
    check(x, want, f"float32 all-reduce, call {step}")
rt.call = call
assert long_way == ["all_reduce"], f"the api's shortcut missed the ready route: {len(long_way)} calls took the long way"
assert ran_on() == {("mpi", 16, 5)}, "one route, on MPI, each call logged once"
entries = rt.recorder.entries()[before:]
assert len(entries) == 5, f"{len(entries)} flight-recorder entries for 5 calls"
assert [e[3] for e in entries] == list(range(entries[0][3], entries[0][3] + 5)), "sequence numbers not consecutive"

# the same 16 bytes as int32: a route of its own (summed as floats, the bits would be wrong)
mine, want = summed((torch.arange(4) + 1) * 200_000_003, torch.int32)  # bits of normal floats
mcr.all_reduce(mine)
check(mine, want, "int32 all-reduce of the same size")
# more elements of the same dtype: all of them reduced
mine, want = summed(torch.arange(9, dtype=torch.float32))
mcr.all_reduce(mine)
check(mine, want, "float32 all-reduce of 9 elements")
assert ran_on() == {("mpi", 16, 1), ("mpi", 36, 1)}

# the same size and dtype, another backend: named explicitly, then forced
mine, want = summed(base)
mcr.all_reduce(mine, backend="gloo")
check(mine, want, "explicit gloo")
rt.router.force_backend("gloo")
mine, want = summed(base)
mcr.all_reduce(mine)
check(mine, want, "forced gloo")
rt.router.force_backend(None)
mine, want = summed(base)
mcr.all_reduce(mine)
check(mine, want, "back to the choice")
assert ran_on() == {("gloo", 16, 2), ("mpi", 16, 1)}

# a tensor whose storage is swapped under it, and a strided view: never the old route
x.data = torch.zeros(6)
x += base.repeat(2)[:6] + 100 * rank
mcr.all_reduce(x)
check(x, n * base.repeat(2)[:6] + 100 * (rank + others), "after x.data was replaced")
view = torch.zeros(8)[::2]
try:
    mcr.all_reduce(view)
    raise AssertionError("a strided view was reduced")
except ValueError as exc:
    assert "not contiguous" in str(exc), exc
assert ran_on() == {("mpi", 24, 1)}

print(f"rank {rank}: hot path OK {checks} checks", flush=True)
mcr.finalize()
