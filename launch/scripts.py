"""Batch job scripts for SLURM (sbatch + srun), LSF (bsub + jsrun), PBS Pro (qsub + mpiexec) and
Cobalt (qsub + mpirun with the node file).

Every script: cds to the project, sets up the environment (the system's preamble, or the venv
of the Python that wrote it), runs the ranks under the MPI launcher (so MPI has a world) and
exports what the trainers read: LOCAL_WORLD_SIZE, MASTER_ADDR, a MASTER_PORT derived from the
job id (two jobs on one node never share it), thread counts from the CPUs per task, wandb
offline. Each job builds DeepSpeed's ops in its own TORCH_EXTENSIONS_DIR (seeded from a
pre-built cache when the system names one), so a job killed mid-build leaves its lock only
there and cannot hang later jobs. Logs and the trainer's run dir (named with the job id) go
under the job dir; the launcher's output is also kept in the run dir, and when the launcher fails
`python -m launch.dead_rank` reads it with the ranks' files (MCR_RANK_DIR) and names the rank that
died.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass

from launch.systems import REPO, System, queue_name, walltime


@dataclass
class Job:
    system: System
    nodes: int
    seconds: int  # wall time
    job_dir: str  # absolute: the script, the scheduler's log and the run dir live here
    name: str
    app: str  # apps.<app> is the module run on every rank
    args: list  # the trainer's arguments (preset, key=value overrides)
    module: str = ""  # what every rank runs with python -m (default apps.<app>)
    resume_dir: str = ""  # an earlier job's run dir to continue (resume=true) instead of a new one

    @property
    def ranks(self) -> int:
        return self.nodes * self.system.ranks_per_node

    @property
    def script_path(self) -> str:
        return os.path.join(self.job_dir, "job.sh")


# Per scheduler: the directive prefix, the job id variable, the scheduler's log, the first node.
JOB_ID = {
    "slurm": "$SLURM_JOB_ID",
    "lsf": "$LSB_JOBID",
    "pbs": "${PBS_JOBID%%.*}",  # 1234.pbs-server -> 1234
    "cobalt": "$COBALT_JOBID",
}
FIRST_NODE = {
    "slurm": 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1',
    "lsf": 'sed -n 2p "$LSB_DJOB_HOSTFILE"',  # line 1 is the launch node, which runs no ranks
    "pbs": 'head -n 1 "$PBS_NODEFILE"',
    "cobalt": 'head -n 1 "$COBALT_NODEFILE"',
}
# Where the scheduler writes the job's own output (%j / %J: the job id where it substitutes one).
# Cobalt's -O names a prefix: the job's stdout goes to <prefix>.output, its stderr to .error and
# Cobalt's own record of the submission to .cobaltlog (ALCF's ThetaGPU "Job and queue scheduling").
SCHEDULER_LOG = {"slurm": "job-%j.out", "lsf": "job-%J.out", "pbs": "job.out", "cobalt": "job.output"}
COBALT_PREFIX = "job"


def _directives(job: Job) -> list[str]:
    s, log = job.system, os.path.join(job.job_dir, SCHEDULER_LOG[job.system.scheduler])
    time = walltime(s.scheduler, job.seconds)
    queue = queue_name(s, job.nodes, job.seconds)
    if s.scheduler == "slurm":
        lines = [
            f"--job-name={job.name}",
            f"--nodes={job.nodes}",
            f"--ntasks-per-node={s.ranks_per_node}",
            f"--cpus-per-task={s.cpus_per_task}",
            f"--time={time}",
            f"--output={log}",
        ]
        lines += [f"--gpus-per-node={s.gpus_per_node}"] if s.gpus_per_node else []
        lines += [f"--account={s.account}"] if s.account else []
        lines += [f"--partition={queue}"] if queue else []
    elif s.scheduler == "lsf":
        lines = [f"-J {job.name}", f"-nnodes {job.nodes}", f"-W {time}", f"-o {log}"]
        lines += [f"-G {s.account}"] if s.account else []
        lines += [f"-q {queue}"] if queue else []
    elif s.scheduler == "pbs":
        select = f"select={job.nodes}{s.node_resources}"
        lines = [f"-N {job.name}", f"-l {select}", f"-l walltime={time}", f"-A {s.account}", f"-o {log}", "-j oe"]
        lines += [f"-q {queue}"] if queue else []
    else:  # cobalt
        lines = [f"-n {job.nodes}", f"-t {time}", f"-A {s.account}", f"-O {os.path.join(job.job_dir, COBALT_PREFIX)}"]
        lines += [f"-q {queue}"] if queue else []
    prefix = {"slurm": "#SBATCH", "lsf": "#BSUB", "pbs": "#PBS", "cobalt": "#COBALT"}[s.scheduler]
    return [f"{prefix} {line}" for line in lines + list(s.directives)]


def _exports(job: Job) -> dict[str, str]:
    """name -> shell value of what the script exports (env beats nccl_env; an empty value is
    left out: `_unsets` names it)."""
    s = job.system
    env = {
        "LOCAL_WORLD_SIZE": str(s.ranks_per_node),
        "MASTER_ADDR": f"$({FIRST_NODE[s.scheduler]})",
        "MASTER_PORT": "$((20000 + JOB_ID % 20000))",
        "WANDB_MODE": "${WANDB_MODE:-offline}",
        "OMP_NUM_THREADS": str(s.cpus_per_task),
        "MKL_NUM_THREADS": str(s.cpus_per_task),
        "TORCH_EXTENSIONS_DIR": "$RUN_DIR/torch_extensions",
        "MCR_RANK_DIR": "$RUN_DIR/ranks",  # each rank's host and PID: launch.dead_rank names a dead one
    }
    if s.interface:  # the fast network: gloo, NCCL and Open MPI (its data and its daemons' wire-up) use it
        nic = shlex.quote(s.interface)
        for key in (
            "GLOO_SOCKET_IFNAME",
            "NCCL_SOCKET_IFNAME",
            "OMPI_MCA_btl_tcp_if_include",
            "PRTE_MCA_oob_tcp_if_include",
        ):
            env[key] = nic
    given = {**({} if s.nccl_plugin_off else s.nccl_env), **s.env}
    return {**env, **{key: shlex.quote(value) for key, value in given.items() if value}}


def _unsets(job: Job) -> list[str]:
    """Variables the script unsets: env's empty ones, and with the NCCL plugin off its settings
    (a site's module may set them, as Polaris' conda module does)."""
    s = job.system
    off = [key for key in s.nccl_env if key not in s.env] if s.nccl_plugin_off else []
    return off + [key for key, value in s.env.items() if not value]


def _nccl_plugin(job: Job) -> list[str]:
    s = job.system
    if not s.nccl_plugin or s.nccl_plugin_off:
        return []
    dirs = ":".join(shlex.quote(d) for d in s.nccl_plugin)
    return [
        "# NCCL's network plugin first on the library path (launch: --no-nccl-plugin leaves it out)",
        f'export LD_LIBRARY_PATH={dirs}:"${{LD_LIBRARY_PATH:-}}"',
    ]


def _launcher(job: Job, exported: list[str]) -> str:
    s = job.system
    if s.scheduler == "slurm":
        words = ["srun", *([f"--mpi={s.srun_mpi}"] if s.srun_mpi else []), "--kill-on-bad-exit=1"]
        words.append(f"--cpus-per-task={s.cpus_per_task}")
        if s.gpus_per_node:  # per_task: each rank sees only its own GPU; none: all of its node's
            words.append("--gpus-per-task=1" if s.gpu_bind == "per_task" else "--gpu-bind=none")
    elif s.scheduler == "lsf":  # one resource set per rank: its cores and its GPU, on one socket
        words = [
            "jsrun",
            f"--nrs {job.ranks} --rs_per_host {s.ranks_per_node} --tasks_per_rs 1",
            f"--cpu_per_rs {s.cpus_per_task} --gpu_per_rs {1 if s.gpus_per_node else 0}",
            f"--bind packed:{s.cpus_per_task}",
        ]
    elif s.scheduler == "pbs":
        words = ["mpiexec", f"-n {job.ranks} --ppn {s.ranks_per_node} --depth {s.cpus_per_task} --cpu-bind depth"]
    else:  # cobalt: Open MPI's mpirun forwards only the variables named with -x to other nodes
        forward = " ".join(f"-x {key}" for key in ["PATH", "LD_LIBRARY_PATH", *exported])
        # a node's ranks in local-rank order and unbound: the rank wrapper binds each to its GPU's
        # cores (launch/gpu_numa_bind.sh), which no --map-by can name on a DGX
        place = f"--map-by ppr:{s.ranks_per_node}:node --bind-to none"
        words = ["mpirun", f'-np {job.ranks} {place} --hostfile "$COBALT_NODEFILE" {forward}']
    return " ".join(words + ([s.launcher_args] if s.launcher_args else []))


def job_script(job: Job) -> str:
    s = job.system
    exports = _exports(job)
    # the ranks' Python: $PYTHON_EXEC where set (as torchrun and launch.local read it), else the
    # environment's the preamble sets up, else this one
    python = os.environ.get("PYTHON_EXEC") or ("python" if s.preamble else sys.executable)
    setup = list(s.preamble) or [f"export PATH={shlex.quote(os.path.dirname(sys.executable))}:$PATH"]
    if s.scheduler == "cobalt":
        setup.append('export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"')  # forwarded by -x, so it must exist
    seed_cache = []
    if s.torch_extensions_cache:
        cache = shlex.quote(s.torch_extensions_cache)
        seed_cache = [
            "# this job's own copy of the pre-built ops: a job killed while loading them locks only its copy",
            f'mkdir -p "$TORCH_EXTENSIONS_DIR" && cp -a {cache}/. "$TORCH_EXTENSIONS_DIR"/',
            'find "$TORCH_EXTENSIONS_DIR" -name lock -delete',
        ]
    module = job.module or f"apps.{job.app}"
    trainer = [*shlex.split(s.rank_wrapper), python, "-m", module, *job.args]
    lines = [
        "#!/bin/bash",
        *_directives(job),
        f"# {job.ranks} ranks ({job.nodes} nodes x {s.ranks_per_node}) of {module} on {s.name};"
        " written by `python -m launch`",
        "set -eo pipefail",
        f"JOB_ID={JOB_ID[s.scheduler]}",
        f"JOB_DIR={shlex.quote(job.job_dir)}",
        f"RUN_DIR={shlex.quote(job.resume_dir)}" if job.resume_dir else f'RUN_DIR="$JOB_DIR/{job.app}-$JOB_ID"',
        f"cd {shlex.quote(REPO)}",
        *setup,
        *_nccl_plugin(job),
        *([f"unset {' '.join(unsets)}"] if (unsets := _unsets(job)) else []),
        *(f"{key}={value}" for key, value in exports.items()),
        f"export {' '.join(exports)}",
        *seed_cache,
        'mkdir -p "$RUN_DIR"',
        f'echo "job $JOB_ID: {job.ranks} ranks of {module} on {s.name}; master $MASTER_ADDR:$MASTER_PORT;'
        ' run dir $RUN_DIR"',
        "# the launcher's output kept: when it fails, launch.dead_rank names the rank that died",
        'LAUNCHER_LOG="$RUN_DIR/launcher-$JOB_ID.log"',
        f'{_launcher(job, list(exports))} {shlex.join(trainer)} {_run_dir_args(job)} 2>&1 | tee "$LAUNCHER_LOG" ||'
        f' {{ status=$?; {shlex.quote(python)} -m launch.dead_rank "$MCR_RANK_DIR" "$LAUNCHER_LOG"'
        ' --flight-dir "$RUN_DIR/flight_recorder"; exit $status; }',
        "",
    ]
    return "\n".join(lines)


def _run_dir_args(job: Job) -> str:
    """Where the trainer writes: a new run dir named with the job id, or the run it resumes."""
    if job.resume_dir:
        out_dir, name = os.path.split(job.resume_dir)
        return f"out_dir={shlex.quote(out_dir)} name={shlex.quote(name)} resume=true"
    return f'out_dir="$JOB_DIR" name="{job.app}-$JOB_ID"'


def write_script(job: Job) -> str:
    os.makedirs(job.job_dir, exist_ok=True)
    with open(job.script_path, "w") as f:
        f.write(job_script(job))
    os.chmod(job.script_path, 0o755)  # Cobalt runs only executable scripts
    return job.script_path
