"""Per-call cost of the torch.distributed backend "mcr" on a 4-byte all-reduce.

    python -m launch.local -n 2 -m mcr.tools.bench_hooks                      # mpiexec: MPI chosen
    python -m launch.local -n 2 --launcher torchrun -m mcr.tools.bench_hooks  # torchrun: gloo
    MCR_BACKEND=gloo python -m launch.local -n 2 -m mcr.tools.bench_hooks     # force gloo

A second table (`--issue-cost`, on by default) times an async all-reduce's issue against the
blocking call at a few sizes (`issue_cost`); a third (`--floor`) runs the torch paths on a Python
backend that does nothing too, so torch's own share of each row is measured beside it (`floor`).

Rows (median µs per call, slowest rank): the chosen backend's library called directly; the
runtime (`mcr.all_reduce`); the registered ProcessGroup's `allreduce` called from Python;
`dist.all_reduce`, which adds torch's own Python wrapper; and a functional all-reduce, which
reaches the group from C++ (as DDP's reducer does) and allocates its output. "over library"
is what each path adds to the library call. With `-n 1` the peer's scheduling drops out and
the rows show pure software cost (useful on a loaded machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

from .. import api
from ..hooks import torch_backend
from ..hooks.work import DONE, DoneWork
from ..measure import slowest, time_call


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


# --- issue cost (issue 21): what issuing an async op costs the caller, against a blocking call ---
ISSUE_SIZES = (16, 64 << 10, 1 << 20)
ISSUE_TRAIN = 20  # ops issued back to back, as the EleutherAI cookbook's --async-op mode does


def issue_cost(trains: int = 50, sizes=ISSUE_SIZES) -> str:
    """A table: per size, µs per op of `dist.all_reduce(async_op=True)` issued ISSUE_TRAIN back
    to back (the issuing timed only; then all are waited on) and of the blocking
    `dist.all_reduce`, median over `trains` trains of ISSUE_TRAIN, slowest rank. An issue should
    cost no more than the blocking call: it waits for nothing."""
    rt = api.runtime()
    clock = time.perf_counter

    def train(x, async_op):
        dist.barrier()  # every rank starts the train together: a peer's lateness is not timed
        start = clock()
        works = [dist.all_reduce(x, async_op=async_op) for _ in range(ISSUE_TRAIN)]
        issued = clock() - start
        for work in works:
            if work is not None:
                work.wait()
        return issued / ISSUE_TRAIN

    lines = [
        f"\n# async issue cost, dist.all_reduce on backend mcr, {api.get_world_size()} ranks "
        f"(µs per op, {ISSUE_TRAIN} issued back to back, median of {trains} trains, slowest rank)",
        f"{'bytes':>9}  {'backend':<8}{'async issue':>12}{'blocking':>10}{'issue/blocking':>16}",
        "-" * 57,
    ]
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4))
        chosen, chunk = rt.choose("all_reduce", x.nbytes, rt.world, x.dtype, "cpu")
        issue, blocking = [], []
        for _ in range(3):  # warm up: connections, the worker thread, the choice cache
            train(x, True)
            train(x, False)
        for _ in range(trains):  # interleaved: a burst of load hits both alike
            issue.append(train(x, True))
            blocking.append(train(x, False))
        issue_s, blocking_s = slowest(rt, [statistics.median(issue), statistics.median(blocking)])
        name = chosen.name + (f"/chunk={chunk}" if chunk else "")
        lines.append(
            f"{x.nbytes:>9}  {name:<8}{issue_s * 1e6:>12.2f}{blocking_s * 1e6:>10.2f}{issue_s / blocking_s:>16.2f}"
        )
    return "\n".join(lines)


# --- torch's floor: what any Python-registered backend pays before doing anything -------------
FLOOR_BACKEND = "mcr_floor"


class _NothingGroup(dist.ProcessGroup):
    """A Python backend whose all-reduce does nothing: the rows measured on it are torch's own
    cost (its Python wrapper, the C++ dispatch and trampoline, the functional op's output and
    work registry), which no Python backend can go below."""

    def allreduce(self, tensors, opts=None):
        return DONE if opts is not None and not opts.asyncOp else DoneWork()

    def getBackendName(self):  # noqa: N802  (torch's ProcessGroup method name)
        return FLOOR_BACKEND


def _nothing_group(opts, _):
    group = _NothingGroup(opts.group_rank, opts.group_size)
    # torch names a group through its device backends (as "mcr" registers gloo's): unnamed, the
    # functional op could not find it, nor destroy_process_group unregister it. Never called.
    gloo = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    return group


def _floor_group():
    if FLOOR_BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(FLOOR_BACKEND, _nothing_group, extended_api=True, devices=["cpu"])
    return dist.new_group(backend=FLOOR_BACKEND)


def floor(iters: int) -> str:
    """A table: per path, µs per 4-byte all-reduce on backend "mcr" and on a backend that does
    nothing, side by side (median per call, slowest rank)."""
    rt = api.runtime()
    nothing, x = _floor_group(), torch.ones(1)
    functional_all_reduce, wait_tensor = torch.ops._c10d_functional.all_reduce, torch.ops._c10d_functional.wait_tensor

    def paths(group):
        name = group.group_name
        return [
            ("dist.all_reduce", lambda: dist.all_reduce(x, group=group)),
            ("dist.all_reduce async+wait", lambda: dist.all_reduce(x, group=group, async_op=True).wait()),
            ("functional+wait", lambda: wait_tensor(functional_all_reduce(x, "sum", name))),
        ]

    lines = [
        f'\n# torch\'s own cost: the same calls on backend "mcr" and on a Python backend that does nothing, '
        f"{api.get_world_size()} ranks (median µs per call, slowest rank)",
        f"{'path':<28}{'mcr':>9}{'nothing':>9}{'mcr - nothing':>15}",
        "-" * 61,
    ]
    for (label, on_mcr), (_, on_nothing) in zip(paths(dist.group.WORLD), paths(nothing)):
        mcr_s, nothing_s = (time_call(rt, call, iters, warmup=50) for call in (on_mcr, on_nothing))
        lines.append(f"{label:<28}{mcr_s * 1e6:>9.2f}{nothing_s * 1e6:>9.2f}{(mcr_s - nothing_s) * 1e6:>15.2f}")
    dist.destroy_process_group(nothing)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20000, help="calls per row for MPI (gloo: 1/20 of it)")
    parser.add_argument("--repeat", type=int, default=3, help="measure this many times, report the best")
    parser.add_argument(
        "--issue-cost", action=argparse.BooleanOptionalAction, default=True, help="the async issue cost table"
    )
    parser.add_argument("--issue-trains", type=int, default=50, help="trains of 20 ops per size for that table")
    parser.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch's own cost, on a backend doing nothing",
    )
    args = parser.parse_args(argv)
    torch_backend.init_process_group()
    best = None
    for _ in range(args.repeat):  # the machine is shared: keep each row's best run
        rows = measure(args.iters)
        best = rows if best is None else [(label, min(s, b)) for (label, s), (_, b) in zip(rows, best)]
    if dist.get_rank() == 0:
        print(format_rows(best), flush=True)
    if args.issue_cost:
        table = issue_cost(args.issue_trains)
        if dist.get_rank() == 0:
            print(table, flush=True)
    if args.floor:
        table = floor(max(1000, args.iters // 10))
        if dist.get_rank() == 0:
            print(table, flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
