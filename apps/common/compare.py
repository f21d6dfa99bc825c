"""Throughput of one app's preset with gloo only, MPI only and the runtime's own (tuned) choice,
in one invocation, as in the MCR-DL paper's figures.

    python -m apps.common.compare --app moe|dense|dlrm [--config PRESET] -n 2 [--repeats 3] [--tuning FILE] [key=value ...]
    python -m apps.moe.compare ...      # the same, for one app

Each backend choice is a separate job on N local ranks (launch.local) of `python -m apps.<app>`;
runs of the choices alternate, so drift in the machine's load hits every row alike. Each job
writes its summary.json (apps.common.metrics); the table shows the median over the runs of each
choice: throughput in the app's units, the median step split into compute and communication,
the fastest-decile throughput, and the gain of every row over each single-backend row.

An app takes part by being a package `apps/<app>` that trains with `python -m apps.<app>` and
writes the common summary; `apps/<app>/compare.py` may define `APP = App(...)` to give its title
or default preset.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

from launch.options import app_names

from .comm import backend_choices

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Every trainer accepts these; a compare run needs no progress bar, checkpoints or wandb.
QUIET = ("progress=false", "checkpoint.enabled=false", "wandb=disabled")


@dataclass(frozen=True)
class App:
    name: str  # runs `python -m apps.<name>`
    title: str = ""  # the table's heading (default: the name)
    config: str = ""  # default preset (default: configs/<name>/default.yaml)
    quiet: tuple = QUIET  # overrides for a compare run, if the app's keys differ

    @property
    def module(self) -> str:
        return f"apps.{self.name}"

    @property
    def default_config(self) -> str:
        return self.config or os.path.join(REPO, "configs", self.name, "default.yaml")


def find_app(name: str) -> App:
    """The app's own `APP` from apps/<name>/compare.py when it defines one, else the defaults."""
    if name not in app_names():
        raise SystemExit(f"compare: unknown app {name!r}; choose from {', '.join(app_names())}")
    try:
        module = importlib.import_module(f"apps.{name}.compare")
    except ModuleNotFoundError as exc:
        if exc.name != f"apps.{name}.compare":
            raise
        return App(name)
    return getattr(module, "APP", App(name))


def run_one(app: App, choice: str, args, overrides, repeat: int) -> Optional[dict]:
    """One job; its summary, or None when it failed (its error lines are printed)."""
    name = f"compare-{app.name}-{choice}-r{repeat}"
    extra = [f"comm.backend={choice}"]
    if choice == "auto" and args.tuning:
        extra.append(f"comm.tuning={args.tuning}")
    cmd = [sys.executable, "-m", "launch.local", "-n", str(args.nprocs), "--launcher", args.launcher]
    if args.mpiexec_args:
        cmd += ["--mpiexec-args", args.mpiexec_args]
    cmd += ["-m", app.module, "--config", args.config, *overrides, *extra, *app.quiet]
    cmd += [f"out_dir={args.out}", f"name={name}"]
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


def _unit(key: str) -> str:
    return key.removesuffix("_per_s") + "/s"


def table(rows: dict, nprocs: int, preset: str, title: str = "") -> str:
    """rows: choice -> list of summaries (None for a failed run). Each figure is the median over
    the runs of that choice; the gains compare the headline throughput (the summaries'
    `throughput` key: tokens/s for language models, samples/s for DLRM)."""
    ok = {c: [s for s in runs if s] for c, runs in rows.items()}
    first = next((runs[0] for runs in ok.values() if runs), None)
    if first is None:
        return f"{title} throughput: {preset}, {nprocs} ranks: every run failed"
    headline = first["throughput"]
    units = [k for k in first if k.endswith("_per_s") and not k.startswith("p10_")]
    units.sort(key=lambda k: k != headline)  # the headline first

    def median(runs, key):
        values = [s[key] for s in runs if s.get(key) is not None]
        return statistics.median(values) if values else None

    numeric = [k for k, v in first.items() if isinstance(v, (int, float)) or v is None]
    med = {c: {k: median(runs, k) for k in numeric} for c, runs in ok.items() if runs}
    singles = [c for c in med if c != "auto"]  # every single-backend row, in the order run
    cols = [(_unit(k), k, 12, ",.0f" if k == "tokens_per_s" else ",.1f") for k in units]
    cols += [("step ms", "median_step_ms", 9, ".1f"), ("compute", "compute_ms", 9, ".1f")]
    cols += [("comm", "comm_ms", 8, ".1f"), ("p10 " + _unit(headline), "p10_" + headline, 15, ",.0f")]
    header = f"{'backend':<9}" + "".join(f"{label:>{w}}" for label, _, w, _ in cols)
    header += "".join(f"{'vs ' + c:>9}" for c in singles)
    runs_per = max(len(r) for r in rows.values())
    lines = [
        f"{title or 'app'} throughput: {preset}, {nprocs} ranks, {runs_per} run(s) per backend "
        "(median step; compute + comm = step ms; p10 = fastest-decile step)",
        header,
        "-" * len(header),
    ]
    for choice in rows:
        if choice not in med:
            lines.append(f"{choice:<9}{'failed':>12}")
            continue
        m = med[choice]
        line = f"{choice:<9}" + "".join(
            f"{'-':>{w}}" if m[key] is None else f"{m[key]:>{w}{fmt}}" for _, key, w, fmt in cols
        )
        line += "".join(f"{(m[headline] / med[c][headline] - 1) * 100:>+8.1f}%" for c in singles)
        lines.append(line)
    return "\n".join(lines)


def main(argv=None, app: Optional[App] = None) -> int:
    """`app` given: that app's compare (`--app` not accepted); else `--app NAME` picks one."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if app is None:
        parser.add_argument("--app", required=True, help=f"one of {', '.join(app_names())}")
    parser.add_argument("--config", default=None, help="preset (default: configs/<app>/default.yaml)")
    parser.add_argument("-n", "--nprocs", type=int, default=2)
    parser.add_argument("--launcher", choices=("mpiexec", "torchrun"), default="mpiexec")
    parser.add_argument(
        "--mpiexec-args",
        default="",
        help="more mpiexec options for each job, e.g. '--host node1:1,node2:1' (launch.local)",
    )
    parser.add_argument("--backends", default="gloo,mpi,auto", help="comma list of auto and backends (mcr.backends)")
    parser.add_argument("--tuning", default=None, help="tuning table for the auto row")
    parser.add_argument("--repeats", type=int, default=1, help="runs per backend, alternated (noisy machines)")
    parser.add_argument("--out", default=os.path.join(REPO, "runs", "compare"))
    args, overrides = parser.parse_known_args(argv)
    app = app or find_app(args.app)
    args.config = args.config or app.default_config
    choices = args.backends.split(",")
    bad = [c for c in choices if c not in backend_choices()]
    if bad:
        parser.error(f"--backends: unknown {', '.join(bad)}; choose from {', '.join(backend_choices())}")
    rows = {c: [] for c in choices}
    for repeat in range(args.repeats):
        for choice in choices:  # alternated, so drift in machine load hits every row alike
            rows[choice].append(run_one(app, choice, args, overrides, repeat))
    text = table(rows, args.nprocs, os.path.basename(args.config), app.title or app.name)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"compare-{app.name}.txt"), "w") as f:
        f.write(text + "\n")
    return 0 if all(any(runs) for runs in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
