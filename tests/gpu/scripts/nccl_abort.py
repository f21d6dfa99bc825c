"""One rank: mcr.abort() with an NCCL all-reduce queued behind 2 s of GPU work the GPU has not run
yet returns at once, as torch's abort does (ProcessGroupNCCL.abort), and the process then exits.

    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_abort                 # on a GPU
    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_abort --device cpu    # gloo stands in

Prints `rank 0: abort took S s with N ops in flight` and `rank 0: exits after abort`.
"""

import time

import torch

import mcr

from .races import Gpu, arguments

args = arguments(__doc__)
rt = mcr.init(watchdog_timeout_s=120)
gpu = Gpu(args.device, args.sleep_ms)
backend = "nccl" if gpu.cuda else "gloo"
if gpu.cuda:
    torch.cuda._sleep(int(gpu.cycles_per_ms * 2000))  # the op below waits behind this on its stream
    tensor = torch.ones(4, device=gpu.device)
else:
    tensor = torch.ones(4)
handle = mcr.all_reduce(tensor, backend=backend, async_op=True)
pending = sum(1 for h in rt.in_flight.handles() if not h.is_completed())
start = time.monotonic()
mcr.abort()
print(f"rank 0: abort took {time.monotonic() - start:.3f} s with {pending} ops in flight", flush=True)
print(f"rank 0: exits after abort; mcr initialized: {mcr.is_initialized()}", flush=True)
