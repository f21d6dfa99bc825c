"""The `python` a test launcher starts for each rank while tests/forkserver.py runs (standard
library only, started with -S so it costs milliseconds).

It asks the server to fork the rank with this process's argv, environment, directory and stdio,
relays the signals it gets to that rank, and ends as the rank ended. Where the server cannot stand
in for a fresh Python - another Python option, an environment that differs in what a process
reads only at start, an MPI whose launcher hands its ranks a file descriptor (Hydra's PMI_FD), no
server - it becomes one (exec), so a test never depends on the server being there.
"""

import array
import json
import os
import signal
import socket
import struct
import sys

# not MCR_*: mcr refuses MCR_ variables it does not know, and a tool run_tool starts keeps these
SOCKET_VAR = "TESTS_FORKSERVER_SOCKET"
TOOL_VAR = "TESTS_FORKSERVER_TOOL"
# read by the dynamic loader, OpenMP or Python when a process starts, so fixed in the server
STARTUP_PREFIXES = ("LD_", "OMP_", "KMP_", "MKL_", "GOMP_", "PYTHON")
PER_RUN = {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "PYTHON_EXEC"}
# what starts ranks running $PYTHON_EXEC: torchrun, launch.local, and the command a test's
# run_tool names (a trainer's compare runs launch.local per job). These keep it and the server's
# socket for the ranks they start; a rank sees neither.
LAUNCHERS = ("torch.distributed.run", "launch.local")


def launches_ranks(module, env: dict) -> bool:
    return module is not None and (module in LAUNCHERS or module == env.get(TOOL_VAR))


RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


# Open MPI's mpiexec puts its own library directory (the venv's, from the PyPI wheel) on the ranks'
# LD_LIBRARY_PATH; what is loaded from there is found without it (mpi4py's libmpi by its rpath).
# Compared resolved: mpiexec names it by its real path where .venv is a symlink (a shared venv)
LAUNCHER_LIB = os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "lib"))


def startup_vars(env: dict) -> dict:
    found = {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES) and k not in PER_RUN}
    paths = found.pop("LD_LIBRARY_PATH", "").split(os.pathsep)
    library_path = [p for p in paths if p and os.path.realpath(p) != LAUNCHER_LIB]
    if library_path:
        found["LD_LIBRARY_PATH"] = os.pathsep.join(library_path)
    return found


def parse(argv: list[str]):
    """(module or None, sys.argv for the target), or None where only a fresh Python will do."""
    i = 0
    while i < len(argv) and argv[i] == "-u":
        i += 1
    if i < len(argv) - 1 and argv[i] == "-m":
        return argv[i + 1], argv[i + 1 :]
    if i < len(argv) and not argv[i].startswith("-"):
        return None, argv[i:]
    return None


def fresh_python(env: dict) -> None:
    os.execve(sys.executable, [sys.executable, *sys.argv[1:]], env)


def main() -> None:
    env = dict(os.environ)
    target = parse(sys.argv[1:])
    if target is not None and launches_ranks(target[0], env):
        path = env.get(SOCKET_VAR, "")  # the launcher passes both on to its ranks
    else:
        path = env.pop(SOCKET_VAR, "")
        env.pop(TOOL_VAR, None)
        if env.get("PYTHON_EXEC") == sys.argv[0]:
            del env["PYTHON_EXEC"]  # meant for a launcher
    path = path.replace("%h", socket.gethostname())  # a server per node (tests/cluster): this node's
    try:
        with open(path + ".env") as f:
            server_startup = json.load(f)
    except (OSError, ValueError):
        server_startup = None
    if not path or target is None or "PMI_FD" in env or startup_vars(env) != server_startup:
        fresh_python(env)
    module, args = target
    body = json.dumps({"module": module, "args": args, "env": env, "cwd": os.getcwd()}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        fds = array.array("i", [0, 1, 2])
        conn.sendmsg([struct.pack("!I", len(body))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        conn.sendall(body)
    except OSError:
        fresh_python(env)
    for sig in RELAYED:
        signal.signal(sig, lambda number, _frame: conn.sendall(f"{number}\n".encode()))
    reply = b""  # the rank's wait status, one line
    while not reply.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            sys.stderr.write("forkclient: the fork server went away before the rank ended\n")
            os._exit(1)
        reply += chunk
    end_as(int(reply))


def end_as(status: int) -> None:
    """Exit with the rank's code, or die of the signal that killed it."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in RELAYED:
            signal.signal(sig, signal.SIG_DFL)  # the relaying handler would only pass it on
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
