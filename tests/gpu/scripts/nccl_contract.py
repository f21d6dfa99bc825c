"""One rank with the GPU to itself: what one GPU can show of the NCCL contract the CPU tier checks
op by op (tests/streams): torch's own Work back from an async op, sends and receives to itself as
one NCCL group, NCCL ops captured into a CUDA graph and replayed, a runtime thread reading GPU ops
during a capture without breaking it, and a host-driven library refused under capture.

    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_contract     # on a GPU

Prints `rank 0: gpu LABEL OK N checks` per label (`work`, `p2p`, `capture`) and
`rank 0: gpu finalize OK`.
"""

import os
import signal
import tempfile
import time
from collections import namedtuple

import torch
import torch.distributed as dist

import mcr

from .races import Checks, Gpu, arguments

P2POp = namedtuple("P2POp", "op tensor peer group tag")  # torch's needs torch's default group
args = arguments(__doc__)
records = tempfile.mkdtemp(prefix="mcr-contract-fr-")
rt = mcr.init(watchdog_timeout_s=120, flight_recorder_dir=records)
assert mcr.get_world_size() == 1, "run on one rank"
gpu = Gpu(args.device, args.sleep_ms)
checks = Checks(0)
assert gpu.cuda, "needs a GPU: the contract's CPU side is tests/streams"
device = gpu.device

# --- work: an async op returns torch's Work, its future torch's --------------------------------
t = torch.arange(8, dtype=torch.float32, device=device)
work = mcr.all_reduce(t, async_op=True)
checks.expect_true("work", "an async NCCL op returns torch's Work", isinstance(work, dist.Work), type(work).__name__)
future = work.get_future()
checks.expect_true("work", "its future is torch's own", type(future) is torch.futures.Future, type(future).__name__)
work.wait()
checks.expect("work", "the all-reduce's value", t.cpu(), torch.arange(8, dtype=torch.float32))

# --- p2p: sends and receives to itself, one NCCL group -------------------------------------------
sent = torch.arange(6, dtype=torch.float32, device=device) + 7
got = torch.zeros(6, device=device)
works = mcr.batch_isend_irecv([P2POp(mcr.irecv, got, 0, None, 0), P2POp(mcr.isend, sent, 0, None, 0)])
checks.expect_true("p2p", "a batch is one Work", len(works) == 1, repr(works))
for w in works:
    w.wait()
checks.expect("p2p", "a batch to itself", got.cpu(), sent.cpu())
again = torch.zeros(6, device=device)
receive = mcr.irecv(again, 0)
mcr.send(sent * 2, 0)
receive.wait()
checks.expect("p2p", "a lone send and receive to itself", again.cpu(), (sent * 2).cpu())

# --- capture: NCCL ops in a CUDA graph, replayed -------------------------------------------------
torch.cuda._sleep(int(gpu.cycles_per_ms * 500))  # an op the GPU has not run when the capture starts:
mcr.all_reduce(torch.ones(4, device=device))  # the watchdog and a dump read it during the capture
held = len(rt.stream_ops)
x = torch.zeros(16, device=device)
side = torch.cuda.Stream(device)
side.wait_stream(torch.cuda.current_stream(device))
graph = torch.cuda.CUDAGraph()
with torch.cuda.stream(side):  # torch's capture rule: warm up, then capture, off the default stream
    x.add_(1)
    mcr.all_reduce(x)
    torch.cuda.current_stream(device).synchronize()
    x.zero_()
    dumped = os.path.join(records, "mcr_fr_rank_0")
    with torch.cuda.graph(graph, stream=side):
        x.add_(1)
        mcr.all_reduce(x)  # blocking: on the capturing stream
        mcr.all_reduce(x, op=mcr.ReduceOp.AVG, async_op=True).wait()  # async: NCCL's stream joins the capture
        os.kill(os.getpid(), signal.SIGUSR1)  # the watchdog thread dumps, reading the GPU ops, mid-capture
        deadline = time.monotonic() + 30
        while not os.path.exists(dumped) and time.monotonic() < deadline:
            time.sleep(0.01)
        checks.expect_true("capture", "a runtime thread read the GPU ops during the capture", os.path.exists(dumped))
        refused = ""
        try:
            mcr.all_reduce(torch.ones(4, device=device), backend="gloo")
        except RuntimeError as exc:
            refused = str(exc)
        checks.expect_true(
            "capture", "gloo refused under capture, naming the fix", "backend='nccl'" in refused, refused
        )
checks.expect_true("capture", "nothing captured is held", len(rt.stream_ops) <= held, f"{len(rt.stream_ops)} > {held}")
for _ in range(3):
    graph.replay()
torch.cuda.synchronize()
checks.expect("capture", "three replays of add, all-reduce, average", x.cpu(), torch.full((16,), 3.0))

checks.report()
mcr.finalize()
print("rank 0: gpu finalize OK", flush=True)
