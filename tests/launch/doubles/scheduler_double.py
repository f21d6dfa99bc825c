#!/usr/bin/env python3
"""TEST DOUBLES of bsub, bjobs, jsrun, qsub and qstat (PBS Pro and Cobalt), mpiexec (Cray PALS)
and mpirun (Open MPI).

Not the real tools: LSF, PBS and Cobalt cannot run on the test machine. Each double does the
one thing the real tool does for our job scripts, on this host: the submit commands run the
script at once with the environment the scheduler documents (LSB_JOBID, LSB_DJOB_HOSTFILE,
PBS_JOBID, PBS_NODEFILE, COBALT_JOBID, COBALT_NODEFILE; "nodes" are this host under two names)
and print the job id the way the real one does; bjobs and qstat answer for the jobs they ran in
the real tools' words (and as a daemon that does not answer while SCHEDULER_DOUBLE_DOWN is set);
the rank launchers start the ranks locally with the variables the real launcher sets
(JSM_NAMESPACE_*, PMI_* and PALS_*, OMPI_COMM_WORLD_*), so the product's rank discovery runs end
to end. jsrun's --smpiargs="-gpu" sets what Spectrum
MPI's -gpu sets in each rank (OMPI_MCA_pml_pami_enable_cuda=1). Each tool appends the arguments
it was given, one JSON list a line, to <tool>.args in the state directory. Dispatches on the
name it is called by.
"""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile

STATE = os.environ.get("SCHEDULER_DOUBLE_STATE", tempfile.gettempdir())


def next_job_id() -> int:
    path = os.path.join(STATE, "next_job_id")
    job_id = int(open(path).read()) if os.path.exists(path) else 100
    with open(path, "w") as f:
        f.write(str(job_id + 1))
    return job_id


def nodes(n: int) -> list:
    return [socket.gethostname()] + ["localhost"] * (n - 1)  # this host, twice over


def directive(text: str, prefix: str, flag: str):
    match = re.search(rf"^#{prefix}\s+{re.escape(flag)}\s*(\S+)", text, re.M)
    return match.group(1) if match else None


def run_job(script_text: str, env: dict, out: str, err: str = None) -> None:
    path = os.path.join(STATE, f"job-{env.get('DOUBLE_JOB_ID')}.sh")
    with open(path, "w") as f:
        f.write(script_text)
    with open(out, "w") as o:
        e = open(err, "w") if err else subprocess.STDOUT
        code = subprocess.run(["bash", path], env={**os.environ, **env}, stdout=o, stderr=e).returncode
    with open(os.path.join(STATE, f"exit-{env.get('DOUBLE_JOB_ID')}"), "w") as f:
        f.write(str(code))


def exit_code(job_id: str):
    """The exit code of a job this double ran, or None for a job it never saw."""
    path = os.path.join(STATE, f"exit-{job_id.split('.')[0]}")
    return int(open(path).read()) if os.path.exists(path) else None


def fail(words: str, code: int) -> None:
    print(words, file=sys.stderr)
    sys.exit(code)


def down(words: str, code: int) -> None:
    if os.environ.get("SCHEDULER_DOUBLE_DOWN"):
        fail(words, code)


def bjobs(argv):  # bjobs -noheader -o stat ID
    down("LSF is down. Please wait ...", 255)
    code = exit_code(argv[-1])
    if code is None:
        fail(f"Job <{argv[-1]}> is not found", 255)
    print("DONE" if code == 0 else "EXIT")


def qstat(argv):  # PBS Pro: qstat -x -f ID (finished jobs too); Cobalt: qstat ID (live jobs only)
    pbs = "-f" in argv
    if pbs:
        down("Connection refused\nqstat: cannot connect to server pbs-double (errno=15010)", 2)
    else:
        down("Failed to connect to system component queue-manager", 1)
    code = exit_code(argv[-1])
    if not pbs:  # its jobs ran before qsub answered: none is live
        print("JobID  User  WallTime  Nodes  State  Location\n=============================================")
    elif code is None:
        fail(f"qstat: Unknown Job Id {argv[-1]}", 153)
    else:
        print(f"Job Id: {argv[-1]}\n    job_state = F\n    Exit_status = {code}")


def node_file(hosts: list, name: str) -> str:
    path = os.path.join(STATE, name)
    with open(path, "w") as f:
        f.write("".join(h + "\n" for h in hosts))
    return path


def bsub(argv):
    text = sys.stdin.read()  # LSF reads #BSUB directives from a script on stdin
    job_id = next_job_id()
    n = int(directive(text, "BSUB", "-nnodes"))
    hosts = ["batch1"] + nodes(n)  # line 1: the launch node, which runs no ranks
    env = {
        "LSB_JOBID": str(job_id),
        "DOUBLE_JOB_ID": str(job_id),
        "LSB_DJOB_HOSTFILE": node_file(hosts, f"hosts-{job_id}"),
    }
    env["LSB_HOSTS"] = " ".join(hosts)
    run_job(text, env, directive(text, "BSUB", "-o").replace("%J", str(job_id)))
    print(f"Job <{job_id}> is submitted to queue <{directive(text, 'BSUB', '-q') or 'normal'}>.")


def qsub(argv):
    script = argv[-1]
    text = open(script).read()
    job_id = next_job_id()
    if "#COBALT" in text:
        if not os.access(script, os.X_OK):
            sys.exit(f"qsub: script {script} is not executable (Cobalt runs scripts directly)")
        if not directive(text, "COBALT", "-A"):
            sys.exit("qsub: no project given (-A) (Cobalt requires one)")
        n = int(directive(text, "COBALT", "-n"))
        env = {"COBALT_JOBID": str(job_id), "COBALT_NODEFILE": node_file(nodes(n), f"nodes-{job_id}")}
        prefix = directive(text, "COBALT", "-O")
        run_job(text, {**env, "DOUBLE_JOB_ID": str(job_id)}, prefix + ".output", prefix + ".error")
        print(job_id)
        return
    n = int(re.search(r"select=(\d+)", directive(text, "PBS", "-l")).group(1))
    env = {"PBS_JOBID": f"{job_id}.pbs-double", "PBS_NODEFILE": node_file(nodes(n), f"nodes-{job_id}")}
    run_job(text, {**env, "PBS_O_WORKDIR": os.getcwd(), "DOUBLE_JOB_ID": str(job_id)}, directive(text, "PBS", "-o"))
    print(f"{job_id}.pbs-double")


def start_ranks(world: int, per_node: int, command: list, rank_env, base_env: dict) -> int:
    procs = [
        subprocess.Popen(command, env={**base_env, **rank_env(rank, rank % per_node, rank // per_node)})
        for rank in range(world)
    ]
    return max(p.wait() for p in procs)


def option(argv, *names):
    for i, arg in enumerate(argv):
        if arg in names:
            return argv[i + 1]
    raise SystemExit(f"{os.path.basename(sys.argv[0])} double: missing {names[0]}")


def command_after(argv, takes_value: set) -> list:
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in takes_value else 1
    return argv[i:]


def jsrun(argv):
    nrs, tasks = int(option(argv, "--nrs")), int(option(argv, "--tasks_per_rs"))
    per_node = int(option(argv, "--rs_per_host")) * tasks
    takes = {"--nrs", "--rs_per_host", "--tasks_per_rs", "--cpu_per_rs", "--gpu_per_rs", "--bind"}
    world = nrs * tasks
    smpiargs = [arg.split("=", 1)[1].split() for arg in argv if arg.startswith("--smpiargs=")]
    gpu = {"OMPI_MCA_pml_pami_enable_cuda": "1"} if any("-gpu" in args for args in smpiargs) else {}

    def env(rank, local, node):
        return {"JSM_NAMESPACE_RANK": str(rank), "JSM_NAMESPACE_LOCAL_RANK": str(local),
                "JSM_NAMESPACE_SIZE": str(world), "JSM_NAMESPACE_LOCAL_SIZE": str(per_node), **gpu}  # fmt: skip

    return start_ranks(world, per_node, command_after(argv, takes), env, dict(os.environ))


def mpiexec(argv):  # Cray PALS, as on ALCF's PBS systems
    world, ppn = int(option(argv, "-n")), int(option(argv, "--ppn"))
    takes = {"-n", "--ppn", "--depth", "--cpu-bind"}

    def env(rank, local, node):
        return {"PMI_RANK": str(rank), "PMI_SIZE": str(world), "PMI_LOCAL_RANK": str(local),
                "PMI_LOCAL_SIZE": str(ppn), "PALS_RANKID": str(rank), "PALS_NODEID": str(node)}  # fmt: skip

    return start_ranks(world, ppn, command_after(argv, takes), env, dict(os.environ))


def mpirun(argv):  # Open MPI: other nodes see only the variables named with -x
    world, per_node = int(option(argv, "-np")), int(re.fullmatch(r"ppr:(\d+):node", option(argv, "--map-by")).group(1))
    forwarded = {argv[i + 1] for i, arg in enumerate(argv) if arg == "-x"}
    base = {key: value for key, value in os.environ.items() if key in forwarded or key == "HOME"}

    def env(rank, local, node):
        return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(per_node)}  # fmt: skip

    takes = {"-np", "--map-by", "--bind-to", "--hostfile", "-x"}
    return start_ranks(world, per_node, command_after(argv, takes), env, base)


if __name__ == "__main__":
    tool = os.path.basename(sys.argv[0])
    with open(os.path.join(STATE, f"{tool}.args"), "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\n")
    sys.exit(
        {
            "bsub": bsub,
            "bjobs": bjobs,
            "qsub": qsub,
            "qstat": qstat,
            "jsrun": jsrun,
            "mpiexec": mpiexec,
            "mpirun": mpirun,
        }[tool](sys.argv[1:])
    )
