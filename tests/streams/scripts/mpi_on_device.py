"""MPI on device memory, beside NCCL: 2 ranks under mpiexec on the CPU tier's stand-in
(`tests.streams.cuda_model`) with MCR_MPI_CUDA_AWARE=true, so the real Open MPI is handed the
stand-in's CudaLike tensors (CPU memory) and reads them. Each scenario reports what the stand-in
recorded while it ran, as `DEVICE <rank> <scenario> {...}`; tests/streams/test_mpi_on_device.py
states the rule. Usage: mpi_on_device.py (under mpiexec, 2 ranks, MCR_BACKENDS=mpi,gloo,nccl).

What MPI does is observed, not changed: each call of the MPI backend's op methods is logged as
`mpi_call` (with the NCCL kernels launched and not yet run at that moment) and `mpi_return`, and
each buffer handed to MPI as `mpi_reads` (with the kernels queued on that memory and not yet run:
MPI reads device memory on the host, at once, so any such kernel is a race)."""

import threading

from tests.streams import cuda_model as cm

cm.install()  # before mcr: its CUDA calls are the stand-in's from here on

import torch  # noqa: E402

import mcr  # noqa: E402
from tests.report import report  # noqa: E402
from tests.streams import mcr_calls, wait_for  # noqa: E402

_depth = threading.local()


def observed(name, fn):
    def call(*args):
        outer = not getattr(_depth, "n", 0)
        if outer:
            cm.log("mpi_call", name, cm.pending_launches())
        _depth.n = getattr(_depth, "n", 0) + 1
        try:
            return fn(*args)
        finally:
            _depth.n -= 1
            if outer:
                cm.log("mpi_return", name)

    return call


OPS = "all_reduce reduce broadcast all_gather all_gather_into_tensor gather scatter reduce_scatter"
OPS += " reduce_scatter_tensor all_to_all all_to_all_single gather_packed scatter_packed"


def observe(mpi) -> None:
    """Log each call of the MPI backend's ops and each buffer it hands MPI (observed, not changed)."""
    assert mpi.cuda_aware, mpi.cuda_aware_reason
    for name in OPS.split():
        if hasattr(mpi, name):
            setattr(mpi, name, observed(name, getattr(mpi, name)))
    memory = mpi._mem

    def observed_memory(address, nbytes):
        found = cm.unfinished_at(address)
        if found is not None:
            cm.log("mpi_reads", *found)
        return memory(address, nbytes)

    mpi._mem = observed_memory


rt = mcr.init()
rank, size = rt.rank, rt.world_size
observe(rt.backends["mpi"])


def data(name, seed, n=6):
    """Distinct per rank, per element and per `seed`, made on the current stream."""
    return cm.cuda_like(torch.arange(n, dtype=torch.float32) + 100 * seed + 1, name=name)


def values(seed, n=6):
    return (torch.arange(n, dtype=torch.float32) + 100 * seed + 1).tolist()


def zeros(name, n=6):
    return cm.cuda_like(torch.zeros(n), name=name)


def plain(t):
    return t.as_subclass(torch.Tensor).tolist()


def logged(since, *kinds):
    return [list(e) for e in cm.entries(since=since) if e[0] in kinds]


def scenario(name):
    def run(fn):
        since = cm.mark()
        try:
            value = fn(since)
        except Exception as exc:  # a scenario the runtime cannot run yet reports why, and the rest go on
            value = {"error": f"{type(exc).__name__}: {exc}"}
        cm.gpu_runs()
        report("DEVICE", rank, name, value=value)

    return run


side = torch.cuda.Stream()  # the trainer's stream: every op below is issued from it


@scenario("temporaries")
def _(since):
    """Scatter (a stack of the root's list) and the list reduce-scatter (a cat of the list),
    blocking and async: the temporaries MPI reads, and whether any kernel on them was still
    queued when MPI read them."""
    got = {}
    for async_op in (False, True):
        with torch.cuda.stream(side):
            k = 10 * async_op
            parts = [data(f"scatter_in{async_op}{r}", k + r) for r in range(size)] if rank == 0 else None
            out = zeros(f"scatter_out{async_op}")
            handle = mcr.scatter(out, parts, src=0, backend="mpi", async_op=async_op)
            if handle is not None:
                handle.wait()
            inputs = [data(f"rs_in{async_op}{r}", k + 3 + rank + size * r) for r in range(size)]
            reduced = zeros(f"rs_out{async_op}")
            handle = mcr.reduce_scatter(reduced, inputs, backend="mpi", async_op=async_op)
            if handle is not None:
                handle.wait()
        got[str(async_op)] = {
            "scatter": [plain(out), values(k + rank)],
            "reduce_scatter": [
                plain(reduced),
                [sum(x) for x in zip(*(values(k + 3 + r + size * rank) for r in range(size)))],
            ],
        }
    allocs = logged(since, "alloc")
    return {
        "results": got,
        "reads": logged(since, "mpi_reads"),
        "temporaries": [e for e in allocs if e[2].startswith(("stack", "cat", "empty"))],
        "side": side.name,
    }


def touches(since, names):
    """(thread, stream) of every kernel that touched a storage of these labels since `since`."""
    return sorted({(e[1], e[3]) for e in cm.entries(since=since) if e[0] == "touch" and set(e[4]) & set(names)})


def freed(since, names):
    """{label: the streams that touched it off its allocation stream unrecorded} for the storages
    of these labels freed since `since`."""
    return {e[2]: e[4] for e in cm.entries(since=since) if e[0] == "free" and e[2] in names}


@scenario("copy_out")
def _(since):
    """The list all-gather and gather (their copy-outs from a packed temporary into the caller's
    list), blocking and async, issued from the side stream: where the outputs were touched."""
    got, where = {}, {}
    for async_op in (False, True):
        k = 20 + 10 * async_op
        with torch.cuda.stream(side):
            gathered = [zeros(f"ag_out{async_op}{r}") for r in range(size)]
            mine = data(f"ag_in{async_op}", k + rank)
            issued = cm.mark()
            handle = mcr.all_gather(gathered, mine, backend="mpi", async_op=async_op)
            if handle is not None:
                handle.wait()
            listed = [zeros(f"g_out{async_op}{r}") for r in range(size)] if rank == 0 else None
            handle = mcr.gather(data(f"g_in{async_op}", k + 5 + rank), listed, dst=0, backend="mpi", async_op=async_op)
            if handle is not None:
                handle.wait()
        outputs = [cm.label(t) for t in gathered + (listed or [])]
        where[str(async_op)] = touches(issued, outputs)
        got[str(async_op)] = {
            "all_gather": [[plain(t) for t in gathered], [values(k + r) for r in range(size)]],
            "gather": [[plain(t) for t in listed or []], [values(k + 5 + r) for r in range(size)] if rank == 0 else []],
        }
    return {"results": got, "touched": where, "side": side.name}


@scenario("recorded")
def _(since):
    """Async ops issued from the side stream on tensors made on the default stream: a staged AVG
    all-reduce (copied in and back, divided, on the issuing stream) and a CUDA-aware list
    all-gather (copied out there); once done, the tensors are freed."""
    t = data("staged", 40 + rank)
    gathered = [zeros(f"rec_out{r}") for r in range(size)]
    mine = data("rec_in", 45 + rank)
    with torch.cuda.stream(side):
        first = mcr.all_reduce(t, op=mcr.ReduceOp.AVG, backend="mpi/host", async_op=True)
        second = mcr.all_gather(gathered, mine, backend="mpi", async_op=True)
        first.wait()
        second.wait()
    results = {
        "staged": [plain(t), [sum(x) / size for x in zip(*(values(40 + r) for r in range(size)))]],
        "all_gather": [[plain(o) for o in gathered], [values(45 + r) for r in range(size)]],
    }
    cm.gpu_runs()
    names = ["staged", "rec_in", *(f"rec_out{r}" for r in range(size))]
    mark = cm.mark()
    del t, gathered, mine, first, second
    rt.in_flight.forget_completed()
    return {
        "results": results,
        "freed": freed(mark, names),
        "names": names,
        "default": torch.cuda.default_stream().name,
    }


@scenario("cross_stream")
def _(since):
    """An async list all-gather issued from the side stream, its input made there and freed right
    after issue, a new tensor made there at once (the freed block's next owner), the output
    consumed there after wait()."""
    with torch.cuda.stream(side):
        gathered = [zeros(f"cs_out{r}") for r in range(size)]
        source = data("cs_in", 60 + rank)
        issued = cm.mark()
        handle = mcr.all_gather(gathered, source, backend="mpi", async_op=True)
        del source
        again = cm.cuda_like(torch.full((6,), -7.0), name="cs_again")
        handle.wait()
        consumed = torch.stack(gathered)
    results = [plain(consumed), [values(60 + r) for r in range(size)]]
    kept = plain(again)
    cm.gpu_runs()
    del handle
    rt.in_flight.forget_completed()
    log = cm.entries(since=issued)
    gathered_at = [
        i for i, e in enumerate(log) if e[0] == "mpi_return" and e[2] in ("all_gather", "all_gather_into_tensor")
    ]
    input_freed_at = [i for i, e in enumerate(log) if e[0] == "free" and e[2] == "cs_in"]
    return {
        "results": results,
        "again": kept,
        "touched": touches(issued, [f"cs_out{r}" for r in range(size)]),
        "input_freed": [e[4] for e in log if e[0] == "free" and e[2] == "cs_in"],
        "freed_after_the_call": bool(gathered_at and input_freed_at and input_freed_at[0] > gathered_at[0]),
        "reads": [e for e in log if e[0] == "mpi_reads" and e[2] == "cs_in"],
        "side": side.name,
    }


def nccl_then_mpi(since, name):
    """NCCL ops the GPU has not run yet (in the stand-in NCCL's kernels run only when the host
    synchronizes on them: their peers are elsewhere), then CUDA-aware MPI ops, blocking and async:
    the NCCL kernels still queued when each MPI call started."""
    other = torch.cuda.Stream()  # NCCL's blocking op on a stream the MPI ops' ready events do not follow
    with torch.cuda.stream(other):
        mcr.all_reduce(data(f"{name}_nccl0", 70 + rank), backend="nccl")
    with torch.cuda.stream(side):
        mcr.all_reduce(data(f"{name}_nccl1", 71 + rank), async_op=True, backend="nccl")
        first = [zeros(f"{name}_out0{r}") for r in range(size)]
        mcr.all_gather(first, data(f"{name}_in0", 72 + rank), backend="mpi")
        mcr.all_reduce(data(f"{name}_nccl2", 73 + rank), async_op=True, backend="nccl")
        second = [zeros(f"{name}_out1{r}") for r in range(size)]
        mcr.all_gather(second, data(f"{name}_in1", 74 + rank), backend="mpi", async_op=True).wait()
    return {
        "calls": logged(since, "mpi_call"),
        "results": [[plain(t) for t in first + second], [values(k + r) for k in (72, 74) for r in range(size)]],
    }


@scenario("nccl_then_mpi")
def _(since):
    return nccl_then_mpi(since, "nm")


def meets_mpi(since, main):
    """Rank 0's NCCL call has met the MPI op in flight: it launched, or its thread waits in it."""

    def met():
        waiting = rt.waits.get(main)
        in_mpi = waiting is not None and (waiting[0].family, waiting[0].label) == ("all_gather", "mpi")
        return in_mpi or any(e[0] == "launch" for e in cm.entries(since=since))

    return met


def mpi_then_nccl(since, name):
    """An async CUDA-aware all-gather on the MPI worker, then a blocking NCCL all-reduce. Rank 1
    issues its all-gather only once rank 0's NCCL call has launched or waits for the all-gather,
    so rank 0's all-gather is in flight (it cannot return before rank 1 joins) when its NCCL call
    comes."""
    gathered = [zeros(f"{name}_out{r}") for r in range(size)]
    mine, other = data(f"{name}_in", 80 + rank), data(f"{name}_nccl", 85 + rank)
    go = f"{name}-go"
    if rank == 1:
        rt.store.wait([go])
    with torch.cuda.stream(side):
        handle = mcr.all_gather(gathered, mine, backend="mpi", async_op=True)
        if rank == 0:
            met = meets_mpi(cm.mark(), threading.get_ident())
            threading.Thread(target=lambda: wait_for(met, 60) and rt.store.set(go, "1"), daemon=True).start()
        mcr.all_reduce(other, backend="nccl")
        handle.wait()
    log = cm.entries(since=since)
    called = [i for i, e in enumerate(log) if e[:2] == ("mpi_call", "mcr-mpi-worker")]
    returned = [i for i, e in enumerate(log) if e[:2] == ("mpi_return", "mcr-mpi-worker")]
    launched = [i for i, e in enumerate(log) if e[0] == "launch"]
    return {
        "before_mpi_returned": [log[i] for i in launched if not returned or i < returned[0]],
        "launched": len(launched),
        "calls": [log[i] for i in called],
        "results": [[plain(t) for t in gathered], [values(80 + r) for r in range(size)]],
        "nccl": [plain(other), [sum(x) for x in zip(*(values(85 + r) for r in range(size)))]],
    }


@scenario("mpi_then_nccl")
def _(since):
    return mpi_then_nccl(since, "mn")


@scenario("staged_waits")
def _(since):
    """Staged all-reduces, blocking then async (the route made by a first call): the events each
    makes, and the waits it hands to MPI's driver thread (observed, not changed)."""
    handed = []
    during = rt.driver.during
    rt.driver.during = lambda *args: (handed.append(threading.current_thread().name), during(*args))[1]
    try:
        t = data("sw", 90 + rank)
        mcr.all_reduce(t, backend="mpi/host")
        made = cm.mark()
        mcr.all_reduce(t, backend="mpi/host")
        mcr.all_reduce(t, backend="mpi/host", async_op=True).wait()
    finally:
        rt.driver.during = during
    return {
        "new_events": len(logged(made, "new_event")),
        "handed": handed,
        "waited_on": sorted({e[1] for e in cm.entries(since=made) if e[0] in ("query", "sync")}),
        "result": [plain(t), [4 * sum(x) for x in zip(*(values(90 + r) for r in range(size)))]],
    }


@scenario("call_count")
def _(since):
    """A blocking NCCL all-reduce's Python calls in mcr in this job (CUDA-aware MPI beside NCCL,
    none in flight), counted as tests/streams/scripts/nccl_contract.py counts them."""
    t = data("cc", rank)
    mcr.all_reduce(t)  # the route is made: count a call of a made route
    calls = mcr_calls(lambda: mcr.all_reduce(t))
    return {"calls": calls, "turns": getattr(rt, "turns", None) is not None}


cm.gpu_runs(keep_up=True)
mcr.finalize()
cm.gpu_runs()


@scenario("untracked")
def _(since):
    """The runtime started again with no flight recorder: NCCL's blocking ops leave no event."""
    global rt
    rt = mcr.init(flight_recorder=0)
    observe(rt.backends["mpi"])
    return nccl_then_mpi(since, "un")


cm.gpu_runs(keep_up=True)
mcr.finalize()
cm.gpu_runs()


@scenario("concurrent")
def _(since):
    """The runtime started again with mpi_nccl_concurrent: the two run side by side."""
    global rt
    rt = mcr.init(mpi_nccl_concurrent=True)
    observe(rt.backends["mpi"])
    return mpi_then_nccl(since, "cc")


cm.gpu_runs(keep_up=True)
mcr.finalize()
