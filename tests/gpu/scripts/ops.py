"""Two ranks sharing one GPU: every op on CUDA tensors under stream races, through MPI staged
(`mpi/host`), CUDA-aware MPI (where the runtime decided MPI reads device memory), gloo, the
runtime's own choice and a node-aware candidate whose inter-node phase runs NCCL on 1-rank
groups; dropped async handles; NCCL refused on the world; then finalize().

    python -m launch.local -n 2 -m tests.gpu.scripts.ops                      # on a GPU
    python -m launch.local -n 2 -m tests.gpu.scripts.ops --device cpu --node node:mpi+gloo

On one node the node-aware candidate's inter-node phase runs on 1-rank peer groups, where NCCL's
op is a copy at most and the all-reduce has no such phase at all, so values alone cannot show
whether NCCL ran it. Where that phase is NCCL's, NCCL's own log (`nccl_log`) adds two checks to
each race of the other ops: the phase made NCCL calls on 1-rank communicators from the calling
thread, and on the caller's current stream (each phase is a blocking op, which torch runs there).

Prints, per rank: `rank R: gpu mpi cuda_aware=BOOL: WHY`, for each label `rank R: gpu LABEL OK N
checks` (or `FAILED F of N checks`, after a line per failure), `COMMLOG R <json>` (each [op, backend,
group size] the comm log holds), NCCL's warnings (`rank R: nccl: ...`) and `rank R: gpu finalize
OK` once finalize() returned.
"""

import json
import threading

import torch

import mcr

from . import nccl_log
from .catalogue import NODE_AWARE, cases, large_avg
from .races import (
    LARGE_SLEEP_MS,
    POISON,
    RACE,
    Checks,
    Gpu,
    arguments,
    dtype_name,
    fold,
    mpi_cuda_aware,
    pattern,
    run_races,
    seed,
)

DTYPES = (torch.float32, torch.bfloat16)

args = arguments(__doc__)
log = nccl_log.turn_on() if args.device == "cuda" else None  # before the runtime makes NCCL's communicators
rt = mcr.init(comm_log=True, watchdog_timeout_s=120)
rank, n = mcr.get_rank(), mcr.get_world_size()
ranks = list(range(n))
gpu = Gpu(args.device, args.sleep_ms)
checks = Checks(rank)
aware, why = mpi_cuda_aware(rt)
print(f"rank {rank}: gpu mpi cuda_aware={aware}: {why}", flush=True)
print(f"rank {rank}: gpu sleeps at {gpu.cycles_per_ms:.0f} cycles/ms on {gpu.device}", flush=True)


def every_op(label, backend, names=None, large=True, witness=None):
    """Every op (or `names`) in both dtypes, blocking and async, under every race; barriers;
    the large AVG all-reduce. `witness`: wraps the Case maker of every op but the all-reduces."""
    for dtype in DTYPES:
        for name, make in cases(rank, ranks, None, backend, dtype).items():
            if witness is not None and not name.startswith("all_reduce"):
                make = witness(make)
            if names is None or name in names:
                run_races(checks, label, gpu, make, dtype_name(dtype))
    if names is None:
        for async_op in (False, True):
            handle = mcr.barrier(async_op=async_op, backend=backend)
            checks.expect_true(label, f"barrier async={async_op}", (handle is not None) == async_op, repr(handle))
            if handle is not None:
                handle.wait()
    if large:
        run_races(checks, label, gpu, large_avg(rank, ranks, None, backend, LARGE_SLEEP_MS), "float32")


def nccl_witnessed(make):
    """`make` whose Case's op is read from NCCL's log as it runs: two checks more per race, on the
    NCCL calls of a node-aware op whose inter-node phase runs on NCCL over 1-rank peer groups."""

    def made(k):
        case = make(k)
        run = case.run

        def run_and_read(bufs, async_op):
            current, thread = torch.cuda.current_stream().cuda_stream, threading.get_native_id()
            log.read()  # what came before
            pending = run(bufs, async_op)  # node-aware: every phase has run when it returns
            calls = nccl_log.calls(log.read())
            said = f"NCCL calls {calls}; current stream {current:#x}, thread {thread}"
            on_nccl = bool(calls) and all(c.nranks == 1 and c.tid == thread for c in calls)
            case.extra.append(("inter-node phase on NCCL's 1-rank groups, from the calling thread", on_nccl, said))
            on_stream = bool(calls) and all(c.stream == current for c in calls)
            case.extra.append(("on the caller's current stream, as torch runs a blocking op", on_stream, said))
            return pending

        case.run = run_and_read
        return case

    return made


def dropped(label, backend, variant, k):
    """Async ops whose handles the caller drops, on the side stream: an AVG all-reduce (its
    divide must still run, ordered before what follows a later blocking op on the same backend)
    and an all-gather from a temporary the caller frees at once (the runtime must keep it: its
    block, reused by the next allocation and filled with -POISON, would be gathered instead)."""
    avg_in = [pattern(seed(k, r, 0), 1024, torch.float32) for r in ranks]
    gather_in = [pattern(seed(k, r, 1), 1024, torch.float32) for r in ranks]
    sum_in = [pattern(seed(k, r, 2), 1024, torch.float32) for r in ranks]
    gpu.sync()
    with gpu.on(gpu.s1):
        sources = [t[rank].to(gpu.device) for t in (avg_in, gather_in, sum_in)]
        x, tmp, z = (torch.full((1024,), POISON, device=gpu.device) for _ in range(3))
        out = torch.full((1024 * n,), POISON, device=gpu.device)
    gpu.sync()
    if variant == "busy-default-stream":
        gpu.sleep(gpu.sleep_ms, gpu.default)
    with gpu.on(gpu.s1):
        if variant == "late-producer":
            gpu.sleep(gpu.sleep_ms)
        for buf, src in zip((x, tmp, z), sources):
            buf.copy_(src)
        mcr.all_reduce(x, op=mcr.ReduceOp.AVG, async_op=True, backend=backend)  # the handle dropped
        mcr.all_gather_into_tensor(out, tmp, async_op=True, backend=backend)  # ... and its input
        del tmp
        junk = torch.full((1024,), -POISON, device=gpu.device)  # takes tmp's block if nothing holds it
        mcr.all_reduce(z, backend=backend)  # blocking, same backend and group
        got = [x.clone(), out.clone(), z.clone()]
    gpu.sync()
    del junk
    wants = [fold("avg", avg_in, torch.float32), torch.cat(gather_in), fold("sum", sum_in, torch.float32)]
    for what, g, w in zip(("avg all_reduce", "all_gather of a freed input", "the blocking all_reduce"), got, wants):
        checks.expect(label, f"dropped {what} {variant}", g, w)


# 1. every op through staged MPI, CUDA-aware MPI where it is, gloo, and the runtime's choice
every_op("mpi/host", "mpi/host")
if aware:
    every_op("mpi", "mpi")
every_op("gloo", "gloo")
every_op("auto", None)

# 2. node-aware: one node of 2 ranks, so the inter-node phase runs on 1-rank peer groups (NCCL
# can have those: each holds one GPU) and the intra-node phases on MPI, on the same buffers
witness = nccl_witnessed if log is not None and args.node.endswith("+nccl") else None
every_op(args.node, args.node, names=NODE_AWARE, large=False, witness=witness)

# 3. dropped handles, on each backend the runtime runs here
for backend in ["mpi/host", "gloo"] + (["mpi"] if aware else []):
    for variant in ("late-producer", "busy-default-stream"):
        for _ in range(3):
            dropped(f"{backend} dropped", backend, variant, next(RACE))

# 4. NCCL on the world: its two ranks share the GPU, so the runtime has no NCCL communicator there
if gpu.cuda:
    try:
        mcr.all_reduce(torch.ones(4, device=gpu.device), backend="nccl")
    except ValueError as exc:
        print(f"rank {rank}: gpu nccl on the shared GPU refused: {exc}", flush=True)
        checks.expect_true("nccl refused", "backend='nccl' on the world", "nccl" in str(exc), str(exc))
    else:
        checks.expect_true("nccl refused", "backend='nccl' on the world", False, "it ran on two ranks sharing a GPU")

checks.report()
rows = sorted({(r["op"], r["backend"], r["group_size"]) for r in rt.comm_log.rows()})
print(f"COMMLOG {rank} {json.dumps(rows)}", flush=True)
mcr.finalize()
if log is not None:
    log.read()
    print("".join(f"rank {rank}: nccl: {line}\n" for line in log.warnings), end="", flush=True)
print(f"rank {rank}: gpu finalize OK", flush=True)
