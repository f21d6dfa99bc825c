"""One rank with the GPU to itself: what one GPU can show of how mcr runs MPI on device memory,
which the CPU tier checks op by op (tests/streams/test_mpi_on_device.py). Each check delays the
stream a wrong runtime would depend on with a long kernel (`torch.cuda._sleep`), so the wrong
order is the one that shows:

    temporaries    (CUDA-aware MPI) async scatter and list reduce-scatter issued from a side
                   stream while the default stream sleeps: a stack or cat made on the MPI
                   worker's default stream, after the op's ready event, is still queued behind
                   the sleep when MPI reads it

    python -m launch.local -n 1 -m tests.gpu.scripts.mpi_on_device     # on a GPU

Prints `rank 0: gpu mpi cuda_aware=BOOL: WHY`, `rank 0: gpu LABEL OK N checks` per label (the
CUDA-aware ones only where MPI reads device memory) and `rank 0: gpu finalize OK`.
"""

import torch

import mcr

from .races import POISON, Checks, Gpu, arguments, mpi_cuda_aware, pattern

args = arguments(__doc__)
rt = mcr.init(watchdog_timeout_s=120)
assert mcr.get_world_size() == 1, "run on one rank: the GPU to itself"
gpu = Gpu(args.device, args.sleep_ms)
checks = Checks(0)
assert gpu.cuda, "needs a GPU: the CPU side is tests/streams"
device = gpu.device
aware, why = mpi_cuda_aware(rt)
print(f"rank 0: gpu mpi cuda_aware={aware}: {why}", flush=True)
N = 1 << 16  # 256 KiB of float32: a kernel on it takes a while, a sleep longer


def made(seed):
    return pattern(seed, N, torch.float32)


# --- temporaries: made on the issuing stream, before the ready event -------------------------------
if aware:
    for k in range(3):
        gpu.sync()
        with gpu.on(gpu.s1):
            parts = [made(10 * k + 1).to(device)]
            inputs = [made(10 * k + 2).to(device)]
            out = torch.full((N,), POISON, device=device)
            reduced = torch.full((N,), POISON, device=device)
        gpu.sync()
        gpu.sleep(gpu.sleep_ms, gpu.default)  # the stream a worker thread's kernels would queue on
        with gpu.on(gpu.s1):
            scattered = mcr.scatter(out, parts, src=0, async_op=True, backend="mpi")
            summed = mcr.reduce_scatter(reduced, inputs, async_op=True, backend="mpi")
            scattered.wait()
            summed.wait()
            got = [out.clone(), reduced.clone()]
        gpu.sync()
        for what, value, want in zip(("scatter", "reduce_scatter"), got, (made(10 * k + 1), made(10 * k + 2))):
            checks.expect("temporaries", f"async {what} round {k}", value.cpu(), want)

checks.report()
mcr.finalize()
print("rank 0: gpu finalize OK", flush=True)
