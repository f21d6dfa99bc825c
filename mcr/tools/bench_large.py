"""Large all-reduce against the memory floor, side by side in one run.

    python -m launch.local -n 2 -m mcr.tools.bench_large [--sizes 16M,64M]

Per size (float32, 2+ ranks), the slowest rank's median of:
  floor       every rank copies the message once (np.copyto), all at the same time: the memory
              bandwidth an all-reduce shares with its peers on one node (a bound no way beats)
  raw-mpi     mpi4py's Allreduce, the library alone
  raw-mpi/1M  the same in chunks of 1 MiB, called in a loop (what the runtime adds to it shows as
              the gap to mpi/chunk=1M)
  mpi/chunk=C the runtime's all-reduce in chunks of C (the tuning table's candidates)
  rs+ag       reduce_scatter_tensor then all_gather_into_tensor on MPI (the composition that moves
              the fewest bytes), whole and in chunks of 1M per rank
  gloo        gloo's all-reduce
Open MPI's own algorithm choice is set per run by MCA variables (e.g.
OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=4): the raw-mpi
and mpi/* columns then use it.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

from .. import api
from ..chunked import run_chunked
from ..commlog import human_bytes
from ..measure import time_call
from ..tuning.candidates import parse_bytes
from .machine import Watch

CHUNKS = ("256K", "1M", "4M")


def ways(nbytes, chunks):
    rt = api.runtime()
    mpi, comm, n = rt.backends["mpi"], rt.world.comms["mpi"], rt.world_size
    numel = nbytes // 4 // n * n
    x = torch.ones(numel)
    src, dst = np.ones(numel, dtype=np.float32), np.empty(numel, dtype=np.float32)
    part = torch.empty(numel // n)
    MPI = mpi.MPI  # noqa: N806 (the library's name)
    buf = mpi.typed_buffer(x)
    raw_chunks = [mpi.typed_buffer(p) for p in x.split(1 << 18)]

    def rs_ag(per_rank_chunk=0):
        step = per_rank_chunk // 4 if per_rank_chunk else numel // n
        rows = x.view(n, -1)
        for start in range(0, numel // n, step):
            block = rows[:, start : start + step]  # each rank's slice of every rank's share
            piece = part[: block.shape[1]]
            packed = block.contiguous() if per_rank_chunk else x
            api.reduce_scatter_tensor(piece, packed, backend="mpi")
            api.all_gather_into_tensor(packed, piece, backend="mpi")
            if per_rank_chunk:
                block.copy_(packed.view(n, -1))

    out = {
        "floor": lambda: np.copyto(dst, src),
        "raw-mpi": lambda: comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM),
        "raw-mpi/1M": lambda: [comm.Allreduce(MPI.IN_PLACE, b, MPI.SUM) for b in raw_chunks],
    }
    for c in chunks:
        size = parse_bytes(c)
        out[f"mpi/chunk={c}"] = lambda size=size: run_chunked(
            rt,
            rt.router.route("all_reduce", x.nbytes, rt.world, x.dtype, "cpu", "mpi")._replace(chunk_bytes=size),
            rt.world,
            x,
            "sum",
            False,
        )
    out["rs+ag"] = rs_ag
    out["rs+ag/1M"] = lambda: rs_ag(1 << 20)
    out["gloo"] = lambda: api.all_reduce(x, backend="gloo")
    return numel * 4, out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64M")
    parser.add_argument("--chunks", default=",".join(CHUNKS))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each way keeps its best")
    parser.add_argument("--no-gloo", action="store_true")
    args = parser.parse_args(argv)
    watch = Watch()  # from here: how busy the machine was while this ran
    rt = api.init(tuning=None)
    mca = " ".join(f"{k[9:]}={v}" for k, v in sorted(os.environ.items()) if k.startswith("OMPI_MCA_coll"))
    for size in args.sizes.split(","):
        nbytes, calls = ways(parse_bytes(size), [c for c in args.chunks.split(",") if c])
        if args.no_gloo:
            calls.pop("gloo")
        best = dict.fromkeys(calls, float("inf"))
        for r in range(args.rounds):
            for name in calls if r % 2 == 0 else reversed(list(calls)):
                best[name] = min(best[name], time_call(api.runtime(), calls[name], args.iters, warmup=2))
        if rt.rank == 0:
            print(f"\n# all_reduce of {human_bytes(nbytes)} float32, {rt.world_size} ranks {mca or '(MCA defaults)'}")
            print(f"{'way':<16}{'ms':>9}{'x floor':>9}{'vs raw-mpi':>12}\n" + "-" * 46)
            for name, t in best.items():
                print(f"{name:<16}{t * 1e3:>9.2f}{t / best['floor']:>9.2f}{best['raw-mpi'] / t:>11.2f}x", flush=True)
    if rt.rank == 0:
        print(watch.line(), flush=True)
    api.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
