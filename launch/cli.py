"""Batch jobs for the trainers on a described system.

    python -m launch submit --system local --nodes 1 -- moe --config configs/moe/tiny.yaml train.steps=20
    python -m launch script --system lassen --nodes 4 --time 1:00:00 --account mybank -- moe
    python -m launch submit --system local --nodes 1 --resume runs/<job dir>/moe-<id> -- moe
    python -m launch sweep --system local --app moe --nodes 1 --backends gloo,mpi,auto -- --config ...

`submit` writes runs/<app>-<system>-<N>n-<time>/job.sh, shows it, submits it (sbatch, bsub or
qsub) unless --dry-run, and prints the job id and where the log and the run dir (metrics,
summary.json) land; `script` only writes it. `--resume RUN_DIR` continues a run that ended early
(a killed or timed-out job) from the last checkpoint its `latest` names, in that run dir, with
`resume=true`, and with the settings saved in it unless trainer args are given. `sweep`: see
launch/sweep.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from launch.scripts import SCHEDULER_LOG, Job, write_script
from launch.submit import SubmitError, submit
from launch.systems import REPO, LaunchError, load_system, parse_time

RUNS = os.path.join(REPO, "runs")


def app_names() -> list[str]:
    apps = os.path.join(REPO, "apps")
    return sorted(d for d in os.listdir(apps) if os.path.isfile(os.path.join(apps, d, "__main__.py")))


def check_app(app: str) -> str:
    if app not in app_names():
        raise LaunchError(f"unknown app {app!r}; choose one of {', '.join(app_names())} (runs python -m apps.<app>)")
    return app


def shown(path: str) -> str:
    """A path as the user would type it from here: relative when below the current directory."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def new_job_dir(parent: str, name: str) -> str:
    """A fresh directory: a second job never writes over the first."""
    os.makedirs(parent, exist_ok=True)
    for n in range(1, 1000):
        path = os.path.join(parent, name if n == 1 else f"{name}-{n}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise LaunchError(f"no free job directory name under {parent}")


def add_job_options(parser: argparse.ArgumentParser, nodes_help: str) -> None:
    parser.add_argument("--system", required=True, help="a name in configs/systems/ or a YAML path")
    parser.add_argument("--nodes", required=True, help=nodes_help)
    parser.add_argument("--time", default="0:30:00", help="wall time, h:mm:ss (default 0:30:00)")
    parser.add_argument("--account", help="account / bank / project to charge (overrides the system file)")
    parser.add_argument("--queue", help="partition / queue (overrides the system file)")
    parser.add_argument("--out", default=RUNS, help="where job directories go (default runs/)")


def parse_nodes(text: str) -> list[int]:
    try:
        nodes = [int(n) for n in text.split(",")]
    except ValueError:
        raise LaunchError(f"--nodes: bad value {text!r}; give a count, or counts like 1,2,4 for a sweep") from None
    if not nodes or min(nodes) < 1:
        raise LaunchError(f"--nodes: bad value {text!r}; node counts are >= 1")
    return nodes


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


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


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
    system = load_system(args.system, account=args.account, queue=args.queue)
    app = check_app(rest[0])
    resume_dir = check_resume_dir(args.resume, app) if args.resume else ""
    seconds = parse_time(args.time)
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
    if command == "script" or args.dry_run:
        print(f"wrote {shown(path)} (not submitted)")
        return 0
    job_id = submit(system.scheduler, path, cwd=job_dir)
    with open(os.path.join(job_dir, "job_id"), "w") as f:
        f.write(job_id + "\n")
    log = os.path.join(job_dir, SCHEDULER_LOG[system.scheduler].replace("%j", job_id).replace("%J", job_id))
    print(f"submitted job {job_id} ({system.scheduler}): {job.ranks} ranks of apps.{app} on {system.name}")
    print(f"log:     {shown(log)}")
    run_dir = resume_dir or os.path.join(job_dir, f"{app}-{job_id}")
    print(f"run dir: {shown(run_dir)} (metrics.jsonl, summary.json)")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = ("submit", "script", "sweep")
    if not argv or argv[0] not in commands:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        if argv[0] == "sweep":
            from launch.sweep import sweep_main  # it imports this module's helpers

            return sweep_main(argv[1:])
        return submit_main(argv[0], argv[1:])
    except (LaunchError, SubmitError) as exc:
        print(f"launch {argv[0]}: {exc}", file=sys.stderr)
        return 2
