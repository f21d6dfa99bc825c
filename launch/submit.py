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
# suspended jobs still hold their place; UNKWN (the host lost contact) has no entry: ask again
LSF_STATES = {
    "PEND": "PENDING",
    "PSUSP": "PENDING",
    "WAIT": "PENDING",
    "PROV": "PENDING",
    "RUN": "RUNNING",
    "USUSP": "RUNNING",
    "SSUSP": "RUNNING",
    "DONE": "DONE",
    "EXIT": "FAILED",
}
STATE_QUERY = {
    "slurm": ["scontrol", "show", "job"],
    "lsf": ["bjobs", "-noheader", "-o", "stat"],
    "pbs": ["qstat", "-x", "-f"],
    "cobalt": ["qstat"],
}
# what each says of a job it does not know (PBS and LSF forget finished jobs after a while)
UNKNOWN_JOB = {"slurm": "Invalid job id", "lsf": "is not found", "pbs": "Unknown Job Id"}


def job_state(scheduler: str, job_id: str) -> str | None:
    """PENDING | RUNNING | DONE | FAILED | GONE (the scheduler does not know the job), or None
    where it gave no answer: a busy or restarting daemon ("Socket timed out", "cannot connect"),
    whose job lives on, so the caller asks again."""
    proc = subprocess.run(STATE_QUERY[scheduler] + [job_id], text=True, capture_output=True)
    state = read_state(scheduler, job_id, proc.stdout)
    if state is not None:
        return state
    if scheduler == "cobalt":  # qstat lists live jobs only: one that answered without it ended
        return "GONE" if proc.returncode == 0 else None
    return "GONE" if UNKNOWN_JOB[scheduler] in proc.stderr else None


def read_state(scheduler: str, job_id: str, out: str) -> str | None:
    if scheduler == "slurm":
        match = re.search(r"JobState=(\w+)", out)
        return SLURM_STATES.get(match.group(1), "FAILED") if match else None
    if scheduler == "lsf":
        return LSF_STATES.get(out.strip())
    if scheduler == "pbs":
        state = re.search(r"job_state = (\w)", out)
        status = re.search(r"Exit_status = (-?\d+)", out)
        if not state:
            return None
        if state.group(1) in ("F", "X"):
            return "DONE" if status and status.group(1) == "0" else "FAILED"
        return "RUNNING" if state.group(1) in ("R", "E") else "PENDING"
    return "RUNNING" if re.search(rf"^{job_id}\b", out, re.M) else None


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
