"""Run a bapipe module on N local processes through the repository's launcher (launch.local,
torchrun mode: gloo on loopback) and wait for it. Needs the checkout: launch/ is not installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_local(nprocs: int, job: list, timeout_s: float, what: str, env=None) -> str:
    """`job`: what follows `python` ("-m", module, args...). Returns the ranks' output; raises
    RuntimeError naming `what` with the output's tail when the job fails or outlasts `timeout_s`."""
    cmd = [sys.executable, "-m", "launch.local", "-n", str(nprocs), "--launcher", "torchrun", *job]
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    # a session of its own: on a timeout the launcher and every rank it started go together
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        log = proc.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log = proc.communicate()[0]
        raise RuntimeError(f"{what} did not finish in {timeout_s} s:\n{log[-6000:]}") from None
    if proc.returncode:
        raise RuntimeError(f"{what} failed (exit code {proc.returncode}):\n{log[-6000:]}")
    return log
