"""What the batch commands (`submit`, `script`, `sweep`) share: their job options, the app
check, and fresh job directories. Light on purpose, like the rest of launch/: no torch, no mcr."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

from launch.systems import REPO, LaunchError, System, load_system

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


def add_job_options(parser: argparse.ArgumentParser, nodes_help: str, time: str = "0:30:00") -> None:
    parser.add_argument("--system", required=True, help="a name in configs/systems/ or a YAML path")
    parser.add_argument("--nodes", required=True, help=nodes_help)
    parser.add_argument("--time", default=time, help=f"wall time, h:mm:ss (default {time})")
    parser.add_argument("--account", help="account / bank / project to charge (overrides the system file)")
    parser.add_argument("--queue", help="partition / queue (overrides the system file and its choice by size)")
    parser.add_argument(
        "--no-nccl-plugin",
        action="store_true",
        help="leave out the system's NCCL network plugin and its settings (and unset them)",
    )
    # the system file's settings, added to or changed for one job without copying the file
    more = parser.add_argument_group("changes to the system file for this job")
    more.add_argument("--module", action="append", default=[], help="`module load NAME` after the preamble")
    more.add_argument("--preamble", action="append", default=[], metavar="LINE", help="a shell line after it")
    more.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="export NAME=VALUE; NAME= unsets NAME"
    )
    more.add_argument("--directive", action="append", default=[], metavar="LINE", help="a scheduler line")
    more.add_argument("--launcher-args", default="", metavar="ARGS", help="more options for srun/jsrun/mpiexec/mpirun")
    parser.add_argument("--out", default=RUNS, help="where job directories go (default runs/)")


def job_system(args: argparse.Namespace) -> System:
    """The system file with the command line's overrides (add_job_options) applied."""
    system = load_system(
        args.system, account=args.account, queue=args.queue, nccl_plugin_off=True if args.no_nccl_plugin else None
    )
    added = [f"module load {name}" for name in args.module] + list(args.preamble)
    if added and not system.preamble:  # the venv that ran launch stays the ranks' Python, after the modules
        added.append(f"export PATH={shlex.quote(os.path.dirname(sys.executable))}:$PATH")
    system.preamble = [*system.preamble, *added]
    system.directives = [*system.directives, *args.directive]
    system.launcher_args = " ".join(filter(None, [system.launcher_args, args.launcher_args]))
    for item in args.env:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise LaunchError(f"--env: bad value {item!r}; give NAME=VALUE (NAME= unsets NAME)")
        system.env[name] = value
    return system


def parse_nodes(text: str) -> list[int]:
    try:
        nodes = [int(n) for n in text.split(",")]
    except ValueError:
        raise LaunchError(f"--nodes: bad value {text!r}; give a count, or counts like 1,2,4 for a sweep") from None
    if not nodes or min(nodes) < 1:
        raise LaunchError(f"--nodes: bad value {text!r}; node counts are >= 1")
    return nodes


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []
