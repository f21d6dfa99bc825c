"""Each launcher family starts 2 nodes x 2 ranks, and every rank finds its rank, local rank,
local world size, node and the one rendezvous address (tests/launch/probe.py all-gathers each
rank's view; rank 0 prints them)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid

from launch.local import mpiexec_command
from launch.scripts import Job, write_script
from launch.systems import load_system
from tests.launch.test_slurm import DEADLINE_S, read
from tests.ranks import REPO, rank_env

ROW = r"probe: rank (\d+) local (\d+) of (\d+) world (\d+) host (\S+) rendezvous (\S+):(\d+)"


def check_views(out: str, launcher: str) -> str:
    """Every rank's view agrees with a 2 x 2 layout; returns the rendezvous address ranks used."""
    rows = [
        (int(r), int(lr), int(lw), int(w), host, addr, int(port))
        for r, lr, lw, w, host, addr, port in re.findall(ROW, out)
    ]
    assert [r[0] for r in rows] == [0, 1, 2, 3], out[-3000:]
    assert f"probe: launcher {launcher}" in out, out[-3000:]
    hosts = {}
    for _, local, local_world, world, host, *_ in rows:
        assert (local_world, world) == (2, 4), rows
        hosts.setdefault(host, []).append(local)
    # 2 nodes; on each, local ranks 0 and 1 in the order of the ranks placed there (which need not be adjacent)
    assert sorted(hosts) == ["node1", "node2"] and all(v == [0, 1] for v in hosts.values()), rows
    rendezvous = {(addr, port) for *_, addr, port in rows}
    assert len(rendezvous) == 1, rows  # one rendezvous, the same on every rank
    (addr, port), rank0_host = rendezvous.pop(), rows[0][4]
    assert addr == rank0_host, rows  # served by rank 0's node
    return f"{addr}:{port}"


def test_sbatch_job_on_two_nodes_gives_every_rank_its_place_and_one_rendezvous(cluster_slurm, cluster_system, tmp_path):
    # ranks dealt round-robin (0, 2 on node1): a local rank guessed from the rank would be wrong
    system = load_system(cluster_system, launcher_args="--distribution=cyclic")
    args = ["backends=mpi,gloo"]
    job = Job(system, 2, 600, str(tmp_path / "job"), "probe", "probe", args, "tests.launch.probe")
    job_id = cluster_slurm.submit(write_script(job), cwd=job.job_dir)
    state = cluster_slurm.wait([job_id], DEADLINE_S)[job_id]
    out = read(os.path.join(job.job_dir, f"job-{job_id}.out"))
    assert state == "DONE", out[-3000:]
    rendezvous = check_views(out, "srun --mpi=pmix")
    assert re.search(r"probe: rank 1 local 0 of 2 world 4 host node2", out), out[-3000:]  # cyclic, as asked
    master_port = 20000 + int(job_id) % 20000  # the job script's MASTER_PORT; mcr's store takes the next one
    assert rendezvous == f"node1:{master_port + 1}" and "probe: backends mpi, gloo" in out, out[-3000:]


def test_torchrun_on_two_nodes_rendezvous_at_node1_gives_every_rank_its_place(cluster):
    endpoint = f"{cluster.address('node1')}:29400"  # c10d rendezvous served by node1's agent
    args = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    run_id = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "torch.distributed.run", *args, "--rdzv-id", run_id]
    cmd += ["--module", "tests.launch.probe", "backends=gloo"]
    agents = [
        cluster.popen(node, cmd, cwd=REPO, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in cluster.nodes
    ]
    outs = []
    try:
        for agent in agents:
            outs.append(agent.communicate(timeout=180)[0])
    finally:  # a node whose peer failed would wait for it until the rendezvous timeout; its workers too
        for node, agent in zip(cluster.nodes, agents):
            agent.kill()
            for pid in cluster.pids(node, TORCHELASTIC_RUN_ID=run_id):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # ended meanwhile
                    pass
    out = "".join(outs)
    assert [a.returncode for a in agents] == [0, 0], out[-3000:]
    addr, port = check_views(out, "torchrun").split(":")
    assert f"probe: launcher torchrun; master {addr}:{port}" in out, out[-3000:]  # the agent's store


def test_mpiexec_across_nodes_through_the_clusters_rsh_agent_gives_every_rank_its_place(cluster):
    # Open MPI starts its daemon on node2 through `rsh` (nsenter into node2, as ssh would log in
    # there, with a login shell's bare environment): what the ranks need must travel by -x
    forward = [w for var in ("PYTHONPATH", "OMP_NUM_THREADS", "PYTHONUNBUFFERED") for w in ("-x", var)]
    cmd = mpiexec_command(4, ["-m", "tests.launch.probe", "backends=mpi,gloo"])
    cmd[1:1] = ["--host", "node1:2,node2:2", "--map-by", "node", "--mca", "plm_rsh_agent", cluster.rsh, *forward]
    result = cluster.run("node1", cmd, cwd=REPO, env=rank_env(), timeout=180, check=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert check_views(out, "openmpi").startswith("node1:"), out[-3000:]  # rank 0 publishes its host over MPI
    assert re.search(r"probe: rank 1 local 0 of 2 world 4 host node2", out), out[-3000:]  # --map-by node: round-robin
    assert "probe: backends mpi, gloo" in out, out[-3000:]


def test_a_rank_killed_on_another_node_is_named_with_that_node(cluster, tmp_path):
    # tests/mcr/scripts/hang.py under launch.local on 2 nodes x 2 ranks (--map-by node: rank 1 on
    # node2): rank 1 SIGKILLs itself while the others wait in an all-reduce. launch.local on node1
    # sees node1's rank files only (each node has its own /tmp), so the rank is the launcher's to name
    events = tmp_path / "events"
    events.mkdir()
    forward = " ".join(f"-x {var}" for var in ("PYTHONPATH", "OMP_NUM_THREADS", "PYTHONUNBUFFERED"))
    where = f"--host node1:2,node2:2 --map-by node --mca plm_rsh_agent {cluster.rsh} {forward}"
    hang = os.path.join(REPO, "tests", "mcr", "scripts", "hang.py")
    cmd = [sys.executable, "-m", "launch.local", "-n", "4", "--mpiexec-args", where, hang, "kill", "op", "mpi", events]
    env = rank_env({"MCR_WATCHDOG_TIMEOUT": "120"})
    result = cluster.run("node1", cmd, cwd=REPO, env=env, timeout=240, check=False)
    assert result.returncode != 0, result.stdout[-3000:]
    said = result.stderr.rstrip("\x00\n ")
    named = re.findall(r"^mcr: (?:rank \d+ \(host \S+\)|a rank on host \S+) died", said, re.M)
    if re.search(r"process rank 1 with PID \d+ on node node2 exited on\s+signal", said):
        assert said.endswith("mcr: rank 1 (host node2) died"), said[-3000:]
    else:  # prterun reported a survivor's abort first (its gloo saw the closed socket): it names no
        # dead rank, and launch.local, seeing node1's ranks only, must not name one of them
        assert named == [], said[-3000:]
