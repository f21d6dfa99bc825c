"""Two ranks sharing one GPU on backend "mcr": torch's coalescing manager (as DeepSpeed ZeRO-3's
all_gather_coalesced calls it) and batch_isend_irecv on CUDA tensors, `work.get_future()` on
CUDA, DDP and FSDP2 training on CUDA against a single-process reference; each on MPI and on
gloo (the runtime told to run every op there), under stream races.

One rank alone (-n 1) has the GPU to itself, so torch registers the runtime's NCCL group as the
group's CUDA backend (two ranks sharing it have none: gloo's is registered): there the coalescing
manager and the futures run on NCCL, MPI and gloo; no send (no peer) and no training.

    python -m launch.local -n 2 -m tests.gpu.scripts.torch_hooks                  # on a GPU
    python -m launch.local -n 1 -m tests.gpu.scripts.torch_hooks                  # NCCL registered
    python -m launch.local -n 2 -m tests.gpu.scripts.torch_hooks --device cpu     # logic only

Prints, per rank and label, `rank R: gpu LABEL OK N checks` (or `FAILED F of N checks` after a
line per failure), `COMMLOG R LABEL <json>` ([op, backend] of the calls each training made),
`rank R: gpu mpi cuda_aware=BOOL: WHY` and `rank R: gpu cuda backend NAME` (the group's).
"""

import json
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.distributed_c10d import _coalescing_manager, _IllegalWork
from torch.distributed.fsdp import fully_shard

import mcr
from mcr.hooks import torch_backend

from .races import (
    Case,
    Checks,
    Gpu,
    arguments,
    fold,
    mpi_cuda_aware,
    pattern,
    run_races,
    seed,
)

STEPS = 6
AVG = dist.ReduceOp.AVG

# torch 2.13 renamed all_gather_into_tensor and reduce_scatter_tensor; DeepSpeed and 2.11 use these names
warnings.filterwarnings("ignore", message=".*is deprecated. Please use .*_single.*", category=FutureWarning)
args = arguments(__doc__)
torch_backend.init_process_group(comm_log=True, watchdog_timeout_s=120)
rt = mcr.runtime()
rank, n = dist.get_rank(), dist.get_world_size()
gpu = Gpu(args.device, args.sleep_ms)
checks = Checks(rank)
ALONE = n == 1  # the GPU to itself: NCCL has a communicator on the world (two ranks on one GPU: none)
BACKENDS = ("nccl", "mpi", "gloo") if ALONE and gpu.cuda else ("mpi", "gloo")
print("rank {}: gpu mpi cuda_aware={}: {}".format(rank, *mpi_cuda_aware(rt)), flush=True)
registered = dist.group.WORLD._get_backend(gpu.device)  # what torch's C++ paths reach on this device
print(f"rank {rank}: gpu cuda backend {type(registered).__name__}", flush=True)
# the reference and the trainings compare float32 results to 1e-5: no TF32 in either
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def real_works(case, works, what):
    """torch hands the caller these Works: each must be a Work the op completes, not None or
    the placeholder torch returns inside a coalescing block (`_IllegalWork`)."""
    ok = bool(works) and all(isinstance(w, dist.Work) and not isinstance(w, _IllegalWork) for w in works)
    case.extra.append((what, ok, f"got {works!r}"))


class Waits:
    """Something to wait on whose wait() returns more tensors for the consumer, by name."""

    def __init__(self, wait):
        self.wait = wait


# --- 1. coalescing, batch_isend_irecv, futures ---------------------------------------------------
def coalesced(k, kind, async_ops):
    """Three ops of one kind in one `_coalescing_manager(group, device, async_ops)` block."""
    me, parts = rank, 3

    def pat(r, i, j=0, size=512):
        return pattern(seed(k, r, j) + 8 * i, size, torch.float32)  # i: which of the three ops

    if kind == "all_gather_into_tensor":
        ins = {f"x{i}": pat(me, i) for i in range(parts)}
        want = {f"o{i}": torch.cat([pat(r, i) for r in range(n)]) for i in range(parts)}

        def issue(b, i):
            return dist.all_gather_into_tensor(b[f"o{i}"], b[f"x{i}"], async_op=True)

    elif kind == "all_reduce avg":  # one flat all-reduce, unflattened by a finisher
        ins = {f"x{i}": pat(me, i) for i in range(parts)}
        want = {f"x{i}": fold("avg", [pat(r, i) for r in range(n)], torch.float32) for i in range(parts)}

        def issue(b, i):
            return dist.all_reduce(b[f"x{i}"], op=AVG, async_op=True)

    else:  # reduce_scatter_tensor avg
        ins = {f"x{i}": torch.cat([pat(me, i, j, 256) for j in range(n)]) for i in range(parts)}
        want = {f"o{i}": fold("avg", [pat(r, i, me, 256) for r in range(n)], torch.float32) for i in range(parts)}

        def issue(b, i):
            return dist.reduce_scatter_tensor(b[f"o{i}"], b[f"x{i}"], op=AVG, async_op=True)

    outs = {name: t for name, t in want.items() if name not in ins}

    def run(b, a):
        with _coalescing_manager(None, gpu.device, async_ops=async_ops) as cm:
            for i in range(parts):
                issue(b, i)  # torch records it; the block's end runs them
        if not async_ops:
            return None
        real_works(case, cm.works, "the coalescing manager's Works")
        return cm

    case = Case(f"coalesced {kind} async_ops={async_ops}", ins, outs, run, want)
    return case


def batched_p2p(k):
    """batch_isend_irecv of two sends to the peer and two receives from it."""
    peer = (rank + 1) % n
    ins = {f"x{i}": pattern(seed(k, rank, i), 512, torch.float32) for i in range(2)}
    want = {f"got{i}": pattern(seed(k, peer, i), 512, torch.float32) for i in range(2)}

    def run(b, a):
        ops = [dist.P2POp(dist.isend, b[f"x{i}"], peer) for i in range(2)]
        ops += [dist.P2POp(dist.irecv, b[f"got{i}"], peer) for i in range(2)]
        reqs = dist.batch_isend_irecv(ops)
        real_works(case, reqs, "batch_isend_irecv's Works")
        return list(reqs)

    case = Case("batch_isend_irecv", ins, dict(want), run, want)
    return case


def future(k, then):
    """An async AVG all-reduce's `get_future()`, taken at issue: waited on (its value is the
    reduced tensor), or chained with `then` (a callback computing on the value)."""
    data = [pattern(seed(k, r), 1024, torch.float32) for r in range(n)]
    avg = fold("avg", data, torch.float32)

    def run(b, a):
        fut = dist.all_reduce(b["x"], op=AVG, async_op=True).get_future()
        if then:
            child = fut.then(lambda f: f.value()[0] * 2)
            return Waits(lambda: {"doubled": child.wait()})
        return Waits(lambda: {"value": fut.wait()[0]})

    want = {"doubled": avg * 2} if then else {"x": avg, "value": avg}
    return Case(f"get_future{' then' if then else ''}", {"x": data[rank]}, {}, run, want)


for backend in BACKENDS:
    rt.router.force_backend(backend)  # every op that follows runs there
    for kind in ("all_gather_into_tensor", "all_reduce avg", "reduce_scatter_tensor avg"):
        run_races(checks, f"coalescing {backend}", gpu, lambda k, kind=kind: coalesced(k, kind, True), "", (True,))
    run_races(
        checks, f"coalescing {backend}", gpu, lambda k: coalesced(k, "all_gather_into_tensor", False), "", (False,)
    )
    if not ALONE:  # a send needs a peer
        run_races(checks, f"coalescing {backend}", gpu, batched_p2p, "", (True,))
    run_races(checks, f"futures {backend}", gpu, lambda k: future(k, False), "", (True,))
    run_races(checks, f"futures {backend}", gpu, lambda k: future(k, True), "", (True,))
    rt.router.force_backend(None)


# --- 2. DDP and FSDP2 against one process training on both ranks' data ---------------------------
class _Sleep(torch.autograd.Function):
    """Identity whose forward and backward each queue a long kernel on the current stream: the
    gradients DDP's buckets copy and FSDP2's all-gathers and reduce-scatters read come late."""

    @staticmethod
    def forward(ctx, x, ms):
        gpu.sleep(ms)
        ctx.ms = ms
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        gpu.sleep(ctx.ms)
        return grad, None


class Sleep(nn.Module):
    def __init__(self, ms):
        super().__init__()
        self.ms = ms

    def forward(self, x):
        return _Sleep.apply(x, self.ms) if self.ms else x


def model(ms):
    torch.manual_seed(0)
    layers = [nn.Linear(8, 64), nn.ReLU(), Sleep(ms), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4), Sleep(ms)]
    return nn.Sequential(*layers).to(gpu.device)


def batch(r, step):
    g = torch.Generator().manual_seed(100 * step + r)  # distinct data per rank and step
    return torch.randn(16, 8, generator=g).to(gpu.device), torch.randn(16, 4, generator=g).to(gpu.device)


def reference():
    """One process, no communication: rank r's loss at each step, and the parameters after
    training on every rank's batch at once (what averaging the ranks' gradients amounts to)."""
    net = model(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = {r: [] for r in range(n)}
    for step in range(STEPS):
        xs, ys = zip(*(batch(r, step) for r in range(n)))
        with torch.no_grad():
            for r in range(n):
                losses[r].append(nn.functional.mse_loss(net(xs[r]), ys[r]).item())
        opt.zero_grad()
        nn.functional.mse_loss(net(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return losses, {name: p.detach().cpu() for name, p in net.named_parameters()}


def train(net):
    """STEPS steps on the side stream; every other step the default stream sleeps first."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    gpu.sync()
    with gpu.on(gpu.s1):
        for step in range(STEPS):
            if step % 2:
                gpu.sleep(gpu.sleep_ms, gpu.default)
            x, y = batch(rank, step)
            loss = nn.functional.mse_loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())  # no .item(): the host never waits inside the loop
    gpu.sync()
    return [loss.item() for loss in losses]


def compare(label, losses, params, want_losses, want_params):
    for step, (got, want) in enumerate(zip(losses, want_losses)):
        close = abs(got - want) <= 1e-5 + 1e-4 * abs(want)
        checks.expect_true(label, f"loss at step {step}", close, f"got {got} want {want}")
    worst = max(((params[k] - want_params[k]).abs().max().item(), k) for k in want_params)
    close = all(torch.allclose(params[k], want_params[k], rtol=1e-4, atol=1e-5) for k in want_params)
    checks.expect_true(label, "parameters after training", close, f"largest difference {worst[0]:.3g} in {worst[1]}")


def comm_rows():
    counts = {}
    for r in rt.comm_log.rows():
        counts[r["op"], r["backend"]] = counts.get((r["op"], r["backend"]), 0) + r["count"]
    return counts


def trainings():
    """DDP, then FSDP2, on each backend: losses and parameters against `reference()`."""
    want_losses, want_params = reference()
    for backend in BACKENDS:
        rt.router.force_backend(backend)
        before = comm_rows()
        ddp = nn.parallel.DistributedDataParallel(model(gpu.sleep_ms), bucket_cap_mb=0.01)  # ~10 KB: two buckets a step
        losses = train(ddp)
        params = {name: p.detach().cpu() for name, p in ddp.module.named_parameters()}
        compare(f"ddp {backend}", losses, params, want_losses[rank], want_params)
        used = sorted({key for key, count in comm_rows().items() if count > before.get(key, 0)})
        print(f"COMMLOG {rank} ddp-{backend} {json.dumps(used)}", flush=True)
        rt.router.force_backend(None)

    mesh = init_device_mesh(gpu.device.type, (n,))
    for backend in BACKENDS:
        rt.router.force_backend(backend)
        before = comm_rows()
        net = model(gpu.sleep_ms)
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        losses = train(net)
        # each rank holds rows rank*d/n.. of every parameter (dims divide by 2): compare those
        params = {name: p.to_local().detach().cpu() for name, p in net.named_parameters()}
        mine = {name: p.chunk(n, 0)[rank] for name, p in want_params.items()}
        compare(f"fsdp2 {backend}", losses, params, want_losses[rank], mine)
        used = sorted({key for key, count in comm_rows().items() if count > before.get(key, 0)})
        print(f"COMMLOG {rank} fsdp2-{backend} {json.dumps(used)}", flush=True)
        rt.router.force_backend(None)


if not ALONE:  # at one rank the all-reduces are identities: a training there shows nothing
    trainings()
checks.report()
dist.destroy_process_group()  # finalizes the runtime it started
print(f"rank {rank}: gpu finalize OK", flush=True)
