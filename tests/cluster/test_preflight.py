"""`launch preflight --submit` on the cluster's SLURM: 2 nodes x 2 CPU ranks, every check passes
(gloo and MPI all-reduce across the nodes; no GPU, so NCCL says so), one table."""

import re

from tests.launch.test_slurm import launch


def test_preflight_on_two_nodes_passes_and_shows_every_rank_on_its_node(cluster_slurm, cluster_system, tmp_path):
    out = launch(
        cluster_slurm, tmp_path, "preflight", "--system", cluster_system, "--nodes", "2", "--out", str(tmp_path),
        "--submit", "--quiet",
    )  # fmt: skip
    rows = re.findall(r"^(\d) +(node\d) +(\d) +\(unset\) +no GPU +- +all +no GPU +(\S+) +(\S+)$", out, re.M)
    assert sorted((int(r), host, int(local)) for r, host, local, _, _ in rows) == [
        (0, "node1", 0), (1, "node1", 1), (2, "node2", 0), (3, "node2", 1),
    ], out  # fmt: skip
    assert all(gloo == mpi == "ok" for *_, gloo, mpi in rows), out
    assert "preflight: every check passed (4 ranks on 2 node(s))" in out
