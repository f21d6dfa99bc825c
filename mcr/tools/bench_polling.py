"""What Open MPI's busy polling costs a mixed job, and what `mpi_yield_when_idle=1` buys back.

    python -m launch.local -n 2 -m mcr.tools.bench_polling                                   # yielding (the runtime's default)
    OMPI_MCA_mpi_yield_when_idle=0 python -m launch.local -n 2 -m mcr.tools.bench_polling    # busy polling

Each step: rank 0 computes (2 threads) while rank 1 waits in an MPI barrier, then both run ten
4-byte gloo all-reduces. A rank spinning inside MPI steals the core that the other rank's
compute and gloo threads need. Open MPI reads the setting once, at MPI_Init, so one job measures
one setting: alternate the two commands a few times and compare the medians rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from .. import api
from .machine import Watch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    watch = Watch()  # from here: how busy the machine was while this ran
    api.init()
    if api.available_backends().get("mpi", "") is not None or api.get_world_size() < 2:
        raise SystemExit(
            "bench_polling: needs 2+ ranks with MPI: `python -m launch.local -n 2 -m mcr.tools.bench_polling`"
        )
    torch.set_num_threads(2)
    a, x = torch.randn(384, 384), torch.ones(1)
    steps = []
    for _ in range(args.steps):
        start = time.perf_counter()
        if api.get_rank() == 0:
            for _ in range(20):
                a @ a
        api.barrier(backend="mpi")  # the idle rank waits in MPI here
        for _ in range(10):
            api.all_reduce(x, backend="gloo")
        steps.append(time.perf_counter() - start)
    if api.get_rank() == 0:
        setting = os.environ.get("OMPI_MCA_mpi_yield_when_idle")  # the runtime set its default before MPI_Init
        print(f"mpi_yield_when_idle={setting}: median step ms {statistics.median(steps) * 1e3:.2f}", flush=True)
        print(watch.line(), flush=True)
    api.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
