"""Every trainer's tiny preset as a 2-node batch job (`launch submit` on the cluster's SLURM),
and a job that loses a rank on node2 mid-run, resumed with `launch submit --resume`."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from tests.cluster.nodes import Cluster
from tests.launch.test_slurm import APPS, DEADLINE_S, launch, read, submitted, wait_for

STEPS = 4  # what is checked is that 4 ranks on 2 nodes train, not how well
# dense: TP=2 over adjacent ranks, which srun places on one node; data parallel across the nodes
EXTRA = {"dense": ["parallel.tensor=2"]}


def submit_job(slurm, system, out_dir, *args) -> tuple[str, str, str]:
    """`launch submit --nodes 2` from `out_dir`; the job id, its log and run dir (absolute)."""
    out = launch(slurm, out_dir, "submit", "--system", system, "--nodes", "2", "--time", "0:10:00", "--quiet", *args)
    job_id, log, run_dir = submitted(out)
    return job_id, os.path.join(out_dir, log), os.path.join(out_dir, run_dir)


def metrics_steps(run_dir: str) -> list[int]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


@pytest.mark.parametrize("app", APPS)
def test_tiny_preset_trains_on_two_nodes_through_launch_submit(cluster_slurm, cluster_system, tmp_path, app):
    trainer = [app, "--config", f"configs/{app}/tiny.yaml", f"train.steps={STEPS}", "log_interval=1"]
    job_id, log, run_dir = submit_job(
        cluster_slurm, cluster_system, tmp_path, "--out", str(tmp_path), "--", *trainer, *EXTRA.get(app, [])
    )
    state = cluster_slurm.wait([job_id], DEADLINE_S)[job_id]
    assert state == "DONE", f"job {job_id}: {state}\n{read(log)[-4000:]}"
    assert f"job {job_id}: 4 ranks of apps.{app} on local; master node1:" in read(log)
    summary = json.loads(read(os.path.join(run_dir, "summary.json")))
    assert summary["world_size"] == 4 and summary["steps"] == STEPS, summary
    assert metrics_steps(run_dir) == list(range(1, STEPS + 1))
    comm = json.loads(read(os.path.join(run_dir, "comm_log.json")))
    assert any(row["backend"] == "mpi" and row["group_size"] == 4 for row in comm), comm  # MPI spans both nodes
    if app == "dense":
        placement = [json.loads(read(os.path.join(run_dir, "placement", f"rank{r}.json"))) for r in range(4)]
        by_replica = {}
        for p in placement:
            by_replica.setdefault(p["data"], []).append((p["tensor"], p["host"]))
        # each TP group (one data-parallel replica) lies on one node, the two replicas on two
        assert sorted(by_replica.values()) == [[(0, "node1"), (1, "node1")], [(0, "node2"), (1, "node2")]], placement


def rank_process(cluster: Cluster, node: str, job_id: str, rank: int) -> int | None:
    """The pid of the job's rank `rank` on `node`: the trainer that srun started as that rank
    (not srun or the step daemon, which carry the job's variables too)."""
    for pid in cluster.pids(node, SLURM_JOB_ID=job_id, SLURM_PROCID=str(rank)):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                if "apps.moe" in f.read().split("\0"):
                    return pid
        except OSError:
            continue
    return None


def test_a_rank_killed_on_node2_fails_the_job_and_resume_continues_from_the_last_checkpoint(
    cluster, cluster_slurm, cluster_system, tmp_path
):
    # long enough that the kill lands mid-run; the resumed job is told to stop two steps on
    config = ["--config", "configs/moe/tiny.yaml", "train.steps=2000", "log_interval=1"]
    checkpoints = ["checkpoint.enabled=true", "checkpoint.interval=2"]
    job_id, log, run_dir = submit_job(
        cluster_slurm, cluster_system, tmp_path, "--out", str(tmp_path), "--", "moe", *config, *checkpoints
    )
    latest, metrics = os.path.join(run_dir, "checkpoints", "latest"), os.path.join(run_dir, "metrics.jsonl")
    trained = lambda: os.path.exists(latest) and os.path.exists(metrics) and read(metrics).count("\n") >= 3
    wait_for(trained, 300, f"job {job_id} to pass its first checkpoint")
    pid = rank_process(cluster, "node2", job_id, 3)
    assert pid is not None, f"no rank 3 of job {job_id} on node2"
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    state = cluster_slurm.wait([job_id], 120)[job_id]
    assert state == "FAILED", f"job {job_id}: {state}\n{read(log)[-4000:]}"
    print(f"the job ended {time.monotonic() - killed_at:.1f} s after rank 3 was killed")
    # srun names the ranks it saw killed (rank 3, and those --kill-on-bad-exit ended with it)
    assert re.search(r"srun: error: node2: tasks? (\d+-)?3: Killed", read(log)), read(log)[-4000:]
    resume_from = int(read(latest).removeprefix("step_"))
    before = metrics_steps(run_dir)
    assert resume_from >= 2 and max(before) < 2000, (resume_from, before)

    end = resume_from + 2
    resumed, log2, run_dir2 = submit_job(
        cluster_slurm, cluster_system, tmp_path, "--out", str(tmp_path / "resumed"), "--resume", run_dir,
        "--", "moe", "--config", os.path.join(run_dir, "config.yaml"), f"train.steps={end}",
    )  # fmt: skip
    assert run_dir2 == run_dir
    state = cluster_slurm.wait([resumed], DEADLINE_S)[resumed]
    text = read(log2)
    assert state == "DONE" and f"resuming at step {resume_from} -> {end}" in text, text[-4000:]
    assert metrics_steps(run_dir) == list(range(1, end + 1))  # the killed job's later steps replaced, not repeated
    assert read(latest) == f"step_{end:06d}"
