"""What the batch commands (`submit`, `script`, `sweep`) share: their job options, the app
check, and fresh job directories. Light on purpose, like the rest of launch/: no torch, no mcr."""

from __future__ import annotations

import argparse
import os

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


def add_job_options(parser: argparse.ArgumentParser, nodes_help: str) -> None:
    parser.add_argument("--system", required=True, help="a name in configs/systems/ or a YAML path")
    parser.add_argument("--nodes", required=True, help=nodes_help)
    parser.add_argument("--time", default="0:30:00", help="wall time, h:mm:ss (default 0:30:00)")
    parser.add_argument("--account", help="account / bank / project to charge (overrides the system file)")
    parser.add_argument("--queue", help="partition / queue (overrides the system file and its choice by size)")
    parser.add_argument(
        "--no-nccl-plugin",
        action="store_true",
        help="leave out the system's NCCL network plugin and its settings (and unset them)",
    )
    parser.add_argument("--out", default=RUNS, help="where job directories go (default runs/)")


def job_system(args: argparse.Namespace) -> System:
    """The system file with the command line's overrides (add_job_options) applied."""
    return load_system(
        args.system, account=args.account, queue=args.queue, nccl_plugin_off=True if args.no_nccl_plugin else None
    )


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
