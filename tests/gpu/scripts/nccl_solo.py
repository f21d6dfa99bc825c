"""One rank with the GPU to itself: every op on NCCL (and on the runtime's choice, which must be
NCCL for CUDA tensors) under stream races, then finalize().

    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_solo                  # on a GPU
    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_solo --device cpu     # gloo stands in

On one rank an in-place op (all-reduce, broadcast) leaves its tensor as it was, so a race cannot
show there; the out-of-place ops (gathers, scatters, reduce-scatters, all-to-alls) copy into
POISONed outputs, and the races show on those. There is no peer to send to.

Then (finding 12) a blocking NCCL all-reduce queued behind 300 ms of GPU work: it must stay in
flight, its flight-recorder entry not done, until the GPU has run it (label `in-flight`).

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

if gpu.cuda:  # finding 12: an NCCL op the GPU has not run yet stays in flight, watched and recorded
    from mcr.flight import DONE

    torch.cuda._sleep(int(gpu.cycles_per_ms * 300))  # 300 ms of GPU work queued before the op
    t = torch.ones(4, device=gpu.device)
    mcr.all_reduce(t, backend="nccl")  # returns at once: NCCL queued it behind the sleep
    entry = rt.recorder.entries[-1]
    pending = [h for h in rt.in_flight.handles() if not h.is_completed() and h.op.label == "nccl"]
    checks.expect_true(
        "in-flight", "a blocking NCCL op is in flight until the GPU ran it", len(pending) == 1, repr(pending)
    )
    checks.expect_true("in-flight", "its flight-recorder entry is not done yet", entry[DONE] == 0, repr(entry))
    torch.cuda.synchronize()
    done = all(h.is_completed() for h in pending)
    checks.expect_true("in-flight", "once the GPU ran it, it completes", done, repr(pending))
    checks.expect_true("in-flight", "and its entry is stamped done", entry[DONE] > 0, repr(entry))

checks.report()
rows = sorted({(r["op"], r["backend"], r["group_size"]) for r in rt.comm_log.rows()})
print(f"COMMLOG {rank} {json.dumps(rows)}", flush=True)
mcr.finalize()
print(f"rank {rank}: gpu finalize OK", flush=True)
