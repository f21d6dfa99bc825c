"""Throughput of one preset with gloo only, MPI only and the runtime's own (tuned) choice, in
one invocation, as in the MCR-DL paper's DS-MoE figure.

    python -m apps.moe.compare --config configs/moe/default.yaml -n 2 [--tuning FILE] [key=value ...]

Each backend choice is a separate job on N local ranks (launch.local); each writes its
summary.json, and the table compares median-step throughput, with the gain of every row
over each single-backend row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHOICES = {"gloo": ["comm.backend=gloo"], "mpi": ["comm.backend=mpi"], "auto": ["comm.backend=auto"]}
SINGLE = ("gloo", "mpi")


def run_one(choice, args, overrides, repeat):
    name = f"compare-{choice}-r{repeat}"
    extra = list(CHOICES[choice])
    if choice == "auto" and args.tuning:
        extra.append(f"comm.tuning={args.tuning}")
    cmd = [
        sys.executable,
        "-m",
        "launch.local",
        "-n",
        str(args.nprocs),
        "--launcher",
        args.launcher,
        "-m",
        "apps.moe",
        "--config",
        args.config,
        *overrides,
        *extra,
        f"out_dir={args.out}",
        f"name={name}",
        "progress=false",
        "checkpoint.enabled=false",
        "wandb=disabled",
    ]
    print(f"compare: {choice} (run {repeat + 1}/{args.repeats}): {' '.join(cmd[1:])}", flush=True)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        lines = proc.stdout.strip().splitlines()
        tail = "\n".join([line for line in lines if "error" in line.lower()][:3] or lines[-5:])
        print(f"compare: {choice} failed (exit {proc.returncode}):\n{tail}", flush=True)
        return None
    with open(os.path.join(args.out, name, "summary.json")) as f:
        return json.load(f)


def table(rows: dict, nprocs: int, preset: str) -> str:
    """rows: choice -> list of summaries (None for a failed run). Each figure is the median
    over the runs of that choice; the gains compare median-step throughput."""
    ok = {c: [s for s in runs if s] for c, runs in rows.items()}
    med = {
        c: {
            k: statistics.median(s[k] for s in runs)
            for k in ("tokens_per_s", "samples_per_s", "median_step_ms", "p10_tokens_per_s")
        }
        for c, runs in ok.items()
        if runs
    }
    singles = [c for c in SINGLE if c in med]
    header = f"{'backend':<10}{'tokens/s':>10}{'samples/s':>11}{'step ms':>9}{'comm ms':>9}{'p10 tok/s':>11}" + "".join(
        f"{'vs ' + c:>9}" for c in singles
    )
    runs_per = max(len(r) for r in rows.values())
    lines = [
        f"DS-MoE throughput: {preset}, {nprocs} ranks, {runs_per} run(s) per backend "
        "(median step time; p10 = fastest-decile step)",
        header,
        "-" * len(header),
    ]
    for choice in rows:
        if choice not in med:
            lines.append(f"{choice:<10}{'failed':>10}")
            continue
        m = med[choice]
        comm = [s["comm_ms"] for s in ok[choice] if s.get("comm_ms") is not None]
        comm_txt = f"{statistics.median(comm):>9.1f}" if comm else f"{'-':>9}"
        gains = "".join(f"{(m['tokens_per_s'] / med[c]['tokens_per_s'] - 1) * 100:>+8.1f}%" for c in singles)
        lines.append(
            f"{choice:<10}{m['tokens_per_s']:>10,.0f}{m['samples_per_s']:>11,.1f}{m['median_step_ms']:>9.1f}"
            f"{comm_txt}{m['p10_tokens_per_s']:>11,.0f}{gains}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "moe", "default.yaml"))
    parser.add_argument("-n", "--nprocs", type=int, default=2)
    parser.add_argument("--launcher", choices=("mpiexec", "torchrun"), default="mpiexec")
    parser.add_argument("--backends", default="gloo,mpi,auto", help="comma list of gloo, mpi, auto")
    parser.add_argument("--tuning", default=None, help="tuning table for the auto row")
    parser.add_argument("--repeats", type=int, default=1, help="runs per backend, interleaved (noisy machines)")
    parser.add_argument("--out", default=os.path.join(REPO, "runs", "compare"))
    args, overrides = parser.parse_known_args(argv)
    choices = args.backends.split(",")
    bad = [c for c in choices if c not in CHOICES]
    if bad:
        parser.error(f"--backends: unknown {', '.join(bad)}; choose from {', '.join(CHOICES)}")
    rows = {c: [] for c in choices}
    for repeat in range(args.repeats):
        for choice in choices:  # interleaved, so drift in machine load hits every row alike
            rows[choice].append(run_one(choice, args, overrides, repeat))
    text = table(rows, args.nprocs, os.path.basename(args.config))
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compare.txt"), "w") as f:
        f.write(text + "\n")
    return 0 if all(any(runs) for runs in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
