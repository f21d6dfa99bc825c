"""Which backend each op gets, and why, before a run: no ranks needed.

    python -m mcr.tools.explain --tuning configs/tuning/vm-n2.yaml --world-size 2 --nodes 1
    python -m mcr.tools.explain --tuning t.yaml --world-size 8 --nodes 2 --ops all_reduce --dtype bfloat16
    python -m mcr.tools.explain --tuning t.yaml --sizes 4,64K,16M --check   # exit 1 if the table has a problem
    python -m mcr.tools.explain --tuning cpu.yaml,cuda.yaml     # a job's table per device: the routes of each

For each op and message size (powers of 4 from 4 B to 64 MiB and the table's own boundaries, or
--sizes) it prints the route the runtime would take for the world group of --world-size ranks
on --nodes nodes: the backend (or candidate: `mpi/chunk=1M`, `node:mpi+gloo`), the chunk size
where the op runs in chunks, and the rule that decided (the table entry and its size range, an
override, the default backend, the built-in order, and any fallback with its reason). The route
comes from `mcr.choose.select_backend`, the function the runtime itself calls, with the same
settings (MCR_BACKEND, MCR_BACKEND_<OP>, MCR_BACKENDS, MCR_TUNING_FILE, MCR_TUNING_PREDICT).

Then it lists the table's problems: gaps (sizes where no entry decides an op, dtype and group
size, so the default rule does), overlaps (entries whose ranges meet: the one with the larger
lower bound shadows the other), and a table measured for another job shape or machine (which
the runtime refuses at start-up unless tuning_predict is set). With a table per device it prints
all of this for each device, from that device's table; --device picks one (or imagines CUDA
tensors under a CPU table, whose routes then say it is for another device).

What it cannot know without starting the backends: which are available on the machine that
will run the job (mpi where mpi4py is installed, gloo, nccl where torch sees a GPU or the job
has CUDA calls; --backends says otherwise), and per-dtype limits of a started backend (CUDA-aware MPI's 16-bit
reductions on GPU); a backend is taken to run every op on its devices.
"""

from __future__ import annotations

import argparse
import sys

import torch

from .. import config as mcr_config
from ..backends import REGISTRY
from ..backends.base import Backend, BackendUnavailable
from ..choose import Call, Policy, entry_text, select_backend, table_rule
from ..ops import OP_FAMILIES
from ..topology import Shape
from ..tuning.candidates import parse_bytes, short_bytes
from ..tuning.model import predict_table  # as mcr.startup.fit_table does with tuning_predict
from ..tuning.table import TuningTable, TuningTableError, TuningTables, load_tables

REDUCING = ("all_reduce", "reduce", "reduce_scatter")
DEFAULT_SIZES = [4**k for k in range(1, 14)]  # 4 B .. 64 MiB


class Declared(Backend):
    """A backend as explain pictures it: there, and able to run every op on its devices."""

    def __init__(self, name: str, devices):
        self.name, self.devices = name, frozenset(devices)


def available_backends(names, device: str):
    """(name -> Declared, name -> why not) for the backends a job here would start."""
    gpu = torch.cuda.is_available() or device == "cuda"
    have, missing = {}, {}
    for name in names:
        try:
            have[name] = Declared(name, REGISTRY[name].cls.expected_devices(gpu))
        except BackendUnavailable as exc:
            missing[name] = str(exc)
    return have, missing


def job_shape(world_size: int, nodes: int) -> Shape:
    """World-size ranks spread over `nodes` nodes in blocks, as a launcher places them."""
    counts = tuple(world_size // nodes + (1 if k < world_size % nodes else 0) for k in range(nodes))
    return Shape(world_size, nodes, counts[0] if len(set(counts)) == 1 else None, counts)


# --- the table's problems ------------------------------------------------------------------------
def gaps(table: TuningTable, op: str, group_size: int, dtype: str, nodes=None) -> list:
    """[(low, high or None)]: the size ranges where the table's own lookup finds no entry for
    this op, dtype and group. The lookup changes only at an entry's bounds, so it is asked once
    per stretch between consecutive bounds."""
    bounds = {0}
    for e in table.entries:
        if e.op == op and e.group_size == group_size:
            bounds.add(e.min_bytes)
            if e.max_bytes is not None:
                bounds.add(e.max_bytes)
    edges = sorted(bounds) + [None]
    out = []
    for low, high in zip(edges, edges[1:]):
        if table.find(op, low, group_size, dtype, nodes) is None:
            if out and out[-1][1] == low:
                out[-1] = (out[-1][0], high)
            else:
                out.append((low, high))
    return out


def overlaps(table: TuningTable) -> list:
    """[(entry, entry)]: entries of one lookup key (op, group size, nodes, dtype) whose ranges
    meet; the lookup takes the one with the larger lower bound (the later one on a tie)."""
    keyed = {}
    for e in table.entries:
        keyed.setdefault((e.op, e.group_size, e.nodes, e.dtype), []).append(e)
    out = []
    for rows in keyed.values():
        rows = sorted(rows, key=lambda e: e.min_bytes)
        for i, a in enumerate(rows):
            for b in rows[i + 1 :]:
                if a.max_bytes is None or b.min_bytes < a.max_bytes:
                    out.append((a, b))
    return out


def _lower(a, b):
    """The lower of two upper bounds, None meaning none."""
    return b if a is None else a if b is None else min(a, b)


def span(low: int, high) -> str:
    return f"[{short_bytes(low)}, {'inf' if high is None else short_bytes(high)})"


def problems(table: TuningTable, ops, dtypes, shape: Shape, hostname=None, check_shape=True) -> list:
    """Lines naming each gap, overlap and (`check_shape`) shape mismatch, for the ops and dtypes asked."""
    out = []
    try:
        if check_shape:  # as mcr.startup.fit_table does without tuning_predict
            table.check_fits(shape.ranks, hostname=hostname, ranks_per_node=shape.per_node, nodes=shape.nodes)
    except TuningTableError as exc:
        out.append(f"another shape: {exc}")
    # the job's world group, and the other group sizes the table has entries for
    groups = {(shape.ranks, shape.nodes)} | {
        (e.group_size, e.nodes) for e in table.entries if e.group_size != shape.ranks
    }
    for op in ops:
        if not any(e.op == op for e in table.entries):
            continue  # not in the table at all: listed once in the header, the default rule decides
        for group_size, nodes in sorted(groups, key=lambda g: (g[0], g[1] or 0)):
            where = f"{group_size} ranks" + (f" on {nodes} node{'s' if nodes > 1 else ''}" if nodes else "")
            for dtype in dtypes:
                for low, high in gaps(table, op, group_size, dtype, nodes):
                    shadowed = [
                        f"{entry_text(table, e)} would cover {span(max(low, e.min_bytes), _lower(high, e.max_bytes))}"
                        for e in table.entries
                        if (e.op, e.group_size) == (op, group_size)
                        and e.dtype in (dtype, "any")
                        and e.nodes in (None, nodes)
                        and (high is None or e.min_bytes < high)
                        and (e.max_bytes is None or low < e.max_bytes)
                    ]
                    hidden = f"; {', '.join(shadowed)} but is shadowed" if shadowed else ""
                    out.append(f"gap: {op} {dtype} at {where}: {span(low, high)} has no entry{hidden}")
    for a, b in overlaps(table):
        high = _lower(a.max_bytes, b.max_bytes)
        out.append(
            f"overlap: {entry_text(table, a)} and {entry_text(table, b)} meet on {span(b.min_bytes, high)}; "
            f"the lookup takes entry {table.position(b)} from {short_bytes(b.min_bytes)} on"
        )
    return out


# --- the routes ----------------------------------------------------------------------------------
def routes(table, policy, backends, unavailable, shape: Shape, ops, dtypes, sizes, device="cpu") -> list:
    """[(op, dtype, size, label, chunk text, rule)] as the runtime's choice gives them;
    `sizes`: op -> message sizes."""
    rows = []
    for op in ops:
        reduce_op = "sum" if op in REDUCING else None
        for dtype in dtypes:
            for size in sizes[op]:
                call = Call(op, size, shape.ranks, shape.nodes, getattr(torch, dtype), device, reduce_op, shape=shape)
                try:
                    picked = select_backend(call, policy, backends, unavailable, lambda c=call: table_rule(table, c))
                except ValueError as exc:
                    rows.append((op, dtype, short_bytes(size), "error", "-", str(exc)))
                    continue
                # Runtime.call runs a chunked route in chunks only when the message is larger than one
                chunk = short_bytes(picked.chunk_bytes) if picked.chunk_bytes and size > picked.chunk_bytes else "-"
                rule = picked.rule
                if table is not None and rule in ("the default backend", "the built-in order"):
                    rule += (
                        " (no table entry here)" if device == table.device else f" (the table is for {table.device})"
                    )
                # a note repeats the rule in brackets for the runtime's one-line warning; not here
                rule += "".join(f"; {note.text.replace(f' ({picked.rule})', '', 1)}" for note in picked.notes)
                rows.append((op, dtype, short_bytes(size), picked.label, chunk, rule))
    return rows


def render(rows, header=("op", "dtype", "size", "backend", "chunk", "rule")) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for r in [header, *rows]:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(r, widths)) + "  " + str(r[-1]))
    return "\n".join(lines)


def explain_device(table, device, shape, policy, backends, unavailable, args, predicted=False) -> list:
    """Print the routes of `device`'s calls under `table` (None: none) and return its problems."""
    dtypes = [d.strip() for d in args.dtype.split(",")]
    in_table = list(dict.fromkeys(e.op for e in table.entries)) if table is not None else []
    ops = (
        [o.strip() for o in args.ops.split(",")] if args.ops else in_table or [f for f in OP_FAMILIES if f != "barrier"]
    )
    # with --predict the job uses the table reshaped, and nothing checks its shape: its gaps count
    found = problems(table, ops, dtypes, shape, args.hostname, not args.predict) if table is not None else []
    if args.sizes:
        sizes = {op: [parse_bytes(s) for s in args.sizes.split(",")] for op in ops}
    else:  # the sweep, and each of the op's table boundaries inside it
        entries = table.entries if table is not None else []
        sizes = {
            op: sorted(
                set(DEFAULT_SIZES)
                | {e.min_bytes for e in entries if e.op == op and DEFAULT_SIZES[0] <= e.min_bytes <= DEFAULT_SIZES[-1]}
            )
            for op in ops
        }
    if table is not None:
        how = "predicted by its model for" if predicted else "measured for"
        print(f"tuning table {table.path}: {how} {table.shape_text()}; {table.fingerprint_text()}")
        absent = [f for f in ops if f not in in_table]
        if absent:
            print(f"not in the table (the default rule decides): {', '.join(absent)}")
    have = ", ".join(backends) or "none"
    missing = "".join(f"; {n} unavailable: {why}" for n, why in unavailable.items())
    print(f"job: {shape} on {device}; backends {have}{missing}\n")
    print(render(routes(table, policy, backends, unavailable, shape, ops, dtypes, sizes, device)))
    print()
    print("\n".join(["problems:", *(f"  {line}" for line in found)]) if found else "problems: none")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mcr.tools.explain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tuning", help="the tuning table, or one per device: cpu.yaml,cuda.yaml (default: MCR_TUNING_FILE)"
    )
    parser.add_argument("--world-size", type=int, help="ranks in the job (default: the table's)")
    parser.add_argument("--nodes", type=int, help="nodes the job spans (default: the table's, else 1)")
    parser.add_argument("--ops", help="comma-separated op families (default: the table's, else all)")
    parser.add_argument("--dtype", default="float32", help="comma-separated dtypes (default float32)")
    parser.add_argument("--sizes", help="comma-separated message sizes, e.g. 4,64K,16M (default: 4 B-64 MiB)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="tensors' device (default: each table's)")
    parser.add_argument("--backends", help="backends the job will have (default: MCR_BACKENDS, where available)")
    parser.add_argument(
        "--predict", action="store_true", help="another world size: use the table through its model (tuning_predict)"
    )
    parser.add_argument("--hostname", help="host the job will run on, for the fingerprint check (default: this one)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the table has a problem")
    args = parser.parse_args(argv)

    cfg = mcr_config.load(**({"tuning": args.tuning} if args.tuning else {}))
    online = cfg.tuning == "auto"
    try:
        loaded = load_tables(cfg.tuning) if cfg.tuning and not online else None  # as mcr.startup.read_table
    except TuningTableError as exc:  # missing, malformed, or two tables for one device
        parser.error(str(exc))
    tables = list(loaded.tables) if isinstance(loaded, TuningTables) else [loaded] if loaded is not None else []
    fp = tables[0].fingerprint if tables else {}
    world_size = args.world_size or fp.get("world_size") or 2
    shape = job_shape(world_size, args.nodes or fp.get("nodes") or 1)
    devices = [args.device] if args.device else [t.device for t in tables] or ["cpu"]
    names = [n.strip() for n in args.backends.split(",") if n.strip()] if args.backends else cfg.backend_names()
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        parser.error(f"unknown backend {', '.join(unknown)}; choose from {', '.join(REGISTRY)}")
    # one job: a GPU for its CUDA calls is there for its CPU calls too
    backends, unavailable = available_backends(names, "cuda" if "cuda" in devices else devices[0])
    dtypes = [d.strip() for d in args.dtype.split(",")]
    asked = [o.strip() for o in args.ops.split(",")] if args.ops else []
    bad = [o for o in asked if o not in OP_FAMILIES] + [
        d for d in dtypes if not isinstance(getattr(torch, d, None), torch.dtype)
    ]
    if bad:
        parser.error(f"unknown op or dtype {', '.join(bad)}; ops: {', '.join(OP_FAMILIES)}")

    # each table with whether --predict reshapes it (as mcr.startup.fit_table does with tuning_predict)
    predicted = [args.predict and t.fingerprint.get("world_size") not in (None, shape.ranks) for t in tables]
    if args.predict:
        tables = [predict_table(t, shape.ranks, shape.per_node, nodes=shape.nodes) for t in tables]
    policy = Policy(cfg.overrides, cfg.backend)

    if online:
        print("tuning: auto; the table is learned during the run, so these are the routes without it")
    elif not tables:
        print("no tuning table")
    found = []
    for k, device in enumerate(devices):
        if k:
            print()
        # one table is shown whatever the device (its routes say when it is for another); of a
        # job's tables per device, the device's own
        mine = [0] if len(tables) == 1 else [i for i, t in enumerate(tables) if t.device == device]
        if not mine and tables:
            print(f"no tuning table for {device} tensors (the tables are for {', '.join(t.device for t in tables)})")
        table, reshaped = (tables[mine[0]], predicted[mine[0]]) if mine else (None, False)
        found += explain_device(table, device, shape, policy, backends, unavailable, args, reshaped)
    return 1 if args.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
