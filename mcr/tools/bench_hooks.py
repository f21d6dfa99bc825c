"""Per-call cost of the torch.distributed backend "mcr" on a 4-byte all-reduce.

    python -m launch.local -n 2 -m mcr.tools.bench_hooks                      # mpiexec: MPI chosen
    python -m launch.local -n 2 --launcher torchrun -m mcr.tools.bench_hooks  # torchrun: gloo
    MCR_BACKEND=gloo python -m launch.local -n 2 -m mcr.tools.bench_hooks     # force gloo

Rows (median µs per call, slowest rank): the chosen backend's library called directly; the
runtime (`mcr.all_reduce`); the registered ProcessGroup's `allreduce` called from Python;
`dist.all_reduce`, which adds torch's own Python wrapper; and a functional all-reduce, which
reaches the group from C++ (as DDP's reducer does) and allocates its output. "over library"
is what each path adds to the library call. With `-n 1` the peer's scheduling drops out and
the rows show pure software cost (useful on a loaded machine).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from .. import api
from ..hooks import torch_backend
from ..measure import time_call


def _library_call(rt, name, x):
    if name == "mpi":
        mpi = rt.backends["mpi"].MPI
        comm, arr = rt.world.comms["mpi"], x.numpy()
        return lambda: comm.Allreduce(mpi.IN_PLACE, arr, mpi.SUM)
    pg, opts = rt.world.comms[name], dist.AllreduceOptions()
    return lambda: pg.allreduce([x], opts).wait()


def measure(iters: int) -> list:
    rt = api.runtime()
    x = torch.ones(1)
    chosen, _ = rt.choose("all_reduce", x.nbytes, rt.world, x.dtype, "cpu")
    n = iters if chosen.name == "mpi" else max(200, iters // 20)  # gloo is ~100x slower per call
    pg = dist.group.WORLD
    opts = dist.AllreduceOptions()  # C++ callers build theirs once per bucket too
    # torch.ops._c10d_functional reaches the group through the C++ trampoline, as DDP's reducer
    # does; it also allocates its output, so that row is an upper bound for C++ callers.
    functional_all_reduce, wait_tensor = torch.ops._c10d_functional.all_reduce, torch.ops._c10d_functional.wait_tensor
    calls = [
        (f"{chosen.name} library", _library_call(rt, chosen.name, x)),
        ("mcr.all_reduce", lambda: api.all_reduce(x)),
        ("ProcessGroup.allreduce", lambda: pg.allreduce([x], opts).wait()),
        ("dist.all_reduce", lambda: dist.all_reduce(x)),
        ("functional (C++ caller)", lambda: wait_tensor(functional_all_reduce(x, "sum", pg.group_name))),
    ]
    return [(label, time_call(api.runtime(), call, n, warmup=50)) for label, call in calls]


def format_rows(rows) -> str:
    base = rows[0][1]
    lines = [
        f'\n# backend "mcr" overhead, 4-byte all_reduce, {api.get_world_size()} ranks (median per call, slowest rank)',
        f"{'path':<26}{'us/call':>10}{'over library us':>17}",
        "-" * 53,
    ]
    for label, seconds in rows:
        lines.append(f"{label:<26}{seconds * 1e6:>10.2f}{(seconds - base) * 1e6:>17.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20000, help="calls per row for MPI (gloo: 1/20 of it)")
    parser.add_argument("--repeat", type=int, default=3, help="measure this many times, report the best")
    args = parser.parse_args(argv)
    torch_backend.init_process_group()
    best = None
    for _ in range(args.repeat):  # the machine is shared: keep each row's best run
        rows = measure(args.iters)
        best = rows if best is None else [(label, min(s, b)) for (label, s), (_, b) in zip(rows, best)]
    if dist.get_rank() == 0:
        print(format_rows(best), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
