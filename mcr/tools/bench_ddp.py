"""DDP step time on backend "mcr", with and without overlapping the gradient all-reduce.

    python -m launch.local -n 2 -m mcr.tools.bench_ddp [--layers 8 --width 1024 --batch 64]

DDP's reducer all-reduces each bucket as soon as its gradients are ready and waits for all of
them at the end of backward. Rows (median forward+backward+step time, slowest rank, each row's
best of interleaved rounds):
  compute only   DDP's no_sync(): the same step without any all-reduce
  no overlap     each bucket's future completes when DDP asks for it (`get_future()` waits;
                 what MCR_PROGRESS_THREAD=0 does)
  overlap        the runtime's progress thread completes buckets while backward goes on
"exposed comm" is the row's time over compute only; "hidden" the share of the no-overlap
row's communication the overlap row hides.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import api
from ..hooks import torch_backend
from .machine import Watch


@contextlib.contextmanager
def without_progress_thread(rt):
    """As MCR_PROGRESS_THREAD=0, for one block: futures wait at `get_future()`."""
    thread, rt.progress = rt.progress, None
    try:
        yield
    finally:
        rt.progress = thread


def step_times(model, opt, batch, steps, sync=True) -> list:
    x, y = batch
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=False)
            loss.backward()
        opt.step()
        times.append(time.perf_counter() - started)
    return times


def slowest_median(times) -> float:
    median = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return median.item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bucket-mb", type=float, default=4.0, help="DDP's bucket_cap_mb")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    watch = Watch()  # from here: how busy the machine was while this ran
    torch_backend.init_process_group()
    rt, rank = api.runtime(), dist.get_rank()
    torch.manual_seed(0)
    layers = [m for _ in range(args.layers) for m in (nn.Linear(args.width, args.width), nn.ReLU())]
    model = DDP(nn.Sequential(*layers), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    batch = (torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, args.width, generator=g))
    if rt.progress is None:
        raise SystemExit("bench_ddp: the progress thread is off (MCR_PROGRESS_THREAD=0); nothing to compare")
    ways = {
        "compute only": lambda: step_times(model, opt, batch, args.steps, sync=False),
        "no overlap": lambda: _no_overlap(rt, model, opt, batch, args.steps),
        "overlap": lambda: step_times(model, opt, batch, args.steps),
    }
    for call in ways.values():
        call()  # warm-up: DDP rebuilds its buckets after the first step
    best = dict.fromkeys(ways, float("inf"))
    for r in range(args.rounds):
        for name in ways if r % 2 == 0 else reversed(list(ways)):
            best[name] = min(best[name], slowest_median(ways[name]()))
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        comm = best["no overlap"] - best["compute only"]
        print(
            f"\n# DDP on backend mcr ({rt.router.choose('all_reduce', args.bucket_mb * 2**20, rt.world, torch.float32, 'cpu')[0].name}), "
            f"{dist.get_world_size()} ranks: {args.layers}x Linear({args.width}), {params * 4 / 2**20:.0f} MiB of "
            f"gradients in {args.bucket_mb:g} MiB buckets, batch {args.batch}"
        )
        print(f"{'way':<14}{'step ms':>9}{'exposed comm ms':>17}{'hidden':>8}\n" + "-" * 48)
        for name, t in best.items():
            exposed = t - best["compute only"]
            hidden = f"{(1 - exposed / comm) * 100:.0f}%" if name == "overlap" and comm > 0 else ""
            print(f"{name:<14}{t * 1e3:>9.1f}{exposed * 1e3:>17.1f}{hidden:>8}", flush=True)
        print(watch.line(), flush=True)
    dist.destroy_process_group()
    return 0


def _no_overlap(rt, model, opt, batch, steps):
    with without_progress_thread(rt):
        return step_times(model, opt, batch, steps)


if __name__ == "__main__":
    sys.exit(main())
