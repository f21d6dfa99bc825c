"""The backend chosen for each call is identical on every rank, even for uneven all-to-all
whose local message sizes differ by rank. Usage: choice.py TABLE_PATH"""

import os
import sys

import torch

import mcr
from mcr.commlog import CommLog
from mcr.tuning.table import Entry, TuningTable
from tests.report import report

path = sys.argv[1]
n_world = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ["WORLD_SIZE"])
# small all-to-alls on gloo, large on mpi: the choice depends on the size
table = TuningTable(
    fingerprint={"world_size": n_world},
    entries=[
        Entry(op="all_to_all", group_size=n_world, min_bytes=0, max_bytes=1024, backend="gloo"),
        Entry(op="all_to_all", group_size=n_world, min_bytes=1024, max_bytes=None, backend="mpi"),
        Entry(op="all_reduce", group_size=n_world, min_bytes=0, max_bytes=None, backend="mpi"),
    ],
)
if (os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["RANK"]) == "0":
    table.save(path)
rt = mcr.init(comm_log=True, tuning=None)
mcr.barrier()
rt.router.table = TuningTable.load(path)
rank, n = mcr.get_rank(), mcr.get_world_size()

# rank 0 sends 4 floats per peer (small), the others 400 (large): the ranks must still agree
rows = 1 if rank == 0 else 100
width = 4
in_splits = [rows] * n
out_splits = [1 if r == 0 else 100 for r in range(n)]
inp = torch.full((rows * n, width), float(rank))
out = torch.empty(sum(out_splits), width)
mcr.all_to_all_single(out, inp, out_splits, in_splits)
expected = torch.cat([torch.full((s, width), float(r)) for r, s in enumerate(out_splits)])
assert torch.equal(out, expected)
used = {row["backend"] for row in rt.comm_log.rows() if row["op"] == "all_to_all"}

# every rank reports what it used; all must be the same
codes = {"gloo": 1, "mpi": 2}
mine = torch.tensor([codes[b] for b in sorted(used)] + [0] * (2 - len(used)), dtype=torch.int64)
everyone = torch.empty(2 * n, dtype=torch.int64)
mcr.all_gather_into_tensor(everyone, mine)
assert (everyone.view(n, 2) == mine).all(), f"ranks chose differently: {everyone.view(n, 2).tolist()}"
want = "mpi" if "mpi" in rt.backends else "gloo"  # under torchrun the table's mpi falls back to gloo
assert used == {want}, used

# and for a sweep of even sizes, ops and dtypes, each rank's choices are equal
names = sorted(rt.backends)
choices = []
for family in ("all_reduce", "all_to_all", "all_gather", "broadcast"):
    for size in (4, 512, 1023, 1024, 1 << 20):
        for dtype in (torch.float32, torch.bfloat16):
            backend, _ = rt.router.choose(family, size, rt.world, dtype, "cpu")
            choices.append(names.index(backend.name))
mine = torch.tensor(choices, dtype=torch.int64)
everyone = torch.empty(len(choices) * n, dtype=torch.int64)
mcr.all_gather_into_tensor(everyone, mine)
assert (everyone.view(n, -1) == mine).all()
# list all_to_all of nn.Parameter blocks (a tensor subclass) is sized like plain tensors: 300
# floats a block from every rank is above the table's 1 KiB line, so mpi, logged at its size
rt.comm_log = CommLog()
ins = [torch.nn.Parameter(torch.full((300,), 10.0 * rank + j), requires_grad=False) for j in range(n)]
outs = [torch.nn.Parameter(torch.empty(300), requires_grad=False) for _ in range(n)]
mcr.all_to_all(outs, ins)
for j, o in enumerate(outs):
    assert torch.equal(o, torch.full((300,), 10.0 * j + rank)), (j, o[:3])
rows = [(r["backend"], r["bytes"]) for r in rt.comm_log.rows() if r["op"] == "all_to_all"]
assert rows == [(want, 300 * 4 * n)], rows

# list all_to_all whose blocks are all one size on rank 0 (8 floats to and from everyone: 64 or 96
# bytes, gloo's side of the line) but not on the others (300 floats among themselves: mpi's side):
# every rank must still agree on one size, though rank 0 alone sees nothing uneven
rt.comm_log = CommLog()
ins = [torch.full((8 if 0 in (rank, j) else 300,), 10.0 * rank + j) for j in range(n)]
outs = [torch.empty(8 if 0 in (rank, j) else 300) for j in range(n)]
mcr.all_to_all(outs, ins)
for j, o in enumerate(outs):
    assert torch.equal(o, torch.full(o.shape, 10.0 * j + rank)), (j, o[:3])
(backend,) = {r["backend"] for r in rt.comm_log.rows() if r["op"] == "all_to_all"}
mine = torch.tensor([codes[backend]], dtype=torch.int64)
everyone = torch.empty(n, dtype=torch.int64)
mcr.all_gather_into_tensor(everyone, mine)
assert (everyone == mine).all(), f"ranks chose differently for a list all_to_all: {everyone.tolist()}"

report("CHOICE", rank, value={"uneven all_to_all": sorted(used)})
mcr.finalize()
