"""Rank processes forked from a server that imported torch once, instead of each rank importing it.

A rank of a test job spends about 3 s of CPU importing torch before it
runs a line of its own; with two cores and hundreds of jobs that was most of the suite's time.
The launcher (mpiexec, torchrun) still starts one process per rank, but that process is the small
client below (`forkclient.py`, standard library only): it hands its argv, environment, working
directory and stdio to this server over a Unix socket, and the server forks a copy of itself that
becomes the rank. The copy is a real process running the real script, MPI_Init and all; only the
import is shared. The client relays signals to the rank and ends the way the rank ended (its exit
code, or killed by the same signal), so the launcher sees what it would have seen. A rank whose
environment differs from the server's in what a process reads only at start (the dynamic loader,
OpenMP, Python's own flags) is started as a fresh Python instead; so is any Python option other
than -u and -m.

Per request the server forks a relay (the client's peer, which waits for the rank) and the relay
forks the rank, so that the rank has no extra thread and the relay can kill the rank's process
group if the client is killed outright (SIGKILL cannot be relayed).

tests/ranks.py starts one server per test session, and tests/cluster one on each emulated node;
TESTS_FORKSERVER=0 turns them off.
"""

from __future__ import annotations

import array
import copy
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys

# What the server imports before it forks; a module missing here is simply imported by the rank.
# None of them may allocate a CPU tensor: torch reads THP_MEM_ALLOC_ENABLE at its first allocation,
# which must be the rank's (mcr.hugepages). TorchRec's import allocates; DeepSpeed's probes devices.
# torch._dynamo: every trainer's first optimizer imports it (about 2 s of CPU per rank).
PREIMPORTS = ("torch", "torch.distributed", "torch._dynamo", "numpy", "yaml", "omegaconf")


def recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: a 4-byte length, then that much JSON, with the client's stdio fds attached."""
    fds = array.array("i")
    head, ancdata, _, _ = conn.recvmsg(4, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    (size,) = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise EOFError("client went away mid-request")
        body += chunk
    return json.loads(body), list(fds)


def become_rank(request: dict, fds: list[int], server_path: list[str]) -> None:
    """In the forked rank: take the client's stdio, environment, directory and argv, then run the
    target as `python` would. Never returns: a target that ends or calls sys.exit leaves through
    `leave` below; one that raises, through the interpreter's normal exit (traceback, exit code 1)."""
    os.setpgid(0, 0)  # its own group, so the relay can end it and whatever it started
    for target_fd, fd in enumerate(fds):
        os.dup2(fd, target_fd)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    module, args = request["module"], request["args"]
    path0 = os.getcwd() if module else os.path.dirname(os.path.abspath(args[0]))
    pythonpath = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [path0, *pythonpath, *server_path]
    sys.argv[:] = args
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    if request["env"].get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:
        leave(exc.code)
    leave(0)


def leave(code) -> None:
    """End the rank as the interpreter's exit does (join the threads that are not daemons, run the
    atexit handlers, flush stdout and stderr, exit with sys.exit's code) but without tearing down
    the modules: for a process that imported torch that alone is 0.8-1.4 s of CPU, with nothing to
    show for it. multiprocessing ends its forked children the same way (os._exit); as there, a file
    the rank left open is not flushed for it."""
    import atexit
    import threading

    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi and mpi.Is_initialized() and not mpi.Is_finalized() and sys.modules["mpi4py"].rc.finalize is not False:
        mpi.Finalize()  # what mpi4py does at the interpreter's exit (a C-level hook after module teardown)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            code = code or 120  # as Python exits when it cannot flush stdout
    os._exit(code & 0xFF)


def relay(conn: socket.socket, server_path: list[str]) -> None:
    """In the per-request relay: fork the rank, pass on the signals the client receives, and report
    how the rank ended. A client that vanishes takes the rank with it."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request, fds = recv_request(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        become_rank(request, fds, server_path)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([conn, pidfd], [], [])
        if pidfd in ready:
            _, status = os.waitpid(pid, 0)
            conn.sendall(f"{status}\n".encode())
            os._exit(0)
        message = conn.recv(256)
        if not message:  # the client was killed: end the rank and its group
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            os._exit(0)
        for line in message.decode().split():
            try:
                os.kill(pid, int(line))
            except ProcessLookupError:
                pass


def ask_cpuinfo_once() -> None:
    """DeepSpeed's op builder asks py-cpuinfo for the CPU twice each time it loads an op (every
    DeepSpeed job's optimizer), and each ask starts two Pythons (cpuinfo reruns itself in a
    subprocess, which probes CPUID in another): about 1 s of CPU. The server asks once; its ranks,
    on this machine, get a copy of the same answer."""
    try:
        import cpuinfo
    except ImportError:
        return
    info = cpuinfo.get_cpu_info()
    cpuinfo.get_cpu_info = lambda: copy.deepcopy(info)


def serve(path: str) -> None:
    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: go when the test session goes
    for name in PREIMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    ask_cpuinfo_once()
    server_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # relays are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            relay(conn, server_path)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
