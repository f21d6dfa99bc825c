"""Submit a job script to its scheduler, read back the job id, and ask the scheduler how it is doing.

sbatch, bsub and qsub (PBS Pro and Cobalt) each print the id their own way; `job_state` reduces
each scheduler's answer to PENDING, RUNNING, DONE or FAILED (GONE: the scheduler forgot it).
"""

from __future__ import annotations

import re
import subprocess
import time


class SubmitError(RuntimeError):
    pass


def submit_command(scheduler: str, script: str) -> tuple[list[str], str | None]:
    """The command line, and the script as stdin where the scheduler reads directives only from there."""
    if scheduler == "slurm":
        return ["sbatch", "--parsable", script], None
    if scheduler == "lsf":
        with open(script) as f:
            return ["bsub"], f.read()  # bsub reads #BSUB lines from a script given on stdin
    return ["qsub", script], None  # PBS Pro and Cobalt


def parse_job_id(scheduler: str, output: str) -> str:
    patterns = {
        "slurm": r"^(\d+)(;\S+)?$",  # --parsable: id[;cluster]
        "lsf": r"Job <(\d+)> is submitted",
        "pbs": r"^(\d+)(\.\S+)?$",  # 1234.pbs-server
        "cobalt": r"^(\d+)$",
    }
    for line in output.splitlines():
        match = re.search(patterns[scheduler], line.strip())
        if match:
            return match.group(1)
    raise SubmitError(f"could not read a job id from the {scheduler} submit command's output:\n{output}")


def submit(scheduler: str, script: str, cwd: str) -> str:
    cmd, stdin = submit_command(scheduler, script)
    try:
        proc = subprocess.run(cmd, input=stdin, cwd=cwd, text=True, capture_output=True)
    except FileNotFoundError:
        raise SubmitError(f"{cmd[0]} not found: submit from a login node of the system, or use --dry-run") from None
    if proc.returncode != 0:
        raise SubmitError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return parse_job_id(scheduler, proc.stdout)


SLURM_STATES = {
    "PENDING": "PENDING",
    "CONFIGURING": "PENDING",
    "RUNNING": "RUNNING",
    "COMPLETING": "RUNNING",
    "COMPLETED": "DONE",
}


def job_state(scheduler: str, job_id: str) -> str | None:
    """PENDING | RUNNING | DONE | FAILED | GONE, or None where SLURM's controller gave no answer."""
    if scheduler == "slurm":
        proc = subprocess.run(["scontrol", "show", "job", job_id], text=True, capture_output=True)
        match = re.search(r"JobState=(\w+)", proc.stdout)
        if match:
            return SLURM_STATES.get(match.group(1), "FAILED")
        # a busy controller times out ("Socket timed out on send/recv operation"): that job lives on
        return "GONE" if "Invalid job id" in proc.stderr else None
    if scheduler == "lsf":
        out = subprocess.run(["bjobs", "-noheader", "-o", "stat", job_id], text=True, capture_output=True).stdout
        stat = out.strip()
        return {"PEND": "PENDING", "RUN": "RUNNING", "DONE": "DONE", "EXIT": "FAILED"}.get(stat, "GONE")
    if scheduler == "pbs":
        out = subprocess.run(["qstat", "-x", "-f", job_id], text=True, capture_output=True).stdout
        state = re.search(r"job_state = (\w)", out)
        status = re.search(r"Exit_status = (-?\d+)", out)
        if not state:
            return "GONE"
        if state.group(1) in ("F", "X"):
            return "DONE" if status and status.group(1) == "0" else "FAILED"
        return "RUNNING" if state.group(1) in ("R", "E") else "PENDING"
    out = subprocess.run(["qstat", job_id], text=True, capture_output=True).stdout  # cobalt lists live jobs only
    return "RUNNING" if re.search(rf"^{job_id}\b", out, re.M) else "GONE"


def cancel_command(scheduler: str, job_id: str) -> list[str]:
    return {"slurm": ["scancel"], "lsf": ["bkill"], "pbs": ["qdel"], "cobalt": ["qdel"]}[scheduler] + [job_id]


def wait(scheduler: str, job_ids: list[str], deadline_s: float, poll_s: float = 2.0) -> dict:
    """job id -> final state (DONE, FAILED, GONE), or PENDING/RUNNING for those the deadline caught."""
    end = time.monotonic() + deadline_s
    states = dict.fromkeys(job_ids, "PENDING")
    while True:
        for job_id in job_ids:
            state = job_state(scheduler, job_id)
            if state is not None:  # no answer: ask again at the next poll
                states[job_id] = state
        if all(s not in ("PENDING", "RUNNING") for s in states.values()) or time.monotonic() > end:
            return states
        time.sleep(poll_s)
