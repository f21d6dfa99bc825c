"""One rank with the GPU to itself: every op on NCCL (and on the runtime's choice, which must be
NCCL for CUDA tensors) under stream races, then finalize().

    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_solo                  # on a GPU
    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_solo --device cpu     # gloo stands in

On one rank an in-place op (all-reduce, reduce, broadcast) leaves its tensor as it was, so a race
cannot show there; the out-of-place ops (gathers, scatters, reduce-scatters, all-to-alls) copy into
POISONed outputs, and the races show on those. There is no peer to send to.

So the in-place ops are also checked against NCCL's own log of each call (`nccl_log`, labels
`calls nccl` and `calls auto`): each must make the one NCCL call torch's own ProcessGroupNCCL
makes for the same op on the same input (function, count, datatype, reduce op, root: AVG as
NCCL's average), in place on the caller's tensor, from the calling thread, and on the stream torch
uses: the caller's current one for a blocking op (torch's asyncOp=False), its own for an async one.

Then (finding 12) a blocking NCCL all-reduce queued behind 300 ms of GPU work: it must stay in
flight, its flight-recorder entry not done, until the GPU has run it (label `in-flight`).

Prints `rank 0: gpu LABEL OK N checks`, `COMMLOG 0 <json>`, NCCL's warnings (`rank 0: nccl: ...`)
and `rank 0: gpu finalize OK`.
"""

import json
import threading

import torch
import torch.distributed as dist

import mcr

from . import nccl_log
from .catalogue import N, cases, large_avg
from .races import LARGE_SLEEP_MS, RACE, Checks, Gpu, arguments, dtype_name, pattern, run_races, seed

args = arguments(__doc__)
log = nccl_log.turn_on() if args.device == "cuda" else None  # before the runtime makes NCCL's communicator
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

R = mcr.ReduceOp


def in_place_ops(backend) -> dict:
    """{name: (mcr's call, torch's)} of the in-place ops; torch's on its own ProcessGroupNCCL `pg`,
    with the options dist.<op> gives it (asyncOp as asked), returning its Work or None."""

    def on_torch(method, options, **fields):
        def call(pg, t, async_op):
            opts = options()
            for name, value in fields.items():
                setattr(opts, name, value)
            opts.asyncOp = async_op
            return getattr(pg, method)([t], opts)

        return call

    def all_reduce(op):
        mine = lambda t, a: mcr.all_reduce(t, op=op, async_op=a, backend=backend)  # noqa: E731
        return mine, on_torch("allreduce", dist.AllreduceOptions, reduceOp=op)

    return {
        "all_reduce sum": all_reduce(R.SUM),
        "all_reduce avg": all_reduce(R.AVG),
        "all_reduce max": all_reduce(R.MAX),
        "reduce avg": (
            lambda t, a: mcr.reduce(t, 0, op=R.AVG, async_op=a, backend=backend),
            on_torch("reduce", dist.ReduceOptions, reduceOp=R.AVG, rootRank=0, rootTensor=0),
        ),
        "broadcast": (
            lambda t, a: mcr.broadcast(t, 0, async_op=a, backend=backend),
            on_torch("broadcast", dist.BroadcastOptions, rootRank=0, rootTensor=0),
        ),
    }


def finish(pending) -> None:
    if pending is not None:  # a handle or Work (blocking: torch may return one; dist waits on it)
        pending.wait()


def nccl_calls(label, backend, reference) -> None:
    """Each in-place op, both dtypes, blocking and async, issued on the side stream through mcr and
    then on torch's `reference` group on a copy of the same input; `judge` checks what NCCL
    logged for the two."""
    for dtype in (torch.float32, torch.bfloat16):
        for name, (on_mcr, on_torch) in in_place_ops(backend).items():
            for async_op in (False, True):
                x = pattern(seed(next(RACE), 0), N, dtype).to(gpu.device)
                y = x.clone()
                gpu.sync()
                with gpu.on(gpu.s1):
                    log.read()  # what came before
                    finish(on_mcr(x, async_op))
                    got = nccl_log.calls(log.read())
                    finish(on_torch(reference, y, async_op))
                    want = nccl_log.calls(log.read())
                gpu.sync()
                what = f"{name} {dtype_name(dtype)} {'async' if async_op else 'blocking'}"
                judge(label, what, x.data_ptr(), gpu.s1.cuda_stream, async_op, got, want)


def judge(label, what, tensor, current, async_op, got, want) -> None:
    """Six checks of mcr's NCCL calls `got` against torch's `want` for one op on the tensor at
    address `tensor`, issued on the stream `current` from this thread."""
    thread = threading.get_native_id()

    def on_torchs_stream(call):  # blocking: the caller's current stream (asyncOp false); async: its own
        return call is not None and (call.stream != current if async_op else call.stream == current)

    mine, torchs = (got[0] if len(got) == 1 else None), (want[0] if len(want) == 1 else None)
    said = f"mcr: {got}; torch: {want}; current stream {current:#x}, thread {thread}"
    checks.expect_true(label, f"{what}: torch's own call keeps the rule", on_torchs_stream(torchs), said)
    checks.expect_true(label, f"{what}: one NCCL call, as torch's", mine is not None, said)
    same = mine is not None and torchs is not None and mine.what() == torchs.what()
    checks.expect_true(label, f"{what}: the call torch makes", same, said)
    in_place = mine is not None and mine.sendbuff == mine.recvbuff == tensor
    checks.expect_true(label, f"{what}: in place on the caller's tensor ({tensor:#x})", in_place, said)
    checks.expect_true(label, f"{what}: from the calling thread", mine is not None and mine.tid == thread, said)
    checks.expect_true(label, f"{what}: on the stream torch uses", on_torchs_stream(mine), said)


if gpu.cuda:  # NCCL's log of the in-place ops, beside torch's own ProcessGroupNCCL's
    reference = dist.ProcessGroupNCCL(dist.HashStore(), 0, 1)
    for label, backend in (("calls nccl", "nccl"), ("calls auto", None)):
        nccl_calls(label, backend, reference)
    reference.shutdown()

if gpu.cuda:  # finding 12: an NCCL op the GPU has not run yet stays in flight, watched and recorded
    from mcr.flight import DONE

    torch.cuda._sleep(int(gpu.cycles_per_ms * 300))  # 300 ms of GPU work queued before the op
    t = torch.ones(4, device=gpu.device)
    mcr.all_reduce(t, backend="nccl")  # returns at once: NCCL queued it behind the sleep
    entry = rt.recorder.entries()[-1]
    pending = rt.stream_ops.settle()  # what the watchdog reads each tick: the oldest op the GPU has not run
    checks.expect_true(
        "in-flight",
        "a blocking NCCL op is watched until the GPU ran it",
        pending is not None and pending[0].label == "nccl",
        repr(pending),
    )
    checks.expect_true("in-flight", "its flight-recorder entry is not done yet", entry[DONE] == 0, repr(entry))
    torch.cuda.synchronize()
    done = rt.stream_ops.settle() is None
    checks.expect_true("in-flight", "once the GPU ran it, it completes", done, repr(pending))
    checks.expect_true("in-flight", "and its entry is stamped done", entry[DONE] > 0, repr(entry))

checks.report()
rows = sorted({(r["op"], r["backend"], r["group_size"]) for r in rt.comm_log.rows()})
print(f"COMMLOG {rank} {json.dumps(rows)}", flush=True)
mcr.finalize()
if log is not None:
    log.read()
    for line in log.warnings:
        print(f"rank {rank}: nccl: {line}", flush=True)
print(f"rank {rank}: gpu finalize OK", flush=True)
