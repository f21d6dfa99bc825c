"""Measure every backend on the ranks this is launched with and write the tuning table.

    python -m launch.local -n 2 -m mcr.tools.tune [--out tuning/{host}-n{world}.yaml] [--max-bytes 64M]
    python -m launch.local -n 2 -m mcr.tools.tune --device cuda     # CUDA tensors: a table for cuda
    python -m mcr.tools.tune --table tuning/vm-n2.yaml --predict-world-size 8     # no ranks needed

For each op, message size (powers of two from --min-bytes to --max-bytes, plus --sizes and the
sizes a model used, read from its comm log with --sizes-from) and candidate (each backend, and
for all-reduce each backend in chunks of --chunks), the latency is the slowest rank's median
after warm-ups, so every rank builds the same table. With --device cuda the tensors are on each
rank's GPU, the candidates add each backend staged through host memory (`mpi/host`), every call
is timed until the GPU has finished it, and the table says `device: cuda` (a job gives it beside
a CPU one: `tuning: cpu.yaml,cuda.yaml`). The table, its plots (`<table>-plots/`)
and a Markdown report (`<table>.md`) are written by rank 0 (by every rank with `{rank}` in --out).
Use it with `MCR_TUNING_FILE=<table>` or `mcr.init(tuning=<table>)`.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import sys
import time

import torch

from .. import api
from ..backends import builtin_order
from ..measure import (
    DEVICE_HELP,
    MEASURABLE_OPS,
    PACE_HELP,
    bound_device,
    compare,
    device_problem,
    paced,
    runs_as_named,
)
from ..tuning import candidates as cands
from ..tuning.fingerprint import fingerprint
from ..tuning.model import fits_for, predict_table
from ..tuning.report import summary, write_beside
from ..tuning.rules import DEFAULT_MARGIN, entries_for, entry_dtype, winners
from ..tuning.table import Curve, TuningTable
from .bench import DEFAULT_OPS
from .machine import Watch

DEFAULT_OUT = "tuning/{host}-n{world}.yaml"
DEFAULT_CUDA_OUT = "tuning/{host}-n{world}-cuda.yaml"  # beside the CPU one, not over it


def powers_of_two(low: int, high: int) -> list:
    sizes, size = [], 1 << max(0, (max(1, low) - 1).bit_length())
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def model_sizes(path: str) -> dict:
    """op -> message sizes a model used, from a comm log JSON (`comm_log_json` / MCR_COMM_LOG_JSON)."""
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"mcr.tools.tune: cannot read the comm log {path} ({exc}); write one with MCR_COMM_LOG_JSON=path"
        ) from None
    out = {}
    for row in rows:
        out.setdefault(row["op"], set()).add(int(row["bytes"]))
    return out


def measure_point(op, size, choices, dtype, group, iters, warmup, rounds, pace=False, device="cpu"):
    """(actual bytes, {label: µs or None}) for every candidate at one requested size."""
    live = [c for c in choices if cands.applies(c, size)]
    runs = [cands.run_as(c) for c in live]  # backend= names it (mpi, mpi/host, node:mpi+gloo), chunked here
    seconds, actual = compare(api.runtime(), op, size, runs, dtype, group, iters, warmup, rounds, pace, device)
    row = {cands.label(c): None for c in choices}
    row.update({cands.label(c): round(t * 1e6, 3) for c, t in zip(live, seconds)})
    return actual, row


def measure_curve(
    op, sizes, choices, dtype, group, iters, warmup, rounds, margin, log, pace=False, device="cpu"
) -> Curve:
    """One op at one group size: every candidate at every size (only on the group's ranks).
    Where the winner changes, both sizes around the change are measured again and each
    candidate keeps its faster median (noise only ever adds time), so a flip must hold twice."""
    labels = [cands.label(c) for c in choices]
    requested, measured, latency = [], [], {lab: [] for lab in labels}
    started = time.perf_counter()
    for size in sizes:
        actual, row = measure_point(op, size, choices, dtype, group, iters, warmup, rounds, pace, device)
        if actual in measured:  # the op rounded two requested sizes to the same message
            continue
        requested.append(size)
        measured.append(actual)
        for lab in labels:
            latency[lab].append(row[lab])
    curve = Curve(op, group.size, str(dtype).replace("torch.", ""), measured, latency)
    wins = winners(curve, margin, labels)
    again = sorted({j for i in range(1, len(wins)) if wins[i] != wins[i - 1] for j in (i - 1, i)})
    for i in again:
        _, row = measure_point(op, requested[i], choices, dtype, group, iters, warmup, rounds, pace, device)
        for lab in labels:
            old, new = latency[lab][i], row[lab]
            latency[lab][i] = old if new is None else new if old is None else min(old, new)
    log(
        f"  {op}: {len(measured)} sizes x {len(labels)} candidates ({len(again)} confirmed) "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return curve


def share_from_rank0(obj):
    """Rank 0's object on every rank (curves of subgroups that some ranks sat out)."""
    data = pickle.dumps(obj) if api.get_rank() == 0 else b""
    length = torch.tensor([len(data)], dtype=torch.int64)
    api.broadcast(length, 0)
    buf = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(int(length.item()), dtype=torch.uint8)
    )
    api.broadcast(buf, 0)
    return pickle.loads(bytes(buf.tolist())) if api.get_rank() != 0 else obj


def build_table(fp, curves, margin, order_by_op, base=None) -> TuningTable:
    """The table of these curves; with `base` (--add-to), that table with these measurements in
    place of its own for the same (op, group size, dtype): a bfloat16 sweep adds bfloat16 entries
    beside the float32 ones (`any`), which stay, as does the model fitted to them."""
    key = lambda c: (c.op, c.group_size, c.dtype)  # noqa: E731
    new = {key(c) for c in curves}
    everything = ([c for c in base.curves if key(c) not in new] if base else []) + curves
    entries, model = [], []
    for curve in curves:
        entries += entries_for(curve, margin, order_by_op[curve.op], dtype=entry_dtype(curve, everything))
        model += fits_for(curve)
    if base is None:
        return TuningTable(fp, entries, None, curves, model)
    replaced = {(e.op, e.group_size, e.dtype) for e in entries}
    entries = [e for e in base.entries if (e.op, e.group_size, e.dtype) not in replaced] + entries
    fitted = {(m.op, m.group_size) for m in base.model}
    model = base.model + [m for m in model if (m.op, m.group_size) not in fitted]
    return TuningTable(base.fingerprint, entries, None, everything, model)


def gpu_text(rt, device) -> str:
    """What a CUDA sweep runs on: the GPU, and whether MPI reads device memory itself (where it
    does not, `mpi` and `mpi/host` both stage, and time alike)."""
    mpi = rt.backends.get("mpi")
    if mpi is None:
        aware = ""
    elif getattr(mpi, "cuda_aware", False):
        aware = ", mpi CUDA-aware"
    else:
        aware = ", mpi not CUDA-aware (mpi and mpi/host both stage)"
    return f"cuda tensors on {torch.cuda.get_device_name(device)}, each call timed to torch.cuda.synchronize(){aware}"


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="mcr.tools.tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"comma list from {', '.join(MEASURABLE_OPS)}")
    p.add_argument("--backends", default=None, help="comma list (default: every available backend)")
    p.add_argument("--min-bytes", default="4")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--sizes", default="", help="extra message sizes for every op, e.g. 3M,786432")
    p.add_argument("--sizes-from", default=None, help="comm log JSON of a model run: measure the sizes it used")
    p.add_argument("--chunks", default="256K,1M,4M", help="all-reduce chunk sizes to try as candidates ('' for none)")
    p.add_argument(
        "--skip",
        default="",
        help="candidates not to measure, e.g. node:gloo+mpi,gloo/chunk=1M (labels as in the table)",
    )
    p.add_argument("--group-sizes", default=None, help="comma list of group sizes to tune (default: the world)")
    p.add_argument("--iters", type=int, default=None, help="iterations per point (default: scaled by size)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per size; each candidate keeps its best")
    p.add_argument("--pace", action=argparse.BooleanOptionalAction, default=None, help=PACE_HELP)
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="fraction a candidate must win by to take over")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help=DEVICE_HELP)
    p.add_argument(
        "--add-to",
        default=None,
        help="a table of this world size to add these measurements to (e.g. --dtype bfloat16); rewritten in place "
        "unless --out names another path",
    )
    p.add_argument(
        "--out",
        default=None,
        help=f"table path (default {DEFAULT_OUT}, on cuda {DEFAULT_CUDA_OUT}); {{host}}, {{world}}, {{rank}} are "
        "filled in",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots and the Markdown report")
    p.add_argument("--table", default=None, help="with --predict-world-size: the measured table to predict from")
    p.add_argument(
        "--predict-world-size", type=int, default=None, help="print the table the model predicts for N ranks"
    )
    p.add_argument("--ranks-per-node", type=int, default=None, help="with --predict-world-size: the target layout")
    return p, p.parse_args(argv)


def predict_main(args) -> int:
    table = TuningTable.load(args.table)
    predicted = predict_table(table, args.predict_world_size, args.ranks_per_node, args.margin)
    print(summary(predicted, args.predict_world_size), flush=True)
    if args.out is not None:
        predicted.save(args.out.format(host=socket.gethostname(), world=args.predict_world_size, rank=0))
        print(f"\npredicted table written to {predicted.path}")
    return 0


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    if args.table:
        if not args.predict_world_size:
            parser.error("--table is read only with --predict-world-size N")
        return predict_main(args)

    problem = device_problem(args.device)  # before any rank starts: every rank stops alike
    if problem:
        parser.error(problem)
    add_to = TuningTable.load(args.add_to) if args.add_to else None  # refused before any rank starts
    if add_to is not None and add_to.device != args.device:
        parser.error(
            f"--add-to {args.add_to} is a table for {add_to.device} tensors; add to it with --device {add_to.device}, "
            f"or write a {args.device} table of its own"
        )
    if args.out is None:
        args.out = args.add_to or (DEFAULT_CUDA_OUT if args.device == "cuda" else DEFAULT_OUT)
    rt = api.init(tuning=None)  # measure the backends themselves, not a previous table's choice
    device = bound_device(args.device)
    world, rank = rt.world_size, rt.rank
    if add_to is not None:
        add_to.check_fits(world, ranks_per_node=rt.shape.per_node, nodes=rt.shape.nodes)
    if world < 2:
        parser.error(
            "there is nothing to tune on 1 rank; launch it on the ranks of the job, e.g. "
            "`python -m launch.local -n 2 -m mcr.tools.tune`"
        )
    log = (lambda msg: print(msg, flush=True)) if rank == 0 else (lambda msg: None)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for op in ops:
        if op not in MEASURABLE_OPS:
            parser.error(f"unknown op {op!r}; choose from {', '.join(MEASURABLE_OPS)}")
    backends = [b.strip() for b in args.backends.split(",")] if args.backends else list(rt.backends)
    for name in backends:
        if name not in rt.backends:
            parser.error(f"backend {name!r} is unavailable here: {rt.unavailable.get(name, 'unknown backend')}")
    order = builtin_order(args.device)
    preferred = [b for b in order if b in backends] + [b for b in backends if b not in order]
    chunks = [cands.parse_bytes(c) for c in args.chunks.split(",") if c.strip()]
    skip = {cands.label(cands.parse_label(c.strip())) for c in args.skip.split(",") if c.strip()}
    dtype = getattr(torch, args.dtype)

    def candidates(op, group):
        """The op's candidates on this group, less --skip and those the runtime would not run as
        named (NCCL on host copies, or where two members share a GPU; a node-aware pair with a
        phase on a backend that cannot run this device's tensors)."""
        # node-aware pairs where the group spans nodes with several ranks on each
        spans = group.shape is not None and group.shape.nodes > 1 and (group.shape.per_node or 1) > 1
        return [
            c
            for c in cands.for_op(op, preferred, chunks, spans, args.device)
            if cands.label(c) not in skip and runs_as_named(rt, cands.run_as(c)[0], op, dtype, group, args.device)
        ]

    group_sizes = [int(g) for g in args.group_sizes.split(",")] if args.group_sizes else [world]
    bad = [g for g in group_sizes if not 2 <= g <= world]
    if bad:
        parser.error(f"group sizes {bad} do not fit a world of {world} ranks (each must be 2..{world})")
    base = powers_of_two(cands.parse_bytes(args.min_bytes), cands.parse_bytes(args.max_bytes))
    extra = {int(cands.parse_bytes(s)) for s in args.sizes.split(",") if s.strip()}
    used = model_sizes(args.sizes_from) if args.sizes_from else {}
    out_path = args.out.format(host=socket.gethostname(), world=world, rank=rank)
    pace = paced(args.pace, rt.shape.nodes)

    log(
        f"mcr.tools.tune: {world} ranks, backends {', '.join(preferred)}, ops {', '.join(ops)}, "
        f"{len(base)} sizes {base[0]} B .. {base[-1]} B, chunks {args.chunks or 'none'}"
        + (", paced" if pace else ", back to back")
        + (f"; {gpu_text(rt, device)}" if device.type == "cuda" else "")
    )
    started, watch = time.perf_counter(), Watch()
    curves = []
    for g in group_sizes:
        group = rt.world if g == world else api.new_group(range(g))
        if group.is_member:
            log(f"group of {g} ranks")
            for op in ops:
                choices = candidates(op, group)
                sizes = sorted(set(base) | extra | used.get(op, set()))
                curves.append(
                    measure_curve(
                        op,
                        sizes,
                        choices,
                        dtype,
                        group,
                        args.iters,
                        args.warmup,
                        args.rounds,
                        args.margin,
                        log,
                        pace,
                        device,
                    )
                )
        api.barrier()
    if group_sizes != [world]:
        curves = share_from_rank0(curves)
    order_by_op = {op: [cands.label(c) for c in candidates(op, rt.world)] for op in ops}
    table = build_table(fingerprint(rt, device=device), curves, args.margin, order_by_op, add_to)
    log(f"measured in {time.perf_counter() - started:.0f} s\n{watch.line()}\n")
    log(summary(table))
    if rank == 0 or "{rank}" in args.out:
        table.save(out_path)
        log(f"\ntable: {out_path}")
        if rank == 0 and not args.no_plots:
            plots, report = write_beside(table, out_path)
            log(f"plots: {os.path.dirname(plots[0]) if plots else '-'}\nreport: {report}")
    if args.predict_world_size:
        predicted = predict_table(table, args.predict_world_size, args.ranks_per_node, args.margin)
        log("\n" + summary(predicted, args.predict_world_size))
    api.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
