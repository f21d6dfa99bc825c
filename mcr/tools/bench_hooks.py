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
from .machine import Watch


def _library_calls(rt, name, x) -> list:
    """(label, call) rows of the chosen library called directly; for MPI its nonblocking call
    waited at once too, what a functional all-reduce's wait pays the library."""
    if name == "mpi":
        mpi = rt.backends["mpi"].MPI
        comm, arr = rt.world.comms["mpi"], x.numpy()
        return [
            ("mpi library", lambda: comm.Allreduce(mpi.IN_PLACE, arr, mpi.SUM)),
            ("mpi library async+wait", lambda: comm.Iallreduce(mpi.IN_PLACE, arr, mpi.SUM).Wait()),
        ]
    pg, opts = rt.world.comms[name], dist.AllreduceOptions()
    return [(f"{name} library", lambda: pg.allreduce([x], opts).wait())]


def measure(iters: int) -> list:
    rt = api.runtime()
    x = torch.ones(1)
    chosen, _ = rt.router.choose("all_reduce", x.nbytes, rt.world, x.dtype, "cpu")
    n = iters if chosen.name == "mpi" else max(200, iters // 20)  # gloo is ~100x slower per call
    pg = dist.group.WORLD
    opts = dist.AllreduceOptions()  # C++ callers build theirs once per bucket too
    # torch.ops._c10d_functional reaches the group through the C++ trampoline, as DDP's reducer
    # does; it also allocates its output, so that row is an upper bound for C++ callers.
    functional_all_reduce, wait_tensor = torch.ops._c10d_functional.all_reduce, torch.ops._c10d_functional.wait_tensor
    calls = [
        *_library_calls(rt, chosen.name, x),
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
ISSUE_SIZES = (16, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 1 << 20)
ISSUE_TRAIN = 20  # ops issued back to back, as the EleutherAI cookbook's --async-op mode does


def _library_trains(rt, name, x) -> list:
    """(issue one, complete those issued) for the chosen library called directly, async then
    blocking: what the library itself charges to issue against a blocking call."""
    if name == "mpi":
        mpi = rt.backends["mpi"].MPI
        comm, arr = rt.world.comms["mpi"], x.numpy()
        return [
            (lambda: comm.Iallreduce(mpi.IN_PLACE, arr, mpi.SUM), mpi.Request.Waitall),
            (lambda: comm.Allreduce(mpi.IN_PLACE, arr, mpi.SUM), None),
        ]
    pg = rt.world.comms[name]
    return [(lambda: pg.allreduce([x]), _wait_all), (lambda: pg.allreduce([x]).wait(), None)]


def _wait_all(works) -> None:
    for work in works:
        work.wait()


def issue_cost(trains: int = 50, sizes=ISSUE_SIZES, nothing=None) -> str:
    """A table: per size, µs per op of `dist.all_reduce(async_op=True)` issued ISSUE_TRAIN back
    to back (the issuing timed only; then all are waited on) and of the blocking
    `dist.all_reduce`, median over `trains` trains of ISSUE_TRAIN, slowest rank. An issue should
    cost no more than the blocking call: it waits for nothing. The same trains run, interleaved
    with each size's, on the chosen library called directly (its own issue/blocking) and, with
    `nothing` (the group of a backend that does nothing, `floor`), on it: torch's own ratio (it
    makes a Work for an async op and none for a blocking one). "torch + library" is the ratio of
    a backend that adds nothing to either: torch's times plus the library's."""
    rt = api.runtime()
    clock = time.perf_counter

    def train(issue_one, complete):
        dist.barrier()  # every rank starts the train together: a peer's lateness is not timed
        start = clock()
        issued = [issue_one() for _ in range(ISSUE_TRAIN)]
        took = clock() - start
        if complete is not None:
            complete(issued)
        return took / ISSUE_TRAIN

    def on(group, async_op, x):
        if async_op:
            return lambda: dist.all_reduce(x, group=group, async_op=True), _wait_all
        return lambda: dist.all_reduce(x, group=group), None

    def medians(x, library):  # issue and blocking on mcr, on the library, then (with `nothing`) on it
        ways = [on(dist.group.WORLD, True, x), on(dist.group.WORLD, False, x), *library]
        ways += [on(nothing, True, x), on(nothing, False, x)] if nothing is not None else []
        samples = [[] for _ in ways]
        for r in range(3 + trains):  # interleaved: a burst of load hits all alike; 3 warm-ups
            for way, kept in zip(ways, samples):
                took = train(*way)
                if r >= 3:
                    kept.append(took)
        return slowest(rt, [statistics.median(kept) for kept in samples])

    header = f"{'bytes':>9}  {'backend':<8}{'async issue':>12}{'blocking':>10}{'issue/blocking':>16}"
    header += f"{'library: issue':>16}{'blocking':>10}{'issue/blocking':>16}"
    if nothing is not None:
        header += f"{'nothing: issue/blocking':>25}{'torch + library: issue/blocking':>33}"
    lines = [
        f"\n# async issue cost, dist.all_reduce on backend mcr, {api.get_world_size()} ranks "
        f"(µs per op, {ISSUE_TRAIN} issued back to back, median of {trains} trains, slowest rank; "
        "library: the chosen library called directly"
        + (
            "; nothing: the same on a backend that does nothing, torch's own cost; torch + library: "
            "the ratio of a backend adding nothing to them, their times summed"
            if nothing is not None
            else ""
        )
        + ")",
        header,
        "-" * len(header),
    ]
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4))
        chosen, chunk = rt.router.choose("all_reduce", x.nbytes, rt.world, x.dtype, "cpu")
        name = chosen.name + (f"/chunk={chunk}" if chunk else "")
        issue_s, blocking_s, library_issue, library_blocking, *floor_s = medians(x, _library_trains(rt, chosen.name, x))
        line = f"{x.nbytes:>9}  {name:<8}{issue_s * 1e6:>12.2f}{blocking_s * 1e6:>10.2f}{issue_s / blocking_s:>16.2f}"
        line += f"{library_issue * 1e6:>16.2f}{library_blocking * 1e6:>10.2f}{library_issue / library_blocking:>16.2f}"
        if floor_s:
            floor_issue, floor_blocking = floor_s
            bound = (floor_issue + library_issue) / (floor_blocking + library_blocking)
            line += f"{floor_issue / floor_blocking:>25.2f}{bound:>33.2f}"
        lines.append(line)
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
        torch_backend.records_itself(FLOOR_BACKEND)  # it records nothing; torch's hook would fail on it
    return dist.new_group(backend=FLOOR_BACKEND)


def floor(iters: int, nothing, repeat: int = 3) -> str:
    """A table: per path, µs per 4-byte all-reduce on backend "mcr" and on `nothing`, the group
    of a backend that does nothing (`_floor_group`), side by side (median per call, slowest
    rank); each path also as a multiple of `dist.all_reduce` on the same backend."""
    rt = api.runtime()
    x = torch.ones(1)
    functional_all_reduce, wait_tensor = torch.ops._c10d_functional.all_reduce, torch.ops._c10d_functional.wait_tensor

    def paths(group):
        name = group.group_name
        return [
            ("dist.all_reduce", lambda: dist.all_reduce(x, group=group)),
            ("dist.all_reduce async+wait", lambda: dist.all_reduce(x, group=group, async_op=True).wait()),
            ("functional+wait", lambda: wait_tensor(functional_all_reduce(x, "sum", name))),
        ]

    measured = []  # per path, the best of `repeat` interleaved runs on each backend
    for (label, on_mcr), (_, on_nothing) in zip(paths(dist.group.WORLD), paths(nothing)):
        runs = [[time_call(rt, call, iters, warmup=50) for call in (on_mcr, on_nothing)] for _ in range(repeat)]
        measured.append((label, min(r[0] for r in runs), min(r[1] for r in runs)))
    dist_mcr, dist_nothing = measured[0][1], measured[0][2]
    lines = [
        f'\n# torch\'s own cost: the same calls on backend "mcr" and on a Python backend that does nothing, '
        f"{api.get_world_size()} ranks (median µs per call, slowest rank, best of {repeat}; x dist: the path's "
        "cost over dist.all_reduce's on the same backend)",
        f"{'path':<28}{'mcr':>9}{'nothing':>9}{'mcr - nothing':>15}{'x dist mcr':>12}{'x dist nothing':>16}",
        "-" * 89,
    ]
    for label, mcr_s, nothing_s in measured:
        lines.append(
            f"{label:<28}{mcr_s * 1e6:>9.2f}{nothing_s * 1e6:>9.2f}{(mcr_s - nothing_s) * 1e6:>15.2f}"
            f"{mcr_s / dist_mcr:>12.2f}{nothing_s / dist_nothing:>16.2f}"
        )
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
    watch = Watch()  # from here: how busy the machine was while this ran
    torch_backend.init_process_group()
    best = None
    for _ in range(args.repeat):  # the machine is shared: keep each row's best run
        rows = measure(args.iters)
        best = rows if best is None else [(label, min(s, b)) for (label, s), (_, b) in zip(rows, best)]
    if dist.get_rank() == 0:
        print(format_rows(best), flush=True)
    nothing = _floor_group() if args.floor else None
    if args.issue_cost:
        table = issue_cost(args.issue_trains, nothing=nothing)
        if dist.get_rank() == 0:
            print(table, flush=True)
    if args.floor:
        table = floor(max(1000, args.iters // 10), nothing, args.repeat)
        if dist.get_rank() == 0:
            print(table, flush=True)
        dist.destroy_process_group(nothing)
    if dist.get_rank() == 0:
        print(watch.line(), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
