"""Every op on every backend across 2 nodes x 2 ranks, on the world and on groups inside a node
and across nodes, checked as whole tensors against references computed locally; and on every
node-aware candidate, with ranks placed in blocks and round-robin (whose group ranks are not
node-major, so the node-aware ops reorder blocks between phases)."""

import os
import re

import pytest

from tests.mcr.test_ops import SCRIPTS, expected_checks

# srun places ranks in blocks: 0, 1 on node1 and 2, 3 on node2
GROUPS = {"inside node1": [0, 1], "inside node2": [2, 3], "across nodes": [1, 2]}
HOSTS = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


def test_every_op_matches_local_reference_across_nodes_and_in_node_and_cross_node_groups(cluster_slurm):
    groups = [",".join(map(str, g)) for g in GROUPS.values()]
    result = cluster_slurm.srun(
        "-N2", "-n4", "--mpi=pmix", cluster_slurm.python, os.path.join(SCRIPTS, "check_ops.py"), *groups
    )
    out = result.check().output
    oks = re.findall(r"rank (\d+): OK (\d+) checks on backends (\[[^\]]*\]) on (\S+)", out)
    assert sorted(int(r) for r, *_ in oks) == [0, 1, 2, 3], out[-3000:]
    for r, count, backends, host in oks:
        assert host == HOSTS[int(r)] and backends == "['mpi', 'gloo']", oks  # the groups are where their names say
        assert int(count) == expected_checks(int(r), 4, 2, GROUPS.values()), oks
    assert "cannot run" not in out, out[-3000:]  # no op fell back to another backend


NODE_AWARE = ["node:mpi+gloo", "node:gloo+mpi", "node:mpi+mpi", "node:gloo+gloo"]


@pytest.mark.parametrize(
    "distribution,groups,hosts",
    [
        ("block", ["0,1", "2,3", "1,2"], ["node1", "node1", "node2", "node2"]),
        ("cyclic", ["0,2", "1,3", "0,1"], ["node1", "node2", "node1", "node2"]),
    ],
)
def test_node_aware_candidates_match_local_reference_across_nodes(cluster_slurm, distribution, groups, hosts):
    script = os.path.join(SCRIPTS, "check_ops.py")
    args = ["-N2", "-n4", "--mpi=pmix", f"--distribution={distribution}", cluster_slurm.python, script, *NODE_AWARE]
    out = cluster_slurm.srun(*args, *groups, timeout=600).check().output
    oks = re.findall(r"rank (\d+): OK (\d+) checks on backends (\[[^\]]*\]) on (\S+)", out)
    assert sorted(int(r) for r, *_ in oks) == [0, 1, 2, 3], out[-3000:]
    as_lists = [[int(r) for r in g.split(",")] for g in groups]
    for r, count, _, host in oks:
        assert host == hosts[int(r)], oks
        assert int(count) == expected_checks(int(r), 4, 2, as_lists, node_aware=len(NODE_AWARE)), oks
    assert "cannot run" not in out, out[-3000:]
    rows = re.findall(r"^(\w+) +(node:\S+) ", out, re.M)  # rank 0's comm log: the ops under their labels
    assert {op for op, _ in rows} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}, rows
    # the subgroup {0, 1, 3} holds 2 ranks on one node and 1 on the other: flat, said once per candidate
    assert out.count("needs the same number of ranks on each node") == len(NODE_AWARE), out[-3000:]
