"""Micro-benchmarks in the style of OSU and nccl-tests.

    python -m launch.local -n 2 -m mcr.tools.bench [--ops all_reduce,all_to_all] [--max-bytes 64M]
    python -m launch.local -n 2 -m mcr.tools.bench --device cuda     # on each rank's GPU

For each op and message size: latency (µs) and bus bandwidth (GB/s) on every available
backend (or the candidates --backends names: a backend, mpi/chunk=1M, node:mpi+gloo) and on the
runtime's own choice ("auto", with the candidate it picked, its distance from the best one, and
the picked candidate's own column's distance from the best: the same calls timed apart, so
between the two the choice's quality shows apart from the timing's noise), then the runtime's
per-call overhead against calling each
backend library directly on a 4-byte all-reduce. With --device cuda the tensors are on each
rank's GPU, the columns add each backend staged through host memory (`mpi/host`), and every
call is timed until the GPU has finished it (`mcr.measure`); the overhead is a CPU figure and is
left out there.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from .. import api
from ..commlog import human_bytes
from ..measure import (
    DEVICE_HELP,
    MEASURABLE_OPS,
    PACE_HELP,
    bound_device,
    compare,
    device_problem,
    paced,
    runs_as_named,
    time_call,
)
from ..ops import bus_factor
from ..tuning import candidates as cands
from ..tuning.table import Choice
from .machine import Watch

DEFAULT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def sizes_between(low: int, high: int, step: int = 2) -> list:
    """low, 2 low, 4 low, ... up to high; `step` (a power of two) keeps one size in log2(step)."""
    sizes, size = [], max(1, low)
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes[:: max(1, step.bit_length() - 1)]


def sweep(ops, backends, sizes, dtype, iters=None, rounds=3, pace=False, device="cpu"):
    """Rows of {op, bytes, <backend>: seconds, auto, auto_backend}; identical on every rank.
    The backends of one size are timed in interleaved rounds (`measure.compare`) on tensors
    made on `device`."""
    rt = api.runtime()
    n = rt.world_size
    rows = []
    for op in ops:
        for size in sizes:
            row = {"op": op}
            timed = [(None, 0) if name == "auto" else cands.run_as(cands.parse_label(name)) for name in backends]
            seconds, actual = compare(rt, op, size, timed, dtype, iters=iters, rounds=rounds, pace=pace, device=device)
            if rows and rows[-1]["op"] == op and rows[-1]["bytes"] == actual:
                continue  # rounded up to the same message as the last size (divisible by n)
            row.update(zip(backends, seconds))
            row["bytes"] = actual
            if "auto" in backends:
                route = rt.router.route(op, actual, rt.world, dtype, torch.device(device).type)
                chunked = route.chunk_bytes and op == "all_reduce" and actual > route.chunk_bytes  # run in chunks
                row["auto_backend"] = route.op.label + (f"/{cands.short_bytes(route.chunk_bytes)}" if chunked else "")
                # the candidate it runs, as --backends names it: that column times the same calls
                row["auto_pick"] = cands.label(Choice(route.op.label, route.chunk_bytes if chunked else 0))
            row["busbw_factor"] = bus_factor(op, n)
            rows.append(row)
    return rows


def default_columns(rt, ops, dtype, device_name) -> list:
    """Every started backend (and on cuda each staged through host memory, `mpi/host`) that runs
    all the ops on this device as named, then the runtime's own choice, `auto`."""
    whole = [cands.label(c) for c in cands.whole(list(rt.backends), device_name)]
    runs = [name for name in whole if all(runs_as_named(rt, name, op, dtype, None, device_name) for op in ops)]
    return runs + ["auto"]


def format_table(rows, backends) -> str:
    singles = [b for b in backends if b != "auto"]
    out = []
    for op in dict.fromkeys(r["op"] for r in rows):
        width = max([12] + [len(b) + 7 for b in singles])
        header = f"{'size':>9}" + "".join(f"{b + ' us':>{width}}{b + ' busbw':>{width}}" for b in singles)
        if "auto" in backends:
            header += f"{'auto':>14}{'auto us':>11}{'vs best':>9}{'pick vs best':>14}"
        out += [f"\n# {op} ({api.get_world_size()} ranks; busbw in GB/s, nccl-tests factor)", header, "-" * len(header)]
        for r in (r for r in rows if r["op"] == op):
            line = f"{human_bytes(r['bytes']):>9}"
            for b in singles:
                bw = r["bytes"] / r[b] / 1e9 * r["busbw_factor"] if r[b] > 0 else 0.0
                line += f"{r[b] * 1e6:>{width}.1f}{bw:>{width}.3f}"
            if "auto" in backends:
                best = min(r[b] for b in singles) if singles else r["auto"]
                line += f"{r['auto_backend']:>14}{r['auto'] * 1e6:>11.1f}{(r['auto'] / best - 1) * 100:>+8.1f}%"
                pick = r.get("auto_pick")
                line += f"{(r[pick] / best - 1) * 100:>+13.1f}%" if pick in singles else f"{'-':>14}"
            out.append(line)
    return "\n".join(out)


def overhead(iters=20000, rounds=3):
    """Per-call cost of the runtime on a 4-byte all-reduce: mcr.all_reduce minus the library call."""
    rt = api.runtime()
    x = torch.ones(1)
    rows = {}
    direct = {}
    if "mpi" in rt.backends:
        mpi = rt.backends["mpi"].MPI
        comm, arr = rt.world.comms["mpi"], x.numpy()
        direct["mpi"] = lambda: comm.Allreduce(mpi.IN_PLACE, arr, mpi.SUM)
    if "gloo" in rt.backends:
        import torch.distributed as dist

        pg, opts = rt.world.comms["gloo"], dist.AllreduceOptions()
        direct["gloo"] = lambda: pg.allreduce([x], opts).wait()
    chosen, _ = rt.router.choose("all_reduce", 4, rt.world, torch.float32, "cpu")
    auto = float("inf")
    # The machine may be shared: each row keeps its best of `rounds` runs, the library and the
    # runtime timed side by side in each round (as mcr.tools.bench_hooks does).
    for _ in range(rounds):
        for name, call in direct.items():
            n_iters = iters if name == "mpi" else iters // 20
            lib = time_call(rt, call, n_iters, warmup=50)
            via = time_call(rt, lambda name=name: api.all_reduce(x, backend=name), n_iters, warmup=50)
            best = rows.get(name, (lib, via))
            rows[name] = (min(lib, best[0]), min(via, best[1]))
        auto = min(auto, time_call(rt, lambda: api.all_reduce(x), iters if chosen.name == "mpi" else iters // 20, 50))
    lines = [
        f"\n# runtime overhead, 4-byte all_reduce (median per call, slowest rank, best of {rounds} rounds)",
        f"{'backend':<10}{'library us':>12}{'mcr us':>10}{'overhead us':>13}",
        "-" * 45,
    ]
    for name, (lib, via) in rows.items():
        lines.append(f"{name:<10}{lib * 1e6:>12.2f}{via * 1e6:>10.2f}{(via - lib) * 1e6:>13.2f}")
    if chosen.name in rows:
        lib = rows[chosen.name][0]
        lines.append(f"{'auto>' + chosen.name:<10}{lib * 1e6:>12.2f}{auto * 1e6:>10.2f}{(auto - lib) * 1e6:>13.2f}")
    return "\n".join(lines), {k: {"library_s": v[0], "mcr_s": v[1]} for k, v in rows.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"comma list from {', '.join(MEASURABLE_OPS)}")
    parser.add_argument("--backends", default=None, help="comma list (default: every available backend, and auto)")
    parser.add_argument("--min-bytes", default="4")
    parser.add_argument("--max-bytes", default="64M")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help=DEVICE_HELP)
    parser.add_argument("--iters", type=int, default=None, help="iterations per point (default: scaled by size)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds per point; each backend keeps its best"
    )
    parser.add_argument("--pace", action=argparse.BooleanOptionalAction, default=None, help=PACE_HELP)
    parser.add_argument("--tuning", default=None, help="tuning table for the auto choice (else MCR_TUNING_FILE)")
    parser.add_argument("--no-overhead", action="store_true", help="skip the overhead measurement")
    parser.add_argument("--json", default=None, help="also write the rows here (rank 0)")
    args = parser.parse_args(argv)
    watch = Watch()  # from here: how busy the machine was while this ran
    problem = device_problem(args.device)  # before any rank starts: every rank stops alike
    if problem:
        parser.error(problem)

    kwargs = {"tuning": args.tuning} if args.tuning else {}
    rt = api.init(**kwargs)
    device = bound_device(args.device)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for op in ops:
        if op not in MEASURABLE_OPS:
            parser.error(f"unknown op {op!r}; choose from {', '.join(MEASURABLE_OPS)}")
    if "send_recv" in ops and rt.world_size < 2:
        ops.remove("send_recv")
    dtype = getattr(torch, args.dtype)
    backends = args.backends.split(",") if args.backends else default_columns(rt, ops, dtype, args.device)
    for name in backends:
        if name == "auto":
            continue
        try:
            choice = cands.parse_label(name)
        except ValueError as exc:
            parser.error(str(exc))
        for part in (choice.backend, choice.inter):
            if part and part not in rt.backends:
                parser.error(f"backend {part!r} is unavailable here: {rt.unavailable.get(part, 'unknown backend')}")
    sizes = sizes_between(cands.parse_bytes(args.min_bytes), cands.parse_bytes(args.max_bytes))
    pace = paced(args.pace, rt.shape.nodes)
    rows = sweep(ops, backends, sizes, dtype, args.iters, args.rounds, pace, device)
    how = "calls timed"
    if device.type == "cuda":
        how = f"cuda tensors on {torch.cuda.get_device_name(device)}, calls timed to torch.cuda.synchronize()"
    text = f"mcr.tools.bench: {how} {'paced' if pace else 'back to back'}\n" + format_table(rows, backends)
    if args.no_overhead:
        over_text, over = "", {}
    elif device.type == "cuda":
        over_text, over = "\n# runtime overhead: measured on CPU tensors (run without --device cuda)", {}
    else:
        over_text, over = overhead()
    if rt.rank == 0:
        print(text + "\n" + over_text + "\n" + watch.line(), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"world_size": rt.world_size, "device": device.type, "rows": rows, "overhead": over}, f, indent=1
                )
    api.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
