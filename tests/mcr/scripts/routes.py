"""Print the route the runtime takes for each `op:size` in argv (float32 CPU tensors, the world
group), then broadcast at three sizes, where a table naming an unavailable backend falls back.
Usage: routes.py TABLE op:size [op:size ...]"""

import sys

import torch

import mcr

rt = mcr.init(tuning=sys.argv[1])
for spec in sys.argv[2:]:
    op, size = spec.split(":")
    route = rt.router.route(op, int(size), rt.world, torch.float32, "cpu", None, "sum" if "reduce" in op else None)
    chunk = route.chunk_bytes if route.chunk_bytes and int(size) > route.chunk_bytes else "-"
    print(f"rank {rt.rank}: route {op} {size} {route.op.label} {chunk}", flush=True)
for length in (1, 2, 3):  # three sizes: three choices made, each falling back
    mcr.broadcast(torch.ones(length), 0)
print(f"rank {rt.rank}: routes done", flush=True)
mcr.finalize()
