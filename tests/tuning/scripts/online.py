"""Online tuning (tuning: auto): the ranks measure each new (op, size bucket) together, agree on
the winner, stick to it, and save what they learned. Usage: online.py OUT_DIR

Every rank prints its decisions; the test compares them across ranks."""

import json
import os
import sys

import torch

import mcr

out_dir = sys.argv[1]
rt = mcr.init(tuning="auto")
tuner = rt.router.table
assert tuner.online, "tuning: auto did not start the online tuner"
rank, n = mcr.get_rank(), mcr.get_world_size()

sizes = [16, 4096, 512 << 10, 3 << 20]  # 3 MiB: the 1 MiB chunked all-reduce is a candidate there
for step in range(3):  # "iterations" of a job: the first one measures, later ones reuse
    for nbytes in sizes:
        # distinct per rank, element and step (small integers: exact in float32 whatever the
        # order of the sum), so a chunk or block put in the wrong place shows
        base = torch.arange(nbytes // 4, dtype=torch.float32) % 1000
        x = base + 1000 * rank + step
        mcr.all_reduce(x)
        assert torch.equal(x, n * base + 1000 * sum(range(n)) + n * step), "wrong all-reduce result"
        out = torch.empty(nbytes // 4 * n)
        mcr.all_gather_into_tensor(out, base + 1000 * rank)
        assert torch.equal(out, torch.cat([base + 1000 * r for r in range(n)])), "wrong all-gather result"
    if step == 0:
        after_first = tuner.measured
assert tuner.measured == after_first == 2 * len(sizes), (tuner.measured, after_first)

decisions = {
    f"{op}@{low}": [c.backend, c.chunk_bytes, lat] for (_, op, _, low), (_, _, c, lat, _) in tuner.decisions.items()
}
for (_, op, _, low), (_, _, c, lat, _) in tuner.decisions.items():
    assert len(lat) >= 2 and all(t > 0 for t in lat.values()), lat  # every candidate was measured
    nbytes = max(low, 16)
    chosen, chunk = rt.router.choose(op, nbytes, rt.world, torch.float32, "cpu")
    assert (chosen.name, chunk) == (c.backend, c.chunk_bytes), (op, nbytes, chosen.name, chunk, c)
with open(os.path.join(out_dir, f"decisions-{rank}.json"), "w") as f:
    json.dump(decisions, f, sort_keys=True)
tuner.table().save(os.path.join(out_dir, f"learned-{rank}.yaml"))
print(f"rank {rank}: online decisions {sorted((k, v[:2]) for k, v in decisions.items())} OK", flush=True)
mcr.finalize()
