"""Reproduce throughput across node counts and backends: one batch job per (nodes, backend).

    python -m launch sweep --system local --app moe --nodes 1 --backends gloo,mpi,auto \\
        -- --config configs/moe/tiny.yaml train.steps=20

Submits the jobs, as many at once as each queue takes from one user (a system's `queues`:
Polaris' debug-scaling holds one) and `--max-jobs` allows, waits for them with a deadline (jobs
still queued or running then are cancelled, later ones are not submitted), gathers each run's summary.json into one table (sweep.txt, sweep.json) and a PNG
(throughput, and the gain over each single backend, against node count, like the MCR-DL
paper's figures), and names every failed job with its log. A refused submit cancels the jobs
the sweep had submitted and says which it cancelled and which it could not. `--dry-run` writes
every job script and submits none.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from launch.options import add_job_options, check_app, job_system, new_job_dir, parse_nodes, shown, split_argv
from launch.scripts import SCHEDULER_LOG, Job, write_script
from launch.submit import SubmitError, cancel_command, job_state, submit
from launch.systems import LaunchError, parse_time, queue_for


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
            why = f"job {r['job_id']}, {r['state']}; log {r['log']}" if r["job_id"] else r["state"]
            lines.append(f"{head}{'failed':>12}  ({why})")
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
    parser.add_argument(
        "--max-jobs",
        type=int,
        default=0,
        help="at most this many of the sweep's jobs queued or running at once (default 0: only the queues' limits)",
    )
    parser.add_argument("--dry-run", action="store_true", help="write every job script, submit none")
    args = parser.parse_args(own)
    nodes = parse_nodes(args.nodes)
    backends = check_backends(args.backends.split(","))
    app = check_app(args.app)
    system = job_system(args)
    seconds, deadline = parse_time(args.time), parse_time(args.deadline)
    rules = {n: queue_for(system, n, seconds) for n in nodes}  # a node count no queue takes: refused here

    sweep_dir = new_job_dir(os.path.abspath(args.out), f"sweep-{app}-{system.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    rows = []
    for n in nodes:
        for backend in backends:
            job_dir = os.path.join(sweep_dir, f"{n}n-{backend}")
            job = Job(
                system, n, seconds, job_dir, f"{app}-{n}n-{backend}", app, [*trainer_args, f"comm.backend={backend}"]
            )
            rule = rules[n]
            rows.append(
                {
                    "nodes": n,
                    "ranks": job.ranks,
                    "backend": backend,
                    "queue": rule.name if rule else system.queue,
                    "jobs_per_user": rule.jobs_per_user if rule else 0,
                    "script": write_script(job),
                    "job_id": None,
                    "state": "not submitted",
                    "log": None,
                    "run_dir": None,
                }
            )
    if args.dry_run:
        for r in rows:
            queue = f"queue {r['queue']}" if r["queue"] else "the default queue"
            print(f"sweep: {r['nodes']} node(s) x {r['backend']} ({queue}): {shown(r['script'])}")
        print(f"sweep: wrote {len(rows)} job scripts in {shown(sweep_dir)} (not submitted)")
        return 0
    print(f"sweep: {len(rows)} jobs (deadline {args.deadline}) in {sweep_dir}", flush=True)
    try:
        run_in_turn(system.scheduler, rows, app, deadline, args.max_jobs)
    except SubmitError as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        print(f"sweep: {cancel_submitted(system.scheduler, rows)}", file=sys.stderr)
        return 2
    for r in rows:
        if r["job_id"] is not None and r["state"] in ("PENDING", "RUNNING"):
            subprocess.run(cancel_command(system.scheduler, r["job_id"]), capture_output=True)
            r["state"] += ", cancelled at the deadline"
        elif r["job_id"] is None:
            r["state"] = "not submitted before the deadline"
        path = os.path.join(r["run_dir"] or sweep_dir, "summary.json")
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


def run_in_turn(scheduler: str, rows: list[dict], app: str, deadline_s: float, max_jobs: int = 0, poll_s=2.0):
    """Submit each row's script once its queue has room, and follow the jobs until all have ended
    or the deadline passes. Room: fewer of the sweep's live jobs in the row's queue than the queue's
    `jobs_per_user` (Polaris' debug-scaling holds one), and fewer live jobs in all than `max_jobs`
    (0: no such limit). A refused submit raises SubmitError; the rows say which jobs were submitted."""
    end = time.monotonic() + deadline_s
    waiting, live = list(rows), []
    while True:
        for r in list(waiting):
            in_queue = sum(1 for other in live if other["queue"] == r["queue"])
            if (r["jobs_per_user"] and in_queue >= r["jobs_per_user"]) or (max_jobs and len(live) >= max_jobs):
                continue
            job_dir = os.path.dirname(r["script"])
            try:
                r["job_id"] = submit(scheduler, r["script"], cwd=job_dir)
            except SubmitError as exc:
                raise SubmitError(f"the job for {r['nodes']} node(s) x {r['backend']} was refused: {exc}") from None
            r["state"] = "PENDING"
            log = SCHEDULER_LOG[scheduler].replace("%j", r["job_id"]).replace("%J", r["job_id"])
            r["log"], r["run_dir"] = os.path.join(job_dir, log), os.path.join(job_dir, f"{app}-{r['job_id']}")
            waiting.remove(r)
            live.append(r)
            print(f"sweep: {r['nodes']} node(s) x {r['backend']}: job {r['job_id']}", flush=True)
        for r in list(live):
            state = job_state(scheduler, r["job_id"])
            if state is not None:  # no answer: ask again at the next poll
                r["state"] = state
            if r["state"] not in ("PENDING", "RUNNING"):
                live.remove(r)
        if not (waiting or live) or time.monotonic() > end:
            return
        time.sleep(poll_s)


def cancel_submitted(scheduler: str, rows: list[dict]) -> str:
    """Cancel the sweep's jobs that may still be queued or running; say which were cancelled,
    which had ended, and which could not be cancelled (with the command to do it by hand)."""
    cancelled, ended, left = [], [], []
    for r in rows:
        if r["job_id"] is None:
            continue
        name = f"{r['job_id']} ({r['nodes']} node(s) x {r['backend']})"
        if r["state"] not in ("PENDING", "RUNNING"):
            ended.append(f"{name}: {r['state']}")
            continue
        cmd = cancel_command(scheduler, r["job_id"])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            cancelled.append(name)
        elif (state := job_state(scheduler, r["job_id"])) not in (None, "PENDING", "RUNNING"):
            ended.append(f"{name}: {state}")  # it ended between the last look and the cancel
        else:
            left.append(f"{name} may still run: `{' '.join(cmd)}` said {(proc.stderr or proc.stdout).strip()!r}")
    parts = [f"cancelled {', '.join(cancelled)}" if cancelled else "no job of this sweep was queued or running"]
    parts += [f"ended before: {', '.join(ended)}"] if ended else []
    parts += [f"NOT cancelled: {'; '.join(left)}"] if left else []
    return "; ".join(parts)
