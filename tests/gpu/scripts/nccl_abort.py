"""One rank: mcr.abort() with an NCCL all-reduce queued behind 2 s of GPU work the GPU has not run
yet returns at once, as torch's abort does (ProcessGroupNCCL.abort), and the process then exits.

    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_abort                 # on a GPU
    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_abort --device cpu    # gloo stands in

Returning at once shows no wait, not an abort: the op at one rank has no GPU work of its own, and
a runtime that dropped the group without aborting it returns as fast. So NCCL's own log
(`nccl_log`) says what became of each communicator by the time abort() returned: made, then
aborted (`ncclCommAbort`, which ProcessGroupNCCL.abort calls), not destroyed (`ncclCommDestroy`,
its shutdown) or left alone.

Prints `rank 0: abort took S s with N ops in flight`, on a GPU `rank 0: nccl communicators: M
made, A of them aborted, D destroyed, L left`, and `rank 0: exits after abort`.
"""

import time

import torch

import mcr

from . import nccl_log
from .races import Gpu, arguments

args = arguments(__doc__)
log = nccl_log.turn_on() if args.device == "cuda" else None  # before the runtime makes NCCL's communicator
rt = mcr.init(watchdog_timeout_s=120)
gpu = Gpu(args.device, args.sleep_ms)
backend = "nccl" if gpu.cuda else "gloo"
if gpu.cuda:
    torch.cuda._sleep(int(gpu.cycles_per_ms * 2000))  # the op below waits behind this on its stream
    tensor = torch.ones(4, device=gpu.device)
else:
    tensor = torch.ones(4)
handle = mcr.all_reduce(tensor, backend=backend, async_op=True)
pending = len(rt.stream_ops) + sum(1 for h in rt.in_flight.handles() if not h.is_completed())
start = time.monotonic()
mcr.abort()
print(f"rank 0: abort took {time.monotonic() - start:.3f} s with {pending} ops in flight", flush=True)
if log is not None:
    ends = [steps for steps in nccl_log.communicators(log.read()).values() if steps[0] == "init"]
    aborted = sum(steps[1:] == ["abort"] for steps in ends)
    destroyed = sum("destroy" in steps for steps in ends)
    left = sum(steps == ["init"] for steps in ends)
    print(
        f"rank 0: nccl communicators: {len(ends)} made, {aborted} of them aborted, {destroyed} destroyed, {left} left"
    )
    print("".join(f"rank 0: nccl: {line}\n" for line in log.warnings), end="", flush=True)
print(f"rank 0: exits after abort; mcr initialized: {mcr.is_initialized()}", flush=True)
