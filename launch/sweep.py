"""Reproduce throughput across node counts and backends: one batch job per (nodes, backend).

    python -m launch sweep --system local --app moe --nodes 1 --backends gloo,mpi,auto \\
        -- --config configs/moe/tiny.yaml train.steps=20

Submits every job, waits for them with a deadline (jobs still queued or running then are
cancelled), gathers each run's summary.json into one table (sweep.txt, sweep.json) and a PNG
(throughput, and the gain over each single backend, against node count, like the MCR-DL
paper's figures), and names every failed job with its log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

from launch.options import add_job_options, check_app, job_system, new_job_dir, parse_nodes, split_argv
from launch.scripts import SCHEDULER_LOG, Job, write_script
from launch.submit import cancel_command, submit, wait
from launch.systems import LaunchError, parse_time


def single_backends(backends) -> list:
    """The rows' single backends (all but auto), in the order given: the gains compare every row with these."""
    return [b for b in dict.fromkeys(backends) if b != "auto"]


def check_backends(backends: list) -> list:
    """Each is auto or a backend mcr registers (mcr.backends). Imported here only: the rest of
    launch/ stays free of torch, and the machine that submits has mcr installed for the jobs."""
    from mcr.backends import names

    choices = ("auto", *names())
    bad = [b for b in backends if b not in choices]
    if bad:
        raise LaunchError(f"--backends: unknown {', '.join(bad)}; choose from {', '.join(choices)}")
    return backends


def throughput_key(rows: list[dict]) -> str:
    """The trainers' headline unit (summary["throughput"]: tokens_per_s for the GPTs, samples_per_s for DLRM)."""
    done = [r["summary"] for r in rows if r["summary"]]
    return done[0].get("throughput", "samples_per_s") if done else "samples_per_s"


def table(rows: list[dict]) -> str:
    """rows: {nodes, ranks, backend, summary or None, ...}, in submission order."""
    key = throughput_key(rows)
    ok = {(r["nodes"], r["backend"]): r["summary"] for r in rows if r["summary"]}
    singles = single_backends(b for _, b in ok)
    header = f"{'nodes':>5}{'ranks':>6}  {'backend':<8}{key.replace('_per_s', '/s'):>12}{'step ms':>9}{'comm ms':>9}"
    header += "".join(f"{'vs ' + b:>9}" for b in singles)
    lines = [header, "-" * len(header)]
    for r in rows:
        head = f"{r['nodes']:>5}{r['ranks']:>6}  {r['backend']:<8}"
        s = r["summary"]
        if not s:
            lines.append(f"{head}{'failed':>12}  (job {r['job_id']}, {r['state']}; log {r['log']})")
            continue
        comm = f"{s['comm_ms']:>9.1f}" if s.get("comm_ms") is not None else f"{'-':>9}"
        gains = ""
        for b in singles:
            base = ok.get((r["nodes"], b))
            gains += f"{(s[key] / base[key] - 1) * 100:>+8.1f}%" if base else f"{'-':>9}"
        lines.append(f"{head}{s[key]:>12,.1f}{s['median_step_ms']:>9.1f}{comm}{gains}")
    return "\n".join(lines)


def plot(rows: list[dict], title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = throughput_key(rows)
    ok = {(r["nodes"], r["backend"]): r["summary"][key] for r in rows if r["summary"]}
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    singles = single_backends(backends)
    fig, axes = plt.subplots(1, 1 + len(singles), figsize=(5 * (1 + len(singles)), 4), squeeze=False)
    for b in backends:
        points = sorted((n, tps) for (n, bb), tps in ok.items() if bb == b)
        if points:
            axes[0][0].plot(*zip(*points), marker="o", label=b)
        for ax, base in zip(axes[0][1:], singles):
            gains = sorted(
                (n, (tps / ok[(n, base)] - 1) * 100) for (n, bb), tps in ok.items() if bb == b and (n, base) in ok
            )
            if gains and b != base:
                ax.plot(*zip(*gains), marker="o", label=b)
    axes[0][0].set(xlabel="nodes", ylabel=key.replace("_per_s", "/s"), title=title)
    for ax, base in zip(axes[0][1:], singles):
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(xlabel="nodes", ylabel=f"gain over {base} (%)", title=f"vs {base} only")
    for ax in axes[0]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def sweep_main(argv: list[str]) -> int:
    own, trainer_args = split_argv(argv)
    parser = argparse.ArgumentParser(
        prog="python -m launch sweep",
        usage="python -m launch sweep --system S --app APP --nodes 1,2,4 [--backends gloo,mpi,auto] -- [trainer args]",
    )
    add_job_options(parser, "node counts, e.g. 1,2,4")
    parser.add_argument("--app", required=True, help="a trainer in apps/ (moe, dense, dlrm)")
    parser.add_argument(
        "--backends",
        default="gloo,mpi,auto",
        help="comm.backend of each job: auto or a backend (gloo, mpi, nccl: mcr.backends)",
    )
    parser.add_argument("--deadline", default="1:00:00", help="stop waiting after this long, h:mm:ss")
    args = parser.parse_args(own)
    nodes = parse_nodes(args.nodes)
    backends = check_backends(args.backends.split(","))
    app = check_app(args.app)
    system = job_system(args)
    seconds, deadline = parse_time(args.time), parse_time(args.deadline)

    sweep_dir = new_job_dir(os.path.abspath(args.out), f"sweep-{app}-{system.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    rows = []
    for n in nodes:
        for backend in backends:
            job_dir = os.path.join(sweep_dir, f"{n}n-{backend}")
            job = Job(
                system, n, seconds, job_dir, f"{app}-{n}n-{backend}", app, [*trainer_args, f"comm.backend={backend}"]
            )
            job_id = submit(system.scheduler, write_script(job), cwd=job_dir)
            log = os.path.join(job_dir, SCHEDULER_LOG[system.scheduler].replace("%j", job_id).replace("%J", job_id))
            rows.append({"nodes": n, "ranks": job.ranks, "backend": backend, "job_id": job_id, "log": log})
            rows[-1]["run_dir"] = os.path.join(job_dir, f"{app}-{job_id}")
            print(f"sweep: {n} node(s) x {backend}: job {job_id}", flush=True)
    print(f"sweep: waiting for {len(rows)} jobs (deadline {args.deadline}) in {sweep_dir}", flush=True)
    states = wait(system.scheduler, [r["job_id"] for r in rows], deadline)
    for r in rows:
        r["state"] = states[r["job_id"]]
        if r["state"] in ("PENDING", "RUNNING"):
            subprocess.run(cancel_command(system.scheduler, r["job_id"]), capture_output=True)
            r["state"] += ", cancelled at the deadline"
        path = os.path.join(r["run_dir"], "summary.json")
        r["summary"] = json.load(open(path)) if r["state"] in ("DONE", "GONE") and os.path.exists(path) else None

    title = f"{app} on {system.name}"
    text = f"{title}: throughput by node count and backend (median step)\n{table(rows)}"
    with open(os.path.join(sweep_dir, "sweep.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(sweep_dir, "sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(text)
    if any(r["summary"] for r in rows):
        plot(rows, title, os.path.join(sweep_dir, "sweep.png"))
    failed = [r for r in rows if not r["summary"]]
    for r in failed:
        print(f"sweep: job {r['job_id']} ({r['nodes']} node(s), {r['backend']}) failed: {r['state']}; log {r['log']}")
    print(f"sweep: table and plot in {sweep_dir} (sweep.txt, sweep.json, sweep.png)")
    return 1 if failed else 0
