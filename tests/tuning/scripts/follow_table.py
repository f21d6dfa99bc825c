"""The runtime follows the tuning table it loads (MCR_TUNING_FILE), as written, on every rank.

For each entry of the table's world-size group: three sizes inside its range must get exactly
the entry's backend and chunk size from the runtime, and a real all-reduce at that size must
run on it (the comm log says where it ran). Usage: follow_table.py EXPECT_CHANGED(0|1)
"""

import os
import sys

import torch

import mcr
from mcr.backends import builtin_order
from mcr.tuning.candidates import label

expect_changed = sys.argv[1] == "1"
rt = mcr.init(comm_log=True)
assert rt.router.table is not None and rt.router.table.path == os.environ["MCR_TUNING_FILE"], rt.router.table
n = mcr.get_world_size()
default = next(b for b in builtin_order("cpu") if b in rt.backends)
changed = 0
checked = 0
for e in rt.router.table.entries:
    if e.group_size != n or e.op != "all_reduce":
        continue
    high = e.max_bytes if e.max_bytes is not None else max(e.min_bytes * 4, 1 << 20)
    for nbytes in sorted({max(e.min_bytes, 4), (e.min_bytes + high) // 2, high - 1}):
        nbytes -= nbytes % 4
        if not e.min_bytes <= nbytes < high:
            continue
        backend, chunk = rt.router.choose("all_reduce", nbytes, rt.world, torch.float32, "cpu")
        assert (backend.name, chunk) == (e.backend, e.chunk_bytes), (nbytes, backend.name, chunk, e)
        rt.comm_log = mcr.commlog.CommLog()
        base = torch.arange(nbytes // 4, dtype=torch.float32) % 1000  # distinct per rank and element
        x = base + 1000 * rt.rank
        mcr.all_reduce(x)
        assert torch.equal(x, n * base + 1000 * sum(range(n))), "wrong all-reduce result"
        ran_on = {(row["backend"], row["bytes"], row["count"]) for row in rt.comm_log.rows()}
        chunked = e.chunk_bytes and nbytes > e.chunk_bytes  # logged whole, under its candidate's name
        assert ran_on == {(label(e.choice) if chunked else e.backend, nbytes, 1)}, (nbytes, ran_on, e)
        changed += e.backend != default or e.chunk_bytes != 0
        checked += 1
assert checked > 0, "the table has no all_reduce entry for this world size"
assert (changed > 0) == expect_changed, f"{changed} choices differ from the built-in order"
print(
    f"rank {mcr.get_rank()}: table followed at {checked} sizes ({changed} differ from the built-in {default}) OK",
    flush=True,
)
mcr.finalize()
