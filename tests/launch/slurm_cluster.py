"""A real single-node SLURM (Debian's slurmctld + slurmd, 22.05) started in a temporary state dir.

The tests submit real batch jobs to it. Facts this machine taught us: the controller host must
be the real short hostname; auth/none and cred/none avoid munge; proctrack/linuxproc and
task/none need no cgroups; `SlurmdParameters=config_overrides` lets the node declare more CPUs
than it has cores; srun's pmix plugin dlopens `libpmix.so`, which Debian ships only as
`libpmix.so.2` (`make slurm-deps` adds the link); job ids restart at 1 with each cluster, so its
temporary files (srun's pmix plugin leaves /tmp/spmix_appdir_<uid>_<job>.<step> behind after a
failed step, and refuses to reuse one) go under the state dir (TmpFS). Daemons are stopped by their pid files.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import time

PMIX_LIBS = glob.glob("/usr/lib/*/pmix2/lib")  # Debian's libpmix2, per architecture
CPUS = 4  # tasks the node offers; more than the cores here, which config_overrides allows
PROGRAMS = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel")


def missing() -> str | None:
    """Why SLURM cannot start here, or None."""
    absent = [p for p in PROGRAMS if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]
    if absent:
        return f"SLURM is not installed (no {', '.join(absent)}); run `make slurm-deps` as root"
    if not any(os.path.exists(os.path.join(lib, "libpmix.so")) for lib in PMIX_LIBS):
        return "libpmix.so (Debian's libpmix2) is missing; srun --mpi=pmix needs it: run `make slurm-deps` as root"
    if os.geteuid() != 0:
        return "the test SLURM runs its daemons as root"
    return None


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def slurm_conf(state: str, controller: str, ports: list[int], nodes: list[tuple[str, str, int]], tmpfs: str) -> str:
    """`controller`: SlurmctldHost (a hostname, or host(address)); `nodes`: (name, address, CPUs) each;
    every node's pid file, log and spool are named after it (%n) in the state dir."""
    node_lines = "\n".join(f"NodeName={name} NodeAddr={addr} CPUs={cpus} State=UNKNOWN" for name, addr, cpus in nodes)
    names = ",".join(name for name, _, _ in nodes)
    return f"""\
ClusterName=mcrtest
SlurmctldHost={controller}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd-%n.log
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool-%n
TmpFS={tmpfs}
SlurmdParameters=config_overrides
KillWait=5
MinJobAge=600
InactiveLimit=0
{node_lines}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


class Cluster:
    """One node, this machine under its own hostname; tests/cluster builds a multi-node one on it."""

    def __init__(self, state: str):
        self.state = state
        self.host = socket.gethostname().split(".")[0]
        self.conf = os.path.join(state, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf, PMIX_MCA_psec="native")
        self.nodes = [self.host]
        self.python_env = {}  # what a job's ranks need to run a test's Python (tests/cluster: fork servers)

    def config(self) -> str:
        return slurm_conf(self.state, self.host, free_ports(2), [(self.host, "127.0.0.1", CPUS)], f"{self.state}/tmp")

    def start(self, deadline_s: float = 60) -> None:
        for sub in ("ctld", "tmp"):
            os.makedirs(os.path.join(self.state, sub), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write(self.config())
        self.start_daemons()
        self.wait_idle(deadline_s)

    def start_daemons(self) -> None:
        subprocess.run(["slurmctld", "-c"], env=self.env, check=True)  # -c: clear any saved state
        subprocess.run(["slurmd"], env=self.env, check=True)

    def wait_idle(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        states = []
        while time.monotonic() < end:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            states = sorted(out.stdout.split("\n")[:-1])
            if states == [f"{node} idle" for node in sorted(self.nodes)]:
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"the test SLURM's nodes are {states or 'not answering'} after {deadline_s} s; logs in {self.state}"
        )

    def run(self, *cmd, check=True) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, check=check, text=True, capture_output=True, timeout=60)

    def stop(self) -> None:
        for pid_file in glob.glob(os.path.join(self.state, "slurmd-*.pid")) + [f"{self.state}/slurmctld.pid"]:
            try:
                with open(pid_file) as f:
                    pid = int(f.read().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            end = time.monotonic() + 15
            while time.monotonic() < end:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
