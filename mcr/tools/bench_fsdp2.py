"""FSDP2 (`fully_shard`) step time on backend "mcr", with every op on gloo, on MPI, and on the
runtime's own choice (a tuning table when MCR_TUNING_FILE names one, else the built-in order).

    python -m launch.local -n 2 -m mcr.tools.bench_fsdp2 [--layers 8 --width 1024 --batch 32]

FSDP2 all-gathers each layer's parameters before its forward and backward and reduce-scatters
its gradients, through torch's functional collectives (C++ ops that reach the backend through
torch's trampoline), as torchtitan does. Rows: median forward+backward+step time (slowest rank;
each way's best of interleaved rounds) and the difference from gloo.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from .. import api
from ..hooks import torch_backend
from .bench_ddp import slowest_median
from .machine import Watch

OPS = ("all_gather", "reduce_scatter")


def step_times(model, opt, batch, steps) -> list:
    import time

    x, y = batch
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - started)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    watch = Watch()  # from here: how busy the machine was while this ran
    torch_backend.init_process_group()
    rt, rank, n = api.runtime(), dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(args.layers) for m in (nn.Linear(args.width, args.width), nn.ReLU())])
    mesh = init_device_mesh("cpu", (n,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    batch = (torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, args.width, generator=g))
    ways = [way for way in ("gloo", "mpi") if way in rt.backends] + ["auto"]
    best = dict.fromkeys(ways, float("inf"))
    for r in range(args.rounds + 1):  # round 0 warms up every way
        for way in ways if r % 2 == 0 else reversed(ways):
            rt.router.force_backend(None if way == "auto" else way)
            median = slowest_median(step_times(model, opt, batch, args.steps))
            if r > 0:
                best[way] = min(best[way], median)
    rt.router.force_backend(None)
    if rank == 0:
        layer_bytes = args.width * (args.width + 1) * 4
        # both ops move a whole layer (mcr sizes an all-gather by its output, a reduce-scatter by its input)
        # the candidate label (node:mpi+gloo), not the backend object: a node-aware route's is its inter-node one
        chosen = {op: rt.router.route(op, layer_bytes, rt.world, torch.float32, "cpu").op.label for op in OPS}
        table = rt.router.table.path if rt.router.table is not None and not rt.router.table.online else "no table"
        print(
            f"\n# FSDP2 on backend mcr, {n} ranks: {args.layers}x Linear({args.width}) each sharded, "
            f"{layer_bytes / 2**20:.1f} MiB all-gathered and reduce-scattered per layer, batch {args.batch}; "
            f"auto: {table} (" + ", ".join(f"{op} on {name}" for op, name in chosen.items()) + ")"
        )
        print(f"{'way':<8}{'step ms':>9}{'vs gloo':>9}\n" + "-" * 26)
        for way, t in best.items():
            vs = f"{(t / best['gloo'] - 1) * 100:+.0f}%" if "gloo" in best else ""
            print(f"{way:<8}{t * 1e3:>9.1f}{vs:>9}", flush=True)
        print(watch.line(), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
