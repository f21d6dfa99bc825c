"""One rank with the GPU to itself: every op on NCCL (and on the runtime's choice, which must be
NCCL for CUDA tensors) under stream races, then finalize().

    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_solo                  # on a GPU
    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_solo --device cpu     # gloo stands in

On one rank an in-place op (all-reduce, broadcast) leaves its tensor as it was, so a race cannot
show there; the out-of-place ops (gathers, scatters, reduce-scatters, all-to-alls) copy into
POISONed outputs, and the races show on those. There is no peer to send to.

Prints `rank 0: gpu LABEL OK N checks`, `COMMLOG 0 <json>` and `rank 0: gpu finalize OK`.
"""

import json

import torch

import mcr

from .catalogue import cases, large_avg
from .races import LARGE_SLEEP_MS, Checks, Gpu, arguments, dtype_name, run_races

args = arguments(__doc__)
rt = mcr.init(comm_log=True, watchdog_timeout_s=120)
rank, n = mcr.get_rank(), mcr.get_world_size()
assert n == 1, f"run on one rank, not {n}"
gpu = Gpu(args.device, args.sleep_ms)
checks = Checks(rank)
print(f"rank {rank}: gpu backends {sorted(rt.backends)}; sleep {gpu.cycles_per_ms:.0f} cycles/ms", flush=True)

nccl = "nccl" if gpu.cuda else "gloo"  # on CPU only the script's logic is checked
for label, backend in ((nccl, nccl), ("auto", None)):
    for dtype in (torch.float32, torch.bfloat16):
        for make in cases(rank, [0], None, backend, dtype).values():
            run_races(checks, label, gpu, make, dtype_name(dtype))
    for async_op in (False, True):
        handle = mcr.barrier(async_op=async_op, backend=backend)
        checks.expect_true(label, f"barrier async={async_op}", (handle is not None) == async_op, repr(handle))
        if handle is not None:
            handle.wait()
    run_races(checks, label, gpu, large_avg(rank, [0], None, backend, LARGE_SLEEP_MS), "float32")

checks.report()
rows = sorted({(r["op"], r["backend"], r["group_size"]) for r in rt.comm_log.rows()})
print(f"COMMLOG {rank} {json.dumps(rows)}", flush=True)
mcr.finalize()
print(f"rank {rank}: gpu finalize OK", flush=True)
