"""What Open MPI's busy polling costs a mixed job, and what `mpi_yield_when_idle=1` buys back.

    python -m mcr.bench_polling [--repeats 3]

Each step: rank 0 computes (2 threads) while rank 1 waits in an MPI barrier, then both run ten
4-byte gloo all-reduces. A rank spinning inside MPI steals the core that the other rank's
compute and gloo threads need. The job runs with yielding off and on, alternated, and the
median step time of each is printed.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

from launch.local import mpiexec_command

STEPS = 40


def _worker() -> None:
    import torch

    from . import api

    api.init()
    torch.set_num_threads(2)
    a, x = torch.randn(384, 384), torch.ones(1)
    steps = []
    for _ in range(STEPS):
        start = time.perf_counter()
        if api.get_rank() == 0:
            for _ in range(20):
                a @ a
        api.barrier(backend="mpi")  # the idle rank waits in MPI here
        for _ in range(10):
            api.all_reduce(x, backend="gloo")
        steps.append(time.perf_counter() - start)
    if api.get_rank() == 0:
        print(f"median step ms {statistics.median(steps) * 1e3:.2f}", flush=True)
    api.finalize()


def _job(yield_when_idle: int) -> float:
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle=str(yield_when_idle))
    out = subprocess.run(
        mpiexec_command(2, ["-m", "mcr.bench_polling", "--worker"]),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=True,
    ).stdout
    return float(re.search(r"median step ms ([\d.]+)", out).group(1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker()
        return 0
    results = {0: [], 1: []}
    for _ in range(args.repeats):
        for setting in (0, 1):
            results[setting].append(_job(setting))
    print(f"{'mpi_yield_when_idle':<22}{'median step ms':>16}{'runs':>30}")
    for setting, times in results.items():
        print(f"{setting:<22}{statistics.median(times):>16.2f}{'  '.join(f'{t:.1f}' for t in times):>30}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
