"""Timing one op on one backend at one size, agreed across ranks (the slowest rank counts).

Shared by the online tuner (`tuning: auto`), `mcr.tools.bench` (report) and `mcr.tools.tune`
(decide), so all measure the same thing. Every function takes the runtime `rt` to measure
through: this module is part of the runtime (its online tuner calls it) and imports none of
the front door (`mcr.api`), which would import the runtime back; a tool passes `mcr.runtime()`.
Message sizes follow nccl-tests: all-gather counts the gathered output, reduce-scatter and
all-to-all the input, send/recv the message (latency is half a ping-pong, as OSU reports).
`device` (default cpu) is where the op's tensors are made; a CUDA call is timed until the GPU
has finished it (`_until_done`). The barrier before the timed calls and the agreement on the
slowest rank are small CPU ops whatever the device.
"""

from __future__ import annotations

import statistics
import time

import torch

from .request import Request

MEASURABLE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")
REDUCING_OPS = ("all_reduce", "reduce", "reduce_scatter")  # measured with reduce op sum
DEVICE_HELP = "where the tensors are: cpu, or cuda (each rank's GPU, the one the runtime bound at init)"


def device_problem(name: str) -> str | None:
    """Why tensors cannot be made on device `name` here, naming the fix; None where they can.
    A tool checks it before starting the runtime, so every rank stops alike."""
    if name != "cuda" or torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) was built without CUDA"
    else:
        why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU (torch.cuda.is_available() is False)"
    return (
        f"--device cuda: {why}; run it on a machine with a GPU and a CUDA build of torch, or leave "
        "--device out to measure CPU tensors"
    )


def bound_device(name: str) -> torch.device:
    """This rank's device for `name`: on cuda the GPU the runtime bound at init (local rank modulo
    the GPUs); a tool never picks one itself."""
    return torch.device("cuda", torch.cuda.current_device()) if name == "cuda" else torch.device("cpu")


def runs_as_named(rt, candidate: str, op: str, dtype, group=None, device_type: str = "cpu") -> bool:
    """Whether the runtime runs `op` on `candidate` (as backend= names it: a backend, BACKEND/host
    or node:INTRA+INTER) as named: no fallback to another backend and no flat run
    (`mcr.choose`). A measurement under a candidate's label must time that candidate."""
    g = rt.world if group is None else group
    reduce_op = "sum" if op in REDUCING_OPS else None
    try:
        picked = rt.router.select(op, 0, g, dtype, device_type, candidate, reduce_op)  # as the runtime chooses
    except ValueError:  # a backend it names is not running here
        return False
    return not picked.notes


def iterations_for(nbytes: int, max_iters: int = 1000, min_iters: int = 5) -> int:
    """Small messages repeat often for a stable median; large ones are slow enough already."""
    return max(min_iters, min(max_iters, int(64e6 / max(nbytes, 64e3))))


def _elements(op, nbytes, element_size, n):
    count = max(1, nbytes // element_size)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(n, count - count % n)  # divisible by the group size
    return count


def make_call(rt, op, nbytes, backend=None, dtype=torch.float32, group=None, chunk_bytes=0, device="cpu"):
    """Returns (call, actual_nbytes). `call()` runs the op once, blocking, on this rank, through
    the runtime `rt` on `backend` (None: the runtime's choice), on tensors made on `device`.
    `chunk_bytes` > 0 runs an all-reduce as a train of chunks, as the runtime does for a
    tuning-table entry with that chunk size."""
    g = rt.world if group is None else group
    n = g.size
    count = _elements(op, nbytes, torch.tensor([], dtype=dtype).element_size(), n)
    x = torch.ones(count, dtype=dtype, device=device)

    def run(family, method, size, tensor, *args, reduce_op=None):
        return rt.call(Request(family, method, size, g, tensor, args, backend, reduce_op=reduce_op))

    if op == "all_reduce" and chunk_bytes and x.nbytes > chunk_bytes:
        parts = x.split(max(1, chunk_bytes // x.element_size()))

        def chunked():
            for part in parts:
                run("all_reduce", "all_reduce", part.nbytes, part, part, "sum", reduce_op="sum")

        return chunked, x.nbytes
    # roots and peers are group ranks: groups such as DeepSpeed's expert groups may not hold rank 0
    if op == "all_reduce":
        return (lambda: run("all_reduce", "all_reduce", x.nbytes, x, x, "sum", reduce_op="sum")), x.nbytes
    if op == "reduce":
        return (lambda: run("reduce", "reduce", x.nbytes, x, x, 0, "sum", reduce_op="sum")), x.nbytes
    if op == "broadcast":
        return (lambda: run("broadcast", "broadcast", x.nbytes, x, x, 0)), x.nbytes
    if op == "all_gather":
        part = torch.ones(count // n, dtype=dtype, device=device)
        return (lambda: run("all_gather", "all_gather_into_tensor", x.nbytes, part, x, part)), x.nbytes
    if op == "reduce_scatter":
        part = torch.empty(count // n, dtype=dtype, device=device)
        call = "reduce_scatter", "reduce_scatter_tensor", x.nbytes, x, part, x, "sum"
        return (lambda: run(*call, reduce_op="sum")), x.nbytes
    if op == "all_to_all":
        out = torch.empty_like(x)
        return (lambda: run("all_to_all", "all_to_all_single", x.nbytes, x, out, x, None, None)), x.nbytes
    if op == "send_recv":

        def ping_pong():  # ranks beyond the first two idle; timed as one round trip
            if g.rank == 0:
                run("send_recv", "send", x.nbytes, x, x, 1, 0)
                run("send_recv", "recv", x.nbytes, x, x, 1, 0)
            elif g.rank == 1:
                run("send_recv", "recv", x.nbytes, x, x, 0, 0)
                run("send_recv", "send", x.nbytes, x, x, 0, 0)

        return ping_pong, x.nbytes
    raise ValueError(f"cannot measure op {op!r}; choose one of {', '.join(MEASURABLE_OPS)}")


def slowest(rt, value, group=None, backend=None):
    """The largest value over the group's ranks, so every rank reports and decides the same.
    `value` may be a list (one all-reduce for all). `backend`: where to agree (None: the
    runtime's choice)."""
    g = rt.world if group is None else group
    many = isinstance(value, (list, tuple))
    t = torch.tensor(list(value) if many else [value], dtype=torch.float64)
    rt.call(Request("all_reduce", "all_reduce", t.nbytes, g, t, (t, "max"), backend, reduce_op="max"))
    return t.tolist() if many else float(t.item())


PACE_HELP = (
    "stay idle after each timed call as long as the fastest call so far took: a shaped link's "
    "queue drains between calls, as between a trainer's ops (back to back it builds, and each "
    "call waits behind it); default: on where the job spans nodes, off inside one (--no-pace)"
)


def paced(asked, nodes) -> bool:
    """--pace or --no-pace as asked; unasked, on where the job spans nodes: there the table tuned
    back to back lost 11-23% to MPI in the trainers, the paced one 1.1% at most
    (configs/tuning/vm-2x1-2gbit-compare.txt), and inside a node pacing only doubles the time."""
    return asked if asked is not None else (nodes or 1) > 1


def _until_done(call, device):
    """`call()`, then `torch.cuda.synchronize(device)`: the host clock around it times the op to
    its end. Why a synchronize after each call, not CUDA events: a blocking call on CUDA tensors
    returns once its op is queued (NCCL) or once it is done (MPI, staged or CUDA-aware; gloo),
    and the synchronize waits for every stream of the device (NCCL's own, a staging copy's),
    whichever one the route used, where an event on the caller's stream sees only the work
    ordered before it. The samples stay per-call host seconds, which the median, pacing and
    the slowest rank read as on CPU (an event's time, too, is read only once it has completed).
    The synchronize's own few µs fall on every candidate alike."""
    synchronize = torch.cuda.synchronize

    def run():
        call()
        synchronize(device)

    return run


def time_call(rt, call, iters: int, warmup: int = 5, group=None, backend=None, pace=False, device="cpu") -> float:
    """Median seconds per call on this rank, then the slowest rank's median. `pace`: PACE_HELP;
    the idle is not part of the sample. The fastest call, not the last: a rank's last call holds
    its wait for a peer still idling, so idling that long kept the ranks out of step, every other
    call holding the skew (tests/mcr/test_measure.py). `device`: where `call` puts its tensors."""
    if torch.device(device).type == "cuda":
        call = _until_done(call, device)
        # the barrier and the agreement are CPU ops, which `backend` (NCCL) may not run: the
        # runtime's choice for CPU tensors meets the ranks instead
        backend = None
    for _ in range(warmup):
        call()
    nothing = torch.empty(0, dtype=torch.uint8)
    rt.call(Request("barrier", "barrier", 0, rt.world if group is None else group, nothing, (None,), backend))
    samples = []
    clock, fastest = time.perf_counter, float("inf")
    for _ in range(iters):
        start = clock()
        call()
        took = clock() - start
        samples.append(took)
        if pace:
            fastest = min(fastest, took)
            time.sleep(fastest)
    return slowest(rt, statistics.median(samples), group, backend)


def time_op(
    rt, op, nbytes, backend=None, dtype=torch.float32, group=None, iters=None, warmup=5, chunk_bytes=0, device="cpu"
):
    """(seconds per op, actual bytes). send_recv reports half the round trip."""
    call, actual = make_call(rt, op, nbytes, backend, dtype, group, chunk_bytes, device)
    seconds = time_call(rt, call, iters or iterations_for(actual), warmup, group, backend, device=device)
    return (seconds / 2 if op == "send_recv" else seconds), actual


def compare(
    rt,
    op,
    nbytes,
    candidates,
    dtype=torch.float32,
    group=None,
    iters=None,
    warmup=5,
    rounds=3,
    pace=False,
    device="cpu",
):
    """Seconds per op for each candidate, a (backend or None for the runtime's own choice,
    chunk_bytes) pair, and the actual bytes, measured through the runtime `rt` on tensors made
    on `device`. The candidates are timed in `rounds` interleaved rounds, every other one in
    reverse (A B C, C B A, A B C ...), the iterations split between them, and each keeps its
    fastest round. Load from elsewhere comes in bursts and only ever
    adds time, and a backend can slow the one timed right after it (gloo's threads leave MPI
    on a busy core for a while), so each candidate's best round, taken in more than one
    position, compares the candidates and not the moments or the order they ran in."""
    n = iters or iterations_for(nbytes)
    per_round = max(1, n // rounds) if iters else max(5, n // rounds)
    best, actual = [float("inf")] * len(candidates), None
    for r in range(rounds):
        order = range(len(candidates)) if r % 2 == 0 else reversed(range(len(candidates)))
        for i in order:
            backend, chunk_bytes = candidates[i]
            call, actual = make_call(rt, op, nbytes, backend, dtype, group, chunk_bytes, device)
            warm = warmup if r == 0 else min(warmup, 2)
            seconds = time_call(rt, call, per_round, warm, group, backend, pace, device)
            best[i] = min(best[i], seconds / 2 if op == "send_recv" else seconds)
    return best, actual
