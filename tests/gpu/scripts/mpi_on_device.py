"""One rank with the GPU to itself: what one GPU can show of how mcr runs MPI on device memory,
which the CPU tier checks op by op (tests/streams/test_mpi_on_device.py). Each check delays the
stream a wrong runtime would depend on with a long kernel (`torch.cuda._sleep`), so the wrong
order is the one that shows:

    temporaries    (CUDA-aware MPI) async scatter and list reduce-scatter issued from a side
                   stream while the default stream sleeps: a stack or cat made on the MPI
                   worker's default stream, after the op's ready event, is still queued behind
                   the sleep when MPI reads it
    copy-out       (CUDA-aware MPI) async list all-gather and gather from the side stream while
                   the default stream sleeps: a copy-out from the packed result run on the
                   worker's default stream lands after the consumer, which reads POISON
    recorded       (staged MPI, any MPI) an async AVG all-reduce issued from the side stream on a
                   tensor made on the default stream; the side stream then sleeps, so the op's
                   copy-back and divide wait there; the caller frees the tensor and makes a new
                   one of its size on the default stream: without `record_stream` the allocator
                   hands it the freed block at once, and the pending copy-back overwrites it
    cross-stream   (staged MPI; CUDA-aware MPI too where MPI reads device memory) an async list
                   all-gather issued from the side stream, its input freed right after issue and
                   a new tensor filled with -POISON there at once, the output consumed there
                   while the default stream sleeps
    turns          (CUDA-aware MPI beside NCCL) an async NCCL all-reduce behind a sleep, then a
                   blocking CUDA-aware all-gather from an idle stream: MPI's call must start only
                   once the NCCL op has run; then an async CUDA-aware all-gather behind a sleep
                   and a blocking NCCL all-reduce from an idle stream: it must return only once
                   MPI's call has (the MPI backend's call is observed, not changed)

    python -m launch.local -n 1 -m tests.gpu.scripts.mpi_on_device     # on a GPU

Prints `rank 0: gpu mpi cuda_aware=BOOL: WHY`, `rank 0: gpu LABEL OK N checks` per label (the
CUDA-aware ones only where MPI reads device memory) and `rank 0: gpu finalize OK`.
"""

import threading

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

# --- copy-out: on the issuing stream, as a finisher ---------------------------------------------------
if aware:
    for k in range(3):
        gpu.sync()
        with gpu.on(gpu.s1):
            source = made(10 * k + 3).to(device)
            listed = [torch.full((N,), POISON, device=device)]
            gathered = [torch.full((N,), POISON, device=device)]
        gpu.sync()
        gpu.sleep(gpu.sleep_ms, gpu.default)
        with gpu.on(gpu.s1):
            for handle in (
                mcr.all_gather(listed, source, async_op=True, backend="mpi"),
                mcr.gather(source, gathered, dst=0, async_op=True, backend="mpi"),
            ):
                handle.wait()
            got = [listed[0].clone(), gathered[0].clone()]  # the consumer, on the issuing stream
        gpu.sync()
        for what, value in zip(("all_gather", "gather"), got):
            checks.expect("copy-out", f"async {what} round {k}", value.cpu(), made(10 * k + 3))


# --- recorded: a tensor touched off its allocation stream is recorded there ---------------------------
for k in range(3):
    gpu.sync()
    t = made(10 * k + 4).to(device)  # made on the default stream
    gpu.sync()
    with gpu.on(gpu.s1):
        handle = mcr.all_reduce(t, op=mcr.ReduceOp.AVG, async_op=True, backend="mpi/host")
        gpu.sleep(gpu.sleep_ms)  # the caller's next work: the copy-back and divide queue behind it
        handle.wait()
    del t, handle
    junk = torch.full((N,), -POISON, device=device)  # on the default stream: t's block, if nothing held it
    gpu.sync()
    checks.expect("recorded", f"a new tensor in a freed one's place, round {k}", junk.cpu(), torch.full((N,), -POISON))
    del junk


# --- cross-stream: issued from a side stream, input freed at once, output consumed there -------------
for backend in ["mpi/host"] + (["mpi"] if aware else []):
    for k in range(3):
        gpu.sync()
        with gpu.on(gpu.s1):
            outs = [torch.full((N,), POISON, device=device)]
        gpu.sync()
        gpu.sleep(gpu.sleep_ms, gpu.default)
        with gpu.on(gpu.s1):
            gpu.sleep(gpu.sleep_ms)  # a late producer
            source = made(10 * k + 5).to(device)
            handle = mcr.all_gather(outs, source, async_op=True, backend=backend)
            del source
            junk = torch.full((N,), -POISON, device=device)  # takes the input's block if nothing holds it
            handle.wait()
            got = torch.stack(outs)[0]
        gpu.sync()
        checks.expect("cross-stream", f"{backend} round {k}", got.cpu(), made(10 * k + 5))
        del junk

# --- turns: a CUDA-aware MPI op and NCCL ops never on the GPU at once ----------------------------------
if aware:
    mpi = rt.backends["mpi"]
    gather, seen = mpi.all_gather_into_tensor, {}
    returned = threading.Event()

    def observed_gather(*args):
        seen["nccl ran"] = nccl_work.is_completed() if nccl_work is not None else None
        try:
            return gather(*args)
        finally:
            returned.set()

    mpi.all_gather_into_tensor = observed_gather  # the list all-gather's route looks it up at each call
    for k in range(3):
        gpu.sync()
        with gpu.on(gpu.s2):
            gpu.sleep(gpu.sleep_ms)
            nccl_work = mcr.all_reduce(made(10 * k + 6).to(device), async_op=True, backend="nccl")
        with gpu.on(gpu.s1):
            outs = [torch.full((N,), POISON, device=device)]
            mcr.all_gather(outs, made(10 * k + 7).to(device), backend="mpi")
        checks.expect_true("turns", f"MPI started after the NCCL op ran, round {k}", seen.get("nccl ran") is True, seen)
        nccl_work.wait()
        gpu.sync()
        checks.expect("turns", f"the all-gather, round {k}", outs[0].cpu(), made(10 * k + 7))
        nccl_work, returned = None, threading.Event()
        with gpu.on(gpu.s1):
            gpu.sleep(gpu.sleep_ms)  # the all-gather's ready event comes after it
            outs = [torch.full((N,), POISON, device=device)]
            handle = mcr.all_gather(outs, made(10 * k + 8).to(device), async_op=True, backend="mpi")
        with gpu.on(gpu.s2):
            y = made(10 * k + 9).to(device)
            mcr.all_reduce(y, backend="nccl")
            checks.expect_true("turns", f"NCCL launched after MPI's call returned, round {k}", returned.is_set())
        with gpu.on(gpu.s1):
            handle.wait()
        gpu.sync()
        checks.expect("turns", f"the async all-gather, round {k}", outs[0].cpu(), made(10 * k + 8))

checks.report()
mcr.finalize()
print("rank 0: gpu finalize OK", flush=True)
