"""What the Python side of a staged MPI op costs, on the CPU tier's stand-in at world size 1: a
blocking `mcr.all_reduce(t, backend="mpi/host")` on a CudaLike tensor against its bare copies (the
same pinned twin, copies and ready event, by hand), and the mcr calls one staged call makes.

    PATH=$PWD/.venv/bin:$PATH MCR_BACKENDS=mpi,gloo,nccl .venv/bin/python -m launch.local -n 1 \\
        -m tests.streams.scripts.staged_cost

The stand-in's own Python (its log, its stream queues) is in both columns; their difference is
what mcr adds to the copies on the host, and MPI's 1-rank all-reduce of host memory. A GPU's
figures (torch's pinned pool, CUDA's event calls, the copies themselves) are `make gpu-check`'s.
Prints one line per size: calls, and median microseconds per call over interleaved rounds with
the lowest and highest round.
"""

import statistics
import sys
import time

from tests.streams import cuda_model as cm

cm.install()

import torch  # noqa: E402

import mcr  # noqa: E402

ROUNDS, CALLS = 15, 200

rt = mcr.init(flight_recorder=0)
assert rt.world_size == 1, "run on one rank"


def staged(t):
    mcr.all_reduce(t, backend="mpi/host")


def bare(t):
    twin = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    twin.copy_(t, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    ready.synchronize()
    t.copy_(twin, non_blocking=True)


def rounds(fns, t):
    per = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                fn(t)
            per[name].append((time.perf_counter() - start) / CALLS * 1e6)
            cm.gpu_runs()
            del cm.LOG[:]  # the stand-in's log grows with every call: keep each round alike
    return per


def calls(fn, t):
    mcr_dir, seen = mcr.__path__[0], []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(mcr_dir):
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    fn(t)
    sys.setprofile(None)
    return len(seen)


for nbytes in (1 << 10, 1 << 20):
    t = cm.cuda_like(torch.ones(nbytes // 4))
    staged(t)  # the route is made
    per = rounds({"staged": staged, "bare": bare}, t)
    line = [f"{nbytes >> 10} KiB: staged call makes {calls(staged, t)} mcr calls;"]
    for name, times in per.items():
        line.append(f"{name} {statistics.median(times):.1f} us ({min(times):.1f}-{max(times):.1f})")
    diff = [s - b for s, b in zip(per["staged"], per["bare"])]
    line.append(f"staged - bare {statistics.median(diff):.1f} us (round by round)")
    print(" ".join(line), flush=True)
cm.gpu_runs(keep_up=True)
mcr.finalize()
