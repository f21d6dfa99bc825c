"""`launch sweep --nodes 1,2` on the cluster's SLURM: one job per (node count, backend), each
run on its nodes, gathered into one table and one plot."""

import json
import os
import re

from tests.launch.test_slurm import launch, read

NODE_LIST = {1: r"\sNodeList=node[12]\s", 2: r"\sNodeList=node\[1-2\]\s"}  # a 1-node job may land on either


def test_sweep_over_one_and_two_nodes_gathers_every_jobs_summary_into_a_table_and_plot(
    cluster_slurm, cluster_system, tmp_path
):
    out = launch(
        cluster_slurm, tmp_path, "sweep", "--system", cluster_system, "--app", "moe", "--nodes", "1,2",
        "--backends", "gloo,mpi", "--time", "0:10:00", "--deadline", "0:10:00", "--out", str(tmp_path),
        "--", "--config", "configs/moe/tiny.yaml", "train.steps=4",
    )  # fmt: skip
    sweep_dir = re.search(r"table and plot in (\S+)", out).group(1)
    rows = json.loads(read(os.path.join(sweep_dir, "sweep.json")))
    shape = [(r["nodes"], r["ranks"], r["backend"], r["state"]) for r in rows]
    assert shape == [(1, 2, "gloo", "DONE"), (1, 2, "mpi", "DONE"), (2, 4, "gloo", "DONE"), (2, 4, "mpi", "DONE")]
    for r in rows:  # each job ran with its backend on its ranks, and on as many nodes as the row says
        assert r["summary"]["comm_backend"] == r["backend"] and r["summary"]["world_size"] == r["ranks"], r
        job = cluster_slurm.run("scontrol", "show", "job", r["job_id"]).stdout
        assert f"NumNodes={r['nodes']} " in job and re.search(NODE_LIST[r["nodes"]], job), job
    lines = read(os.path.join(sweep_dir, "sweep.txt")).splitlines()[3:]
    table = {(int(line.split()[0]), line.split()[2]): line for line in lines}
    for n in (1, 2):  # each node count's gain over gloo, from the two jobs' summaries
        gloo, mpi = (next(r for r in rows if (r["nodes"], r["backend"]) == (n, b))["summary"] for b in ("gloo", "mpi"))
        gain = (mpi["tokens_per_s"] / gloo["tokens_per_s"] - 1) * 100
        assert table[(n, "mpi")].split()[-2] == f"{gain:+.1f}%" and table[(n, "gloo")].split()[-2] == "+0.0%", lines
    assert os.path.getsize(os.path.join(sweep_dir, "sweep.png")) > 10_000
