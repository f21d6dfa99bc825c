"""Run a Python script or module on N real local ranks and collect what each rank printed, or
run one of the project's tools as a user does.

Tests use this instead of mocks: ranks are real processes started by mpiexec (MPI world:
mpi + gloo backends) or torchrun (no MPI world: gloo only), talking over loopback. A rank
reports its results with `tests.report.report` and the test reads them back, per rank, with
`Result.tagged` (docs/testing.md, "Write a test").
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pytest

from launch.local import find_mpiexec, mpiexec_command, mpiexec_family, run_job, torchrun_command
from tests import forkclient, report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Result:
    returncode: int
    output: str  # a rank job's stdout and stderr together; a tool's stdout
    errors: str = ""  # a tool's stderr (run_tool)

    def check(self) -> "Result":
        if self.returncode != 0:
            raise AssertionError(
                f"failed with exit code {self.returncode}:\n{self.output[-6000:]}\n{self.errors[-3000:]}".rstrip()
            )
        return self

    def tagged(self, tag: str) -> dict:
        """{key: value} of what the ranks reported under `tag` (`tests.report.report`)."""
        return report.tagged(self.output, tag)


# Variables through which a launcher or scheduler tells a process its rank, or the user tells mcr
# what to do. The children must get them from their own launcher only: inside a SLURM or
# torchrun job, or a shell with MCR_* set, inherited values would give them the wrong rank or
# config, and the runtime's own settings (e.g. OMPI_MCA_mpi_yield_when_idle, huge pages) would go
# untested.
LAUNCHER_PREFIXES = (
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_LOCAL",
    "MV2_",
    "SLURM_",
    "SRUN_",
    "JSM_",
    "LSB_",
    "LSF_",
    "PBS_",
    "COBALT_",
    "TORCHELASTIC_",
    "MCR_",
    "HYDRA_",
    "I_MPI_",
)
LAUNCHER_NAMES = {
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "THP_MEM_ALLOC_ENABLE",
}


def clean_env() -> dict:
    """This process's environment without any launcher's or mcr's variables."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_NAMES and not k.startswith(LAUNCHER_PREFIXES)}


def venv_first(env: dict) -> str:
    """`env`'s PATH with the venv's tools first, as an activated venv and the job scripts have it:
    DeepSpeed builds its ops with the first ninja on PATH, and ops built by another ninja are
    rebuilt (the venv's 1.13 and this machine's 1.11 hash build commands differently), about a
    minute each time the two alternate."""
    return os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")


def rank_env(env: dict | None = None) -> dict:
    """What the ranks' launcher is given: a clean environment, the repository importable, `env` on top."""
    full_env = clean_env()
    full_env.update(
        {
            "PYTHONPATH": REPO + os.pathsep + full_env.get("PYTHONPATH", ""),
            "PATH": venv_first(full_env),
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "WANDB_MODE": "disabled",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    full_env.update(env or {})
    return full_env


def run_ranks(
    nprocs: int, target: list, launcher: str = "mpiexec", env: dict | None = None, timeout: float = 240
) -> Result:
    """`target` is what follows `python`: ["-m", "module", args...] or ["script.py", args...]."""
    full_env = rank_env(env)
    if launcher == "torchrun":
        if target[0] == "-m":
            target = ["--module"] + target[1:]
        cmd = torchrun_command(nprocs, target)
    else:
        cmd = mpiexec_command(nprocs, target)
    client = use_fork_server(full_env, launcher)
    if client and launcher == "torchrun":
        cmd[0] = client  # torchrun itself; its ranks run $PYTHON_EXEC
    elif client:
        cmd[len(cmd) - len(target) - 1] = client  # the python mpiexec starts per rank
    output = io.BytesIO()  # stdout and stderr together, as they come
    try:
        code = run_job(cmd, full_env, nprocs, out=output, err=output, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        out = output.getvalue().decode(errors="replace")
        keep_output(out)
        raise AssertionError(f"ranks did not finish in {timeout} s:\n{out[-6000:]}") from None
    out = output.getvalue().decode(errors="replace")
    keep_output(out)
    return Result(code, out)


def keep_output(output: str) -> None:
    """Append a rank job's whole output to $TESTS_RANKS_LOG where it is set: `make gpu-check`'s
    sanitizer step reads there what torch's CUDA sanitizer printed in the ranks, which a failed
    test's message would show only the tail of."""
    path = os.environ.get("TESTS_RANKS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(output)


def use_fork_server(env: dict, launcher: str) -> str | None:
    """Point `env` at the fork server, for the command that gets the returned client as its
    `python` and for the ranks a launcher starts as $PYTHON_EXEC; None (env unchanged) where
    the server is not used."""
    client = fork_server(launcher)
    if client:
        env.update({forkclient.SOCKET_VAR: client + ".socket", "PYTHON_EXEC": client})
    return client


def fork_server(launcher: str) -> str | None:
    """The rank-starting client of this session's fork server (tests/forkserver.py), started on
    first use; None where it is turned off (TESTS_FORKSERVER=0) or the launcher is Hydra,
    whose ranks inherit a file descriptor a forked rank would not have."""
    if os.environ.get("TESTS_FORKSERVER") == "0" or (launcher == "mpiexec" and under_hydra()):
        return None
    return _start_fork_server()


@functools.cache
def _start_fork_server() -> str:
    where = tempfile.mkdtemp(prefix="mcr-forkserver-")
    atexit.register(shutil.rmtree, where, True)
    server = start_fork_server(os.path.join(where, "python.socket"))
    atexit.register(server.kill)
    return write_fork_client(where)


def start_fork_server(socket_path: str, popen=subprocess.Popen, env: dict | None = None) -> subprocess.Popen:
    """A fork server (tests/forkserver.py) listening at `socket_path`, started by `popen` (another
    node's: tests/cluster) in `rank_env(env)`, ready when this returns; beside the socket, the
    startup variables its clients compare theirs with."""
    env = rank_env(env)
    server = popen(
        [sys.executable, "-u", "-m", "tests.forkserver", socket_path],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    if server.stdout.readline().strip() != b"ready":
        raise AssertionError(f"tests/forkserver.py did not start (exit code {server.wait()})")
    with open(socket_path + ".env", "w") as f:
        json.dump(forkclient.startup_vars(env), f)
    return server


def write_fork_client(where: str) -> str:
    """`where`/python: the client a launcher starts instead of this Python (tests/forkclient.py)."""
    client = os.path.join(where, "python")
    with open(forkclient.__file__) as f:
        source = f.read()
    with open(client, "w") as f:
        f.write(f"#!{sys.executable} -S\n{source}")
    os.chmod(client, 0o755)
    return client


def run_script(nprocs: int, path: str, *args, launcher="mpiexec", env=None, timeout=240) -> Result:
    return run_ranks(nprocs, [path, *map(str, args)], launcher=launcher, env=env, timeout=timeout)


def run_tool(module: str, *args, env: dict | None = None, timeout: float = 600) -> Result:
    """`python -m module args...` from the repository, as a user runs a command (a trainer's
    compare, mcr.tools.*): in a clean environment, its stdout and stderr kept apart."""
    full_env = dict(clean_env(), PYTHONPATH=REPO, WANDB_MODE="disabled")
    full_env.update(PATH=venv_first(full_env), **(env or {}))
    client = use_fork_server(full_env, "mpiexec")
    if client:  # the command, and the ranks it starts through launch.local or torchrun, come from the fork server
        full_env[forkclient.TOOL_VAR] = module
        full_env.setdefault("OMP_NUM_THREADS", "1")  # the server's; another value gets fresh Pythons
    cmd = [client or sys.executable, "-m", module, *map(str, args)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        raise AssertionError(f"{module} did not finish in {timeout} s:\n{out[-6000:]}") from None
    return Result(proc.returncode, proc.stdout, proc.stderr)


def under_hydra() -> bool:
    """Whether run_script's mpiexec is Hydra (MPICH, Intel MPI: `make test-mpi`), which ends a job
    its own way: a test of what Open MPI's launcher does there expects to fail (`hydra_differs`)."""
    try:
        return mpiexec_family(find_mpiexec()) == "hydra"
    except SystemExit:  # no mpiexec at all: the tests that need one say so themselves
        return False


def hydra_differs(request, why: str, always=True) -> None:
    """Under Hydra, mark the running test as one that fails there for `why`: strictly where it
    `always` does, so a gap that closes shows."""
    if under_hydra():
        request.applymarker(pytest.mark.xfail(strict=always, reason=f"under Hydra: {why}"))
