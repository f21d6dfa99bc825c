"""Every op on every backend across 2 nodes x 2 ranks, on the world and on groups inside a node
and across nodes, checked as whole tensors against references computed locally."""

import os
import re
import sys

from tests.mcr.test_ops import SCRIPTS, expected_checks

# srun places ranks in blocks: 0, 1 on node1 and 2, 3 on node2
GROUPS = {"inside node1": [0, 1], "inside node2": [2, 3], "across nodes": [1, 2]}
HOSTS = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


def test_every_op_matches_local_reference_across_nodes_and_in_node_and_cross_node_groups(cluster_slurm):
    groups = [",".join(map(str, g)) for g in GROUPS.values()]
    result = cluster_slurm.srun(
        "-N2", "-n4", "--mpi=pmix", sys.executable, os.path.join(SCRIPTS, "check_ops.py"), *groups
    )
    out = result.check().output
    oks = re.findall(r"rank (\d+): OK (\d+) checks on backends (\[[^\]]*\]) on (\S+)", out)
    assert sorted(int(r) for r, *_ in oks) == [0, 1, 2, 3], out[-3000:]
    for r, count, backends, host in oks:
        assert host == HOSTS[int(r)] and backends == "['mpi', 'gloo']", oks  # the groups are where their names say
        assert int(count) == expected_checks(int(r), 4, 2, GROUPS.values()), oks
    assert "cannot run" not in out, out[-3000:]  # no op fell back to another backend
