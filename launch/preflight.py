"""`python -m launch preflight --system S --nodes N [--submit]`: a short job that checks every rank's
place before a long run (mcr/tools/preflight.py runs on each rank: its GPU and cores, MPI and its
CUDA self-test, an NCCL all-reduce in each node, a gloo and an MPI all-reduce across the nodes).

Without --submit it writes the job script (runs/preflight-<system>-<N>n-<time>/job.sh) and shows it;
with --submit it also submits it, waits for it (--deadline) and prints the table the job wrote,
exiting 0 where every check passed and 1 where one failed (the table names the rank and the fix).
The job options are those of `submit` (launch/options.py).
"""

from __future__ import annotations

import argparse
import os
import time

from launch.options import add_job_options, job_system, new_job_dir, parse_nodes, shown
from launch.scripts import SCHEDULER_LOG, Job, write_script
from launch.submit import submit, wait
from launch.systems import LaunchError, parse_time, queue_for

MODULE = "mcr.tools.preflight"


def preflight_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launch preflight", usage="python -m launch preflight --system S --nodes N [--submit]"
    )
    add_job_options(parser, "node count", time="0:10:00")
    parser.add_argument("--submit", action="store_true", help="submit the job, wait for it and print its table")
    parser.add_argument("--deadline", default="1:00:00", help="with --submit: stop waiting after this long, h:mm:ss")
    parser.add_argument("--quiet", action="store_true", help="do not show the script")
    args = parser.parse_args(argv)
    nodes = parse_nodes(args.nodes)
    if len(nodes) != 1:
        raise LaunchError("--nodes: one count for a preflight")
    system, seconds = job_system(args), parse_time(args.time)
    queue_for(system, nodes[0], seconds)  # a job no queue takes is refused before anything is written
    name = f"preflight-{system.name}-{nodes[0]}n"
    job_dir = new_job_dir(os.path.abspath(args.out), f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    job = Job(system, nodes[0], seconds, job_dir, name, "preflight", [], module=MODULE)
    path = write_script(job)
    if not args.quiet:
        print(open(path).read())
    if not args.submit:
        print(f"wrote {shown(path)} (not submitted; --submit runs it)")
        return 0
    job_id = submit(system.scheduler, path, cwd=job_dir)
    log = os.path.join(job_dir, SCHEDULER_LOG[system.scheduler].replace("%j", job_id).replace("%J", job_id))
    print(f"submitted preflight job {job_id} ({system.scheduler}): {job.ranks} ranks on {system.name}", flush=True)
    print(f"log:     {shown(log)}", flush=True)
    state = wait(system.scheduler, [job_id], parse_time(args.deadline))[job_id]
    if state in ("PENDING", "RUNNING"):
        print(f"preflight: job {job_id} is still {state.lower()} at the deadline; its table will be in {shown(log)}")
        return 2
    table = os.path.join(job_dir, f"preflight-{job_id}", "preflight.txt")
    if os.path.exists(table):
        print(open(table).read(), end="")
    else:  # it ended before rank 0 wrote the table: the log says why
        tail = open(log).read().splitlines()[-40:] if os.path.exists(log) else ["(no log)"]
        print(f"preflight: job {job_id} ended {state} without a table; the end of {shown(log)}:", *tail, sep="\n")
    passed = os.path.exists(table) and "preflight: every check passed" in open(table).read()
    return 0 if passed else 1
