"""What mcr adds to an NCCL all-reduce at world size 1, against torch's own (issue 49): host
time per call, from the call to its return, in one process.

    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_cost               # on a GPU (make gpu-check runs it)
    python -m launch.local -n 1 -m tests.gpu.scripts.nccl_cost --device cpu  # gloo stands in: the logic only

Three paths, each blocking and as async+wait (`.wait()` on what the async call returned), on a
float32 tensor of 1 KiB, 1 MiB and 64 MiB:

    torch        dist.all_reduce on torch's own ProcessGroupNCCL (dist.new_group(backend="nccl"))
    mcr          mcr.all_reduce, the runtime's choice (it must be NCCL)
    dist on mcr  dist.all_reduce on backend "mcr" (torch's default group here)

A round times every path and way of a size with `mcr.measure.time_call` (the median of N calls'
host times, as bench_hooks times its rows), every other round in reverse order (as
`mcr.measure.compare` interleaves): a burst of load falls on all of them alike. A figure is the
median over the rounds, its spread the lowest and highest round; "mcr - torch" is the median of
the per-round differences. At one rank an in-place all-reduce enqueues no GPU work, so every
size times the host path alone.

Twice, each with a fresh runtime and torch group in this process: mcr's flight recorder and
comm log off (flight_recorder=0, comm_log=False), then the runtime's defaults (as this
environment's MCR_* leave them; the table says which). The goals of issue 49 stand beside the
figures: blocking mcr.all_reduce within 5 µs of torch's with the recorder and comm log off and
within 10 µs with the defaults; async+wait within 10 µs with the defaults. A goal is met when
the worst size's median difference is within it.

Prints one table and a last line `nccl cost (...): ...` (each goal's worst figure and verdict;
`make gpu-check` quotes it), writes the figures as JSON (--json), and exits 0 once measured, goals met
or not. Where torch sees no GPU it says so and exits 0, measuring nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

import mcr
from mcr.hooks import torch_backend
from mcr.measure import time_call
from mcr.tools.machine import Watch

SIZES = (1 << 10, 1 << 20, 64 << 20)
PATHS = ("torch", "mcr", "dist on mcr")
WAYS = ("blocking", "async+wait")
CONFIGS = (("off", {"flight_recorder": 0, "comm_log": False}), ("defaults", {}))
GOALS = (("off", "blocking", 5.0), ("defaults", "blocking", 10.0), ("defaults", "async+wait", 10.0))  # µs


@dataclass(frozen=True)
class Figure:
    """µs: the median over rounds, and the lowest and highest round."""

    median: float
    low: float
    high: float


def figure(per_round) -> Figure:
    return Figure(statistics.median(per_round), min(per_round), max(per_round))


def difference(mine, theirs) -> Figure:
    """Round by round: each round's two figures were taken under the same load."""
    return figure([a - b for a, b in zip(mine, theirs, strict=True)])


def summarize(config: str, nbytes: int, way: str, per_round: dict) -> dict:
    """One row: each path's Figure and mcr's and dist-on-mcr's over torch; `per_round` is
    {path: [µs per call, one per round]}."""
    row = {"config": config, "bytes": nbytes, "way": way}
    row.update({path: figure(per_round[path]) for path in PATHS})
    row["mcr - torch"] = difference(per_round["mcr"], per_round["torch"])
    row["dist on mcr - torch"] = difference(per_round["dist on mcr"], per_round["torch"])
    row["per round"] = {path: list(per_round[path]) for path in PATHS}  # for the JSON
    return row


@dataclass(frozen=True)
class Verdict:
    config: str
    way: str
    goal: float  # µs over torch
    worst: float  # the largest median difference over the sizes
    at_bytes: int
    met: bool


def verdicts(rows) -> list:
    out = []
    for config, way, goal in GOALS:
        mine = [row for row in rows if (row["config"], row["way"]) == (config, way)]
        if mine:
            worst = max(mine, key=lambda row: row["mcr - torch"].median)
            over = worst["mcr - torch"].median
            out.append(Verdict(config, way, goal, over, worst["bytes"], over <= goal))
    return out


def size_name(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def table(rows, found, heading: str) -> str:
    def cell(f: Figure) -> str:
        return f"{f.median:7.1f} ({f.low:.1f}-{f.high:.1f})"

    goal_of = {(c, w): g for c, w, g in GOALS}
    verdict_of = {(v.config, v.way): v for v in found}
    header = f"{'config':<9}{'size':>7}  {'way':<11}{'torch':>21}{'mcr':>21}{'dist on mcr':>21}"
    header += f"{'mcr-torch':>11}{'dist-torch':>11}{'goal':>6}  verdict"
    lines = [heading, header, "-" * len(header)]
    for row in rows:
        goal = goal_of.get((row["config"], row["way"]))
        verdict = verdict_of.get((row["config"], row["way"]))
        said = ""
        if goal is not None:
            said = "met" if row["mcr - torch"].median <= goal else "MISSED"
            said += " (worst size)" if verdict and verdict.at_bytes == row["bytes"] else ""
        line = f"{row['config']:<9}{size_name(row['bytes']):>7}  {row['way']:<11}"
        line += "".join(f"{cell(row[path]):>21}" for path in PATHS)
        line += f"{row['mcr - torch'].median:>+11.1f}{row['dist on mcr - torch'].median:>+11.1f}"
        line += f"{'-' if goal is None else f'{goal:g}':>6}  {said}"
        lines.append(line.rstrip())
    return "\n".join(lines)


def last_line(found) -> str:
    """Each goal's worst figure and verdict, the part after the colon short enough for gpu-check's
    summary line."""
    names = {("off", "blocking"): "blocking off", ("defaults", "blocking"): "blocking"}
    names[("defaults", "async+wait")] = "async+wait"
    said = [f"{names[v.config, v.way]} {v.worst:+.1f}/{v.goal:g} {'met' if v.met else 'MISSED'}" for v in found]
    return "nccl cost (mcr over torch, worst size, us/goal): " + ", ".join(said)


# --- measuring (on a GPU, or with --device cpu on gloo) ------------------------------------------
def interleaved(rt, calls: dict, rounds: int, per_round: int, sync) -> dict:
    """{key: [µs per call, one per round]} for each call in `calls`, in interleaved rounds; round
    0 warms every call up and is not kept."""
    keys, kept = list(calls), {key: [] for key in calls}
    for r in range(rounds + 1):
        for key in keys if r % 2 == 0 else reversed(keys):
            sync()  # what the last path queued on the GPU is not this one's
            seconds = time_call(rt, calls[key], per_round, warmup=20 if r == 0 else 2)
            if r:
                kept[key].append(seconds * 1e6)
    return kept


def measure(config: str, settings: dict, cuda: bool, rounds: int, per_round: int) -> tuple:
    """(rows, what the runtime ran with) for one runtime config."""
    torch_backend.init_process_group(**settings)  # the runtime, and torch's default group on "mcr"
    rt = mcr.runtime()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")  # as mcr bound it
    reference = dist.new_group(backend="nccl" if cuda else "gloo")  # torch's own
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for nbytes in SIZES:
        x = torch.ones(nbytes // 4, device=device)
        chosen = rt.router.choose("all_reduce", x.nbytes, rt.world, x.dtype, device.type)[0].name
        if cuda and chosen != "nccl":
            raise SystemExit(
                f"nccl cost: the runtime chose {chosen} for a {size_name(nbytes)} CUDA all-reduce, not nccl"
            )
        calls = {
            ("torch", "blocking"): lambda x=x: dist.all_reduce(x, group=reference),
            ("torch", "async+wait"): lambda x=x: dist.all_reduce(x, group=reference, async_op=True).wait(),
            ("mcr", "blocking"): lambda x=x: mcr.all_reduce(x),
            ("mcr", "async+wait"): lambda x=x: mcr.all_reduce(x, async_op=True).wait(),
            ("dist on mcr", "blocking"): lambda x=x: dist.all_reduce(x),
            ("dist on mcr", "async+wait"): lambda x=x: dist.all_reduce(x, async_op=True).wait(),
        }
        kept = interleaved(rt, calls, rounds, per_round, sync)
        for way in WAYS:
            rows.append(summarize(config, nbytes, way, {path: kept[path, way] for path in PATHS}))
    ran = {"flight_recorder": rt.cfg.flight_recorder, "comm_log": rt.cfg.comm_log, "mcr chose": chosen}
    dist.destroy_process_group()  # every group; the default one finalizes the runtime it started
    return rows, ran


def about(cuda: bool) -> dict:
    found = {"torch": torch.__version__}
    if cuda:
        found["NCCL"] = ".".join(map(str, torch.cuda.nccl.version()))
        found["GPU"] = torch.cuda.get_device_name()
    else:
        found["device"] = "cpu, gloo for NCCL"
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo stands in for NCCL")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds kept (after one to warm up)")
    parser.add_argument("--calls", type=int, default=200, help="calls per path and round (their median is timed)")
    stamp = time.strftime("%Y-%m-%d-%H%M%S")
    parser.add_argument("--json", default=os.path.join("runs", "gpu-check", f"nccl-cost-{stamp}.json"))
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        print(f"nccl cost: no GPU here (torch {torch.__version__}, {build}): nothing measured", flush=True)
        return 0
    watch = Watch()
    rows, ran = [], {}
    for config, settings in CONFIGS:
        config_rows, ran[config] = measure(config, settings, cuda, args.rounds, args.calls)
        rows += config_rows
    found = verdicts(rows)
    facts = about(cuda)
    heading = (
        f"# nccl cost: host µs per all_reduce at world size 1 ({', '.join(f'{k} {v}' for k, v in facts.items())}); "
        f"median of {args.rounds} interleaved rounds (lowest-highest round), each the median of {args.calls} calls; "
        f"mcr-torch: median of the per-round differences; "
        + "; ".join(f"{c}: recorder {r['flight_recorder']}, comm log {r['comm_log']}" for c, r in ran.items())
    )
    print(table(rows, found, heading), flush=True)
    print(watch.line(), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        record = {"about": facts, "rounds": args.rounds, "calls": args.calls, "runtime": ran, "machine": watch.line()}
        record.update(rows=[{k: asdict(v) if isinstance(v, Figure) else v for k, v in row.items()} for row in rows])
        record.update(goals=[asdict(v) for v in found])
        json.dump(record, f, indent=1)
    print(f"figures: {args.json}", flush=True)
    print(last_line(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
