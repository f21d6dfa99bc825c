"""Async ops complete without being waited on: after issuing, the main thread only sleeps
(no MPI or gloo call of its own), and each op's completion callback and result must arrive.

    progress.py mcr BACKEND   the runtime's API on BACKEND (mpi or gloo): AVG all-reduce (its
                              divide runs at completion), all_gather (copy-out), list all_to_all
                              and isend/irecv, each with distinct data per rank and call
    progress.py torch         torch.distributed on backend "mcr": `work.get_future()` of async
                              all-reduces (single and coalesced) completes on its own
    progress.py mixed         on MPI: large async all-reduces, all-gathers and reduce-scatters
                              (run on the backend's worker thread) interleaved with small async
                              and blocking all-reduces on the same group, results compared whole
    progress.py hang          rank 0 issues an async all-reduce that rank 1 never joins; the
                              job must end naming it (the watchdog learns of it from the thread)
    progress.py train         both ranks issue async ops on gloo for TRAIN_S, each waited at
                              once: a healthy train as long as 2.7 watchdog timeouts must end
    progress.py train-blocking  the same with blocking ops
    progress.py hang-train    the same, and rank 0 issues an op rank 1 never joins: the thread,
                              which looks less often while its caller issues, must still tell
                              the watchdog in time
    progress.py alone         on MPI and on gloo: an async AVG all-reduce's completion callback,
                              waited for in Python only for ALONE_S; prints whether it ran, then
                              waits and checks the whole result (the thread on: it ran; off: not)
    progress.py torch-off     torch.distributed on backend "mcr" with `progress_thread: false` in
                              the mcr config: `work.get_future()` waits for the op (rank 1 joins
                              once rank 0 issued it) and returns a done future holding the whole
                              result
    progress.py single        an MPI without MPI_THREAD_MULTIPLE (run with
                              MPI4PY_RC_THREAD_LEVEL=single): no progress, driver or worker
                              thread runs; futures complete at `get_future()`; large async
                              collectives and an async MPI op pending across a blocking gloo op
                              complete, results compared whole
"""

import sys
import threading
import time
from datetime import timedelta

import torch

import mcr

TIMEOUT_S = 30
ALONE_S = 5.0  # long enough for the progress thread (polls every 50 µs-1 ms), short for a test
TRAIN_S = 8.0  # train/hang-train: run under a 3 s watchdog, which ends hang-train long before
mode = sys.argv[1]


def completes_alone(what, handle):
    """Block in Python only (Event.wait drops the GIL and calls no library) until done."""
    done = threading.Event()
    handle.then(done.set)
    if not done.wait(TIMEOUT_S):
        raise SystemExit(f"rank {rank}: {what} did not complete within {TIMEOUT_S} s without a wait")


def same(what, got, want):
    if not torch.equal(got, want):
        raise SystemExit(f"rank {rank}: {what} wrong:\n got {got}\nwant {want}")


def mcr_ops(backend):
    for k in range(5):
        base = 1000.0 * k
        x = torch.arange(12, dtype=torch.float32) + base + 100 * rank
        avg = sum(torch.arange(12, dtype=torch.float32) + base + 100 * r for r in range(n)) / n
        completes_alone("all_reduce AVG", mcr.all_reduce(x, mcr.ReduceOp.AVG, async_op=True, backend=backend))
        same("all_reduce AVG", x, avg)

        mine = torch.full((3,), base + rank)
        outs = [torch.empty(3) for _ in range(n)]
        completes_alone("all_gather", mcr.all_gather(outs, mine, async_op=True, backend=backend))
        for r in range(n):
            same(f"all_gather part {r}", outs[r], torch.full((3,), base + r))

        ins = [torch.full((2,), base + 10 * rank + dst) for dst in range(n)]
        outs = [torch.empty(2) for _ in range(n)]
        completes_alone("all_to_all", mcr.all_to_all(outs, ins, async_op=True, backend=backend))
        for src in range(n):
            same(f"all_to_all from {src}", outs[src], torch.full((2,), base + 10 * src + rank))

        sent = torch.arange(5, dtype=torch.float32) + base + rank
        got = torch.empty(5)
        send = mcr.isend(sent, (rank + 1) % n, backend=backend)
        recv = mcr.irecv(got, (rank - 1) % n, backend=backend)
        if backend == "gloo":  # gloo marks its send/recv done only in wait(): the README says so
            send.wait()
            recv.wait()
        else:
            completes_alone("isend", send)
            completes_alone("irecv", recv)
        same("irecv", got, torch.arange(5, dtype=torch.float32) + base + (rank - 1) % n)
    return 4 * 5


def mixed_sizes():
    """Large async ops go to the MPI worker (its own communicator), small ones to MPI's
    nonblocking calls, blocking ones run at once: every result must match its own reference."""
    big = 3 << 17  # 1.5 MiB of float32 (above the worker's threshold), divisible by 2, 3 and 4 ranks
    checks = 0
    for k in range(6):
        large = torch.arange(big, dtype=torch.float32) * (k + 1) + rank
        small = torch.full((4,), 10.0 * k + rank)
        now = torch.full((3,), 100.0 * k + rank)
        gathered = torch.empty(n * big // 4)
        part = torch.arange(big // 4, dtype=torch.float32) + 1000 * rank + k
        scattered = torch.empty(big // n)
        to_scatter = torch.arange(big, dtype=torch.float32) + 7 * rank + k
        handles = [mcr.all_reduce(large, async_op=True, backend="mpi")]
        if rank == 0:  # ranks reach the next call at different times relative to their workers
            time.sleep(0.02)
        handles += [
            mcr.all_reduce(small, async_op=True, backend="mpi"),
            mcr.all_gather_into_tensor(gathered, part, async_op=True, backend="mpi"),
        ]
        mcr.all_reduce(now, backend="mpi")  # blocking, issued after the async ones
        handles.append(mcr.reduce_scatter_tensor(scattered, to_scatter, async_op=True, backend="mpi"))
        if k % 2:
            for h in handles:
                h.wait()
        else:
            for i, h in enumerate(handles):
                completes_alone(f"mixed op {i}", h)
        ranks = range(n)
        same("large all_reduce", large, sum(torch.arange(big, dtype=torch.float32) * (k + 1) + r for r in ranks))
        same("small all_reduce", small, sum(torch.full((4,), 10.0 * k + r) for r in ranks))
        same("blocking all_reduce", now, sum(torch.full((3,), 100.0 * k + r) for r in ranks))
        want = torch.cat([torch.arange(big // 4, dtype=torch.float32) + 1000 * r + k for r in ranks])
        same("large all_gather", gathered, want)
        total = sum(torch.arange(big, dtype=torch.float32) + 7 * r + k for r in ranks)
        same("large reduce_scatter", scattered, total.view(n, -1)[rank])
        checks += 5
    return checks


def torch_futures():
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    count = 0
    for k in range(5):
        x = torch.arange(8, dtype=torch.float32) + 1000 * k + 100 * rank
        want = sum(torch.arange(8, dtype=torch.float32) + 1000 * k + 100 * r for r in range(n))
        if k == 0 and rank > 0:  # rank 0's first all-reduce cannot complete before the others join
            try:
                store.wait(["rank 0 holds a pending future"], timedelta(seconds=TIMEOUT_S))
            except dist.DistStoreError:
                raise SystemExit(f"rank {rank}: rank 0's get_future() did not return: it waited for the op") from None
        fut = dist.all_reduce(x, async_op=True).get_future()
        if k == 0 and rank == 0:  # a get_future() that waited for the op would never get here
            if fut.done():
                raise SystemExit("rank 0: get_future() returned a done future before rank 1 joined the all-reduce")
            store.set("rank 0 holds a pending future", "1")
        ts = [torch.full((k + 1,), float(rank + j)) for j in range(3)]
        fut_coalesced = dist.all_reduce_coalesced(ts, async_op=True)  # torch hands back the Work's future
        deadline = time.monotonic() + TIMEOUT_S
        while not (fut.done() and fut_coalesced.done()):  # polls the futures only; no wait of ours
            if time.monotonic() > deadline:
                raise SystemExit(f"rank {rank}: a dist.Work future did not complete without a wait")
            time.sleep(0.001)
        same("future value", fut.value()[0], want)
        for j, t in enumerate(fut_coalesced.value()):
            same(f"coalesced {j}", t, torch.full((k + 1,), float(sum(r + j for r in range(n)))))
        count += 2
    return count


def completion_alone():
    """Whether each async op's completion callback ran while this thread only waited in Python."""
    for k, backend in enumerate(("mpi", "gloo")):
        x = torch.arange(10, dtype=torch.float32) * (k + 1) + 100 * rank
        avg = sum(torch.arange(10, dtype=torch.float32) * (k + 1) + 100 * r for r in range(n)) / n
        done = threading.Event()
        handle = mcr.all_reduce(x, mcr.ReduceOp.AVG, async_op=True, backend=backend).then(done.set)
        alone = done.wait(ALONE_S)
        print(f"rank {rank}: {backend} completed alone: {alone}", flush=True)
        handle.wait()
        if not done.is_set():
            raise SystemExit(f"rank {rank}: the callback did not run at wait() on {backend}")
        same(f"all_reduce AVG on {backend}", x, avg)


def futures_wait_at_get_future():
    """Without the progress thread, `get_future()` waits for the op: rank 1 joins once rank 0 has
    issued it, and the future rank 0 gets back is done."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    count = 0
    for k in range(3):
        x = torch.arange(8, dtype=torch.float32) * (k + 2) + 100 * rank
        want = sum(torch.arange(8, dtype=torch.float32) * (k + 2) + 100 * r for r in range(n))
        if k == 0 and rank > 0:
            store.wait(["rank 0 issues"], timedelta(seconds=TIMEOUT_S))
        if k == 0 and rank == 0:
            store.set("rank 0 issues", "1")
        fut = dist.all_reduce(x, async_op=True).get_future()
        if not fut.done():
            raise SystemExit(f"rank {rank}: get_future() returned a pending future with the progress thread off")
        same("future value", fut.value()[0], want)
        same("the reduced tensor", x, want)
        ts = [torch.arange(k + 2, dtype=torch.float32) + 10 * rank + j for j in range(3)]
        fut_coalesced = dist.all_reduce_coalesced(ts, async_op=True)
        if not fut_coalesced.done():
            raise SystemExit(f"rank {rank}: a coalesced all-reduce's future is pending with the progress thread off")
        for j, t in enumerate(fut_coalesced.value()):
            same(f"coalesced {j}", t, sum(torch.arange(k + 2, dtype=torch.float32) + 10 * r + j for r in range(n)))
        count += 2
    return count


def train(seconds, hang_after_s=None, blocking=False):
    """Issue async all-reduces on gloo for `seconds`, each waited at once (blocking ones with
    `blocking`), checking each result; the newest op in flight changes at every look of the progress thread,
    and the caller is inside a wait at nearly every look of the watchdog. `hang_after_s`: then
    rank 0 also issues an all-reduce on MPI that rank 1 never joins, once the progress thread has
    settled into the train: the thread must still test at least once per MAX_PAUSE_S and tell
    the watchdog of it. Returns how many ops ran."""
    started = time.monotonic()
    hung = None
    k, stop = 0, False
    while not stop:
        if rank == 0 and hang_after_s is not None and hung is None and time.monotonic() > started + hang_after_s:
            hung = mcr.all_reduce(torch.ones(4), async_op=True, backend="mpi")
            print(f"rank 0: issued an all_reduce rank 1 never joins, after {k} ops of the train", flush=True)
        # the last element is this rank's vote to stop: every rank stops after the same op
        vote = float(time.monotonic() > started + seconds)
        x = torch.cat([torch.arange(4, dtype=torch.float32) + 10 * k + rank, torch.tensor([vote])])
        if blocking:
            mcr.all_reduce(x, backend="gloo")
        else:
            mcr.all_reduce(x, async_op=True, backend="gloo").wait()
        same(f"train op {k}", x[:4], sum(torch.arange(4, dtype=torch.float32) + 10 * k + r for r in range(n)))
        stop = x[4].item() > 0
        k += 1
    return k


def no_second_mpi_thread(where):
    running = sorted(t.name for t in threading.enumerate() if t.name.startswith("mcr-"))
    for name in ("mcr-progress", "mcr-mpi-driver", "mcr-mpi-worker"):
        if name in running:
            raise SystemExit(f"rank {rank}: thread {name} runs {where} though MPI takes calls from one thread only")


def single_threaded_mpi():
    """An MPI without MPI_THREAD_MULTIPLE: every MPI call stays on this thread."""
    from mpi4py import MPI

    if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
        raise SystemExit("single: run with MPI4PY_RC_THREAD_LEVEL=single (MPI gave MPI_THREAD_MULTIPLE)")
    rt = mcr.runtime()
    if rt.progress is not None:
        raise SystemExit(f"rank {rank}: the progress thread is on though MPI gives no MPI_THREAD_MULTIPLE")
    checks = futures_wait_at_get_future()
    no_second_mpi_thread("after get_future()")
    big = 3 << 17  # above the MPI worker's threshold: run as MPI's nonblocking calls here
    for k in range(2):
        large = torch.arange(big, dtype=torch.float32) * (k + 1) + rank
        part = torch.arange(big // 4, dtype=torch.float32) + 1000 * rank + k
        gathered = torch.empty(n * big // 4)
        handles = [
            mcr.all_reduce(large, async_op=True, backend="mpi"),
            mcr.all_gather_into_tensor(gathered, part, async_op=True, backend="mpi"),
        ]
        small = torch.arange(4, dtype=torch.float32) + 10 * rank + k
        if rank == 1:  # waits on MPI while rank 0 blocks in gloo: rank 0's own thread must move MPI
            for h in handles:
                h.wait()
        mcr.all_reduce(small, backend="gloo")
        for h in handles:
            h.wait()
        same("large all_reduce", large, sum(torch.arange(big, dtype=torch.float32) * (k + 1) + r for r in range(n)))
        want = torch.cat([torch.arange(big // 4, dtype=torch.float32) + 1000 * r + k for r in range(n)])
        same("large all_gather", gathered, want)
        same("gloo all_reduce", small, sum(torch.arange(4, dtype=torch.float32) + 10 * r + k for r in range(n)))
        checks += 3
    no_second_mpi_thread("after large async collectives")
    return checks


if mode in ("torch-off", "single"):
    import torch.distributed as dist

    from mcr.hooks.torch_backend import init_process_group

    init_process_group(config={"progress_thread": False} if mode == "torch-off" else None)
    rank, n = dist.get_rank(), dist.get_world_size()
    checks = futures_wait_at_get_future() if mode == "torch-off" else single_threaded_mpi()
    print(f"rank {rank}: progress OK {checks} checks via {mode}", flush=True)
    dist.destroy_process_group()
elif mode == "torch":
    import torch.distributed as dist

    from mcr.hooks.torch_backend import init_process_group

    init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    checks = torch_futures()
    print(f"rank {rank}: progress OK {checks} checks via torch", flush=True)
    dist.destroy_process_group()
elif mode == "hang":
    mcr.init()
    rank, n = mcr.get_rank(), mcr.get_world_size()
    if rank == 0:
        handle = mcr.all_reduce(torch.ones(4), async_op=True, backend="mpi")
        print("rank 0: issued an all_reduce rank 1 never joins", flush=True)
    time.sleep(120)  # rank 0's watchdog must end the job long before
    print(f"rank {rank}: still here after 120 s", flush=True)
elif mode in ("train", "train-blocking", "hang-train"):
    mcr.init()
    rank, n = mcr.get_rank(), mcr.get_world_size()
    k = train(TRAIN_S, hang_after_s=0.5 if mode == "hang-train" else None, blocking=mode == "train-blocking")
    print(f"rank {rank}: the train of {k} ops ended, still here", flush=True)
    mcr.finalize()
else:
    mcr.init()
    rank, n = mcr.get_rank(), mcr.get_world_size()
    if mode == "alone":
        completion_alone()
    else:
        checks = mixed_sizes() if mode == "mixed" else mcr_ops(mode)
        print(f"rank {rank}: progress OK {checks} checks via mcr on {mode}", flush=True)
    mcr.finalize()
