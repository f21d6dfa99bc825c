"""A multi-node SLURM on the namespace cluster: slurmctld on `head`, one slurmd per node.

The configuration is the single-node test SLURM's (tests/launch/slurm_cluster.py: no munge,
no cgroups, pmix) with the controller named `head(ADDRESS)` and a NodeName line per node.
Every daemon runs in its node's namespaces, so each node's pid file, log and spool carry its
name (%n), and TmpFS is the node's own /tmp, where srun's pmix plugin makes its directories
(two nodes sharing one collide: "File exists"). The clients that only talk to slurmctld
(sbatch, scontrol) work from outside every node, over the bridge; srun, which the nodes' step
daemons call back, runs on `head`, the login node.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from contextlib import contextmanager

from launch import submit
from tests import forkclient
from tests.cluster.nodes import HEAD, Cluster
from tests.launch import slurm_cluster
from tests.ranks import REPO, Result, rank_env, start_fork_server, write_fork_client

PORTS = [6817, 6818]  # SLURM's defaults: each daemon has its node's network namespace to itself


class ClusterSlurm(slurm_cluster.Cluster):
    def __init__(self, cluster: Cluster):
        super().__init__(os.path.join(cluster.state, "slurm"))
        self.cluster = cluster
        self.nodes = cluster.nodes
        self.python = sys.executable  # what a test's ranks run (python_env: what they need to)

    def use_fork_servers(self, where: str) -> None:
        """Ranks forked from a server on their node (tests/forkserver.py), which imported torch once
        in the node's namespaces: `python` becomes the client, which finds its node's server by the
        hostname. The servers go with the node (its teardown ends every process in it)."""
        # the job scripts' thread settings (launch/scripts.py: both from cpus_per_task, 1 here) are
        # read at a process's start, so the servers' must match, and srun's ranks get the same
        threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        for node in self.nodes:
            socket_path = os.path.join(where, f"{node}.socket")
            start_fork_server(socket_path, popen=functools.partial(self.cluster.popen, node), env=threads)
        self.python = write_fork_client(where)
        self.python_env = {
            forkclient.SOCKET_VAR: os.path.join(where, "%h.socket"),
            "PYTHON_EXEC": self.python,
            **threads,
        }

    def config(self) -> str:
        nodes = [(n, self.cluster.address(n), self.cluster.ranks_per_node) for n in self.nodes]
        return slurm_cluster.slurm_conf(self.state, f"{HEAD}({self.cluster.address(HEAD)})", PORTS, nodes, "/tmp")

    def start_daemons(self) -> None:
        self.cluster.run(HEAD, ["slurmctld", "-c"], env=self.env)  # -c: clear any saved state
        for node in self.nodes:
            self.cluster.run(node, ["slurmd", "-N", node], env=self.env)

    def srun(self, *args, env: dict | None = None, timeout: float = 300) -> Result:
        """`srun ARGS` from the login node, in the repository, the ranks' environment clean (tests.ranks).
        SLURM ends the step at its time limit; a hung srun is stopped at `timeout`, as a user's ^C would."""
        minutes = math.ceil(timeout / 60)
        cmd = self.cluster.command(HEAD, ["srun", f"--time={minutes}", "--kill-on-bad-exit=1", *args], cwd=REPO)
        full_env = rank_env({"SLURM_CONF": self.conf, "PMIX_MCA_psec": "native", **self.python_env, **(env or {})})
        proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # srun passes it on to the step and exits
            try:
                out, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            raise AssertionError(f"srun {' '.join(args)} did not finish in {timeout} s:\n{out[-6000:]}") from None
        return Result(proc.returncode, out)

    @contextmanager
    def as_default(self):
        """SLURM_CONF naming this SLURM while the block runs, for the clients this process calls
        itself (launch.submit's sbatch and scontrol); the single-node test SLURM may own it otherwise."""
        before = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = self.conf
        try:
            yield self
        finally:
            if before is None:
                os.environ.pop("SLURM_CONF")
            else:
                os.environ["SLURM_CONF"] = before

    def submit(self, script: str, cwd: str) -> str:
        with self.as_default():
            return submit.submit("slurm", script, cwd)

    def wait(self, job_ids: list[str], deadline_s: float) -> dict:
        with self.as_default():
            return submit.wait("slurm", job_ids, deadline_s)
