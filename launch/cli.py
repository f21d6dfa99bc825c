"""Batch jobs for the trainers on a described system.

    python -m launch submit --system local --nodes 1 -- moe --config configs/moe/tiny.yaml train.steps=20
    python -m launch script --system lassen --nodes 4 --time 1:00:00 --account mybank -- moe
    python -m launch submit --system local --nodes 1 --resume runs/<job dir>/moe-<id> -- moe
    python -m launch sweep --system local --app moe --nodes 1 --backends gloo,mpi,auto -- --config ...
    python -m launch preflight --system polaris --nodes 2 --account MyProject --submit

`submit` writes runs/<app>-<system>-<N>n-<time>/job.sh, shows it, submits it (sbatch, bsub or
qsub) unless --dry-run, and prints the job id and where the log and the run dir (metrics,
summary.json) land; `script` only writes it. `--resume RUN_DIR` continues a run that ended early
(a killed or timed-out job) from the last checkpoint its `latest` names, in that run dir, with
`resume=true`, and with the settings saved in it unless trainer args are given. `sweep`: see
launch/sweep.py; `preflight`: launch/preflight.py; the options they share are in launch/options.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from launch.options import add_job_options, check_app, job_system, new_job_dir, parse_nodes, shown, split_argv
from launch.preflight import preflight_main
from launch.scripts import SCHEDULER_LOG, Job, write_script
from launch.submit import SubmitError, submit
from launch.sweep import sweep_main
from launch.systems import LaunchError, parse_time, queue_for


def check_resume_dir(path: str, app: str) -> str:
    """An earlier job's run dir (<job dir>/<app>-<job id>) holding a complete checkpoint."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise LaunchError(f"--resume {path}: no such run dir; give an earlier job's <job dir>/{app}-<job id>")
    if not os.path.basename(path).startswith(f"{app}-"):
        raise LaunchError(f"--resume {path}: not a run of {app} (its run dirs are named {app}-<job id>)")
    if not os.path.isfile(os.path.join(path, "checkpoints", "latest")):
        raise LaunchError(f"--resume {path}: no checkpoints/latest there, so nothing to resume; submit a new run")
    return path


def submit_main(command: str, argv: list[str]) -> int:
    own, rest = split_argv(argv)
    parser = argparse.ArgumentParser(
        prog=f"python -m launch {command}",
        usage=f"python -m launch {command} --system S --nodes N [options] -- <app> [trainer args]",
    )
    add_job_options(parser, "node count")
    if command == "submit":
        parser.add_argument("--dry-run", action="store_true", help="write and show the script, do not submit it")
    parser.add_argument("--quiet", action="store_true", help="do not show the script")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue this earlier run from its last checkpoint")
    args = parser.parse_args(own)
    if not rest:
        parser.error("name the app after --, e.g. -- moe --config configs/moe/tiny.yaml")
    nodes = parse_nodes(args.nodes)
    if len(nodes) != 1:
        parser.error("--nodes: one count for a job (sweep takes several)")
    nodes = nodes[0]
    system = job_system(args)
    app = check_app(rest[0])
    resume_dir = check_resume_dir(args.resume, app) if args.resume else ""
    seconds = parse_time(args.time)
    rule = queue_for(system, nodes, seconds)  # before anything is written: a job no queue takes is refused
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{app}-{system.name}-{nodes}n"
    job_dir = new_job_dir(os.path.abspath(args.out), f"{name}-{stamp}")
    trainer_args = rest[1:]
    if resume_dir and not trainer_args:  # the settings the run started with, saved in its run dir
        trainer_args = ["--config", os.path.join(resume_dir, "config.yaml")]
    job = Job(system, nodes, seconds, job_dir, name, app, trainer_args, resume_dir=resume_dir)
    path = write_script(job)
    if not args.quiet:
        print(open(path).read())
    if rule is not None:
        print(
            f"queue:   {rule.name}, chosen for {nodes} node(s) and {args.time} from {system.name}'s queues (--queue names another)"
        )
    if command == "script" or args.dry_run:
        print(f"wrote {shown(path)} (not submitted)")
        return 0
    job_id = submit(system.scheduler, path, cwd=job_dir)
    with open(os.path.join(job_dir, "job_id"), "w") as f:
        f.write(job_id + "\n")
    log = os.path.join(job_dir, SCHEDULER_LOG[system.scheduler].replace("%j", job_id).replace("%J", job_id))
    print(f"submitted job {job_id} ({system.scheduler}): {job.ranks} ranks of apps.{app} on {system.name}")
    also = " (its stderr: job.error; Cobalt's record: job.cobaltlog)" if system.scheduler == "cobalt" else ""
    print(f"log:     {shown(log)}{also}")
    run_dir = resume_dir or os.path.join(job_dir, f"{app}-{job_id}")
    print(f"run dir: {shown(run_dir)} (metrics.jsonl, summary.json)")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = ("submit", "script", "sweep", "preflight")
    if not argv or argv[0] not in commands:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        if argv[0] == "sweep":
            return sweep_main(argv[1:])
        if argv[0] == "preflight":
            return preflight_main(argv[1:])
        return submit_main(argv[0], argv[1:])
    except (LaunchError, SubmitError) as exc:
        print(f"launch {argv[0]}: {exc}", file=sys.stderr)
        return 2
