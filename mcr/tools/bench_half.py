"""16-bit all-reduce: which way is fastest, side by side in one run.

    python -m launch.local -n 2 -m mcr.tools.bench_half [--dtype bfloat16] [--max-bytes 64M]

Per message size (of the 16-bit tensor), the slowest rank's median of:
  mpi       mcr.all_reduce on the MPI backend: what it does (op16 from UPCAST_BELOW up, upcast below)
  op16      MPI on 16-bit words with mcr's own reduce op (each pair added in float32, rounded once)
  upcast    copy to a float32 buffer, MPI's float32 sum, copy back: twice the bytes on the wire,
            but MPI's built-in reduction
  gloo      gloo's native 16-bit sum (the fallback before MPI had 16-bit reductions)
  fp32      MPI on a float32 tensor of the same element count (twice the bytes), for scale
"""

from __future__ import annotations

import argparse
import sys

import torch

from .. import api
from ..commlog import human_bytes
from ..measure import iterations_for, time_call
from ..tuning.candidates import parse_bytes
from .bench import sizes_between
from .machine import Watch


def calls(numel, dtype):
    rt = api.runtime()
    mpi = rt.backends["mpi"]
    comm = rt.world.comms["mpi"]
    x = torch.ones(numel, dtype=dtype)
    wide = torch.ones(numel)
    scratch = torch.empty(numel)

    def upcast():
        scratch.copy_(x)
        mpi.all_reduce(comm, scratch, "sum", False)
        x.copy_(scratch)

    in_place, words, op16 = mpi.MPI.IN_PLACE, mpi.typed_buffer(x), mpi.mpi_op(x, "sum")
    return {
        "mpi": lambda: api.all_reduce(x, backend="mpi"),
        "op16": lambda: comm.Allreduce(in_place, words, op16),
        "upcast": upcast,
        "gloo": lambda: api.all_reduce(x, backend="gloo"),
        "fp32": lambda: api.all_reduce(wide, backend="mpi"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--min-bytes", default="4")
    parser.add_argument("--max-bytes", default="64M")
    parser.add_argument("--step", type=int, default=4, help="size factor between rows")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each way keeps its best")
    args = parser.parse_args(argv)
    watch = Watch()  # from here: how busy the machine was while this ran
    rt = api.init(tuning=None)
    if "mpi" not in rt.backends or "gloo" not in rt.backends:
        parser.error(
            "needs the mpi and gloo backends: launch with `python -m launch.local -n 2 -m mcr.tools.bench_half`"
        )
    dtype = getattr(torch, args.dtype)
    sizes = sizes_between(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.step)
    names = ("mpi", "op16", "upcast", "gloo", "fp32")
    header = f"{'size':>9}" + "".join(f"{n + ' us':>12}" for n in names) + f"{'mpi/gloo':>10}{'op16/upcast':>13}"
    if rt.rank == 0:
        print(f"# all_reduce sum of {args.dtype} ({rt.world_size} ranks; fp32: same element count)", flush=True)
        print(header + "\n" + "-" * len(header), flush=True)
    for size in sizes:
        numel = max(1, size // 2)
        ways = calls(numel, dtype)
        iters = max(3, iterations_for(numel * 2) // args.rounds)
        best = dict.fromkeys(names, float("inf"))
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else reversed(names):
                best[name] = min(best[name], time_call(api.runtime(), ways[name], iters, warmup=3))
        line = f"{human_bytes(numel * 2):>9}" + "".join(f"{best[n] * 1e6:>12.1f}" for n in names)
        if rt.rank == 0:
            print(line + f"{best['mpi'] / best['gloo']:>10.2f}{best['op16'] / best['upcast']:>13.2f}", flush=True)
    if rt.rank == 0:
        print(watch.line(), flush=True)
    api.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
