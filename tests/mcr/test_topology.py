"""Which node each rank is on, the shapes of the job and its groups, and how a tuning table's
entries and fingerprint are keyed by them."""

import os
import re

import pytest

from mcr.topology import Topology
from mcr.tuning.table import Entry, TuningTable, TuningTableError
from tests.ranks import run_script

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tuning", "scripts")


def test_shape_of_a_job_and_of_groups_inside_and_across_nodes():
    topo = Topology(["n1", "n1", "n2", "n2"])
    assert str(topo.shape()) == "4 ranks, 2 nodes x 2"
    assert (topo.shape([0, 1]).nodes, topo.shape([0, 1]).per_node) == (1, 2)
    assert (topo.shape([1, 2]).nodes, topo.shape([1, 2]).per_node) == (2, 1)
    mixed = topo.shape([0, 1, 2])
    assert mixed.per_node is None and str(mixed) == "3 ranks on 2 nodes (2, 1 ranks)"


def test_layout_splits_a_cyclic_placement_by_node_and_by_local_index():
    # srun --distribution=cyclic: ranks 0, 2, 4 on node a; 1, 3, 5 on node b
    topo = Topology(["a", "b", "a", "b", "a", "b"])
    layout = topo.layout(range(6))
    assert layout.local == [[0, 2, 4], [1, 3, 5]]
    assert layout.peers == [[0, 1], [2, 3], [4, 5]]
    assert topo.layout([0, 1, 2]) is None  # 2 ranks on a, 1 on b: no peer group has one rank per node


def _entry(nodes, backend):
    return Entry(op="all_reduce", group_size=2, min_bytes=0, max_bytes=None, backend=backend, nodes=nodes)


def test_table_entries_are_keyed_by_the_nodes_a_group_spans():
    table = TuningTable({"world_size": 4, "nodes": 2}, [_entry(1, "mpi"), _entry(2, "gloo")])
    assert table.lookup("all_reduce", 64, 2, "float32", nodes=1).backend == "mpi"
    assert table.lookup("all_reduce", 64, 2, "float32", nodes=2).backend == "gloo"
    only_inside = TuningTable({"world_size": 4, "nodes": 2}, [_entry(1, "mpi")])
    assert only_inside.lookup("all_reduce", 64, 2, "float32", nodes=2) is None  # never another shape's entry
    anywhere = TuningTable({"world_size": 2}, [_entry(None, "mpi")])  # tables without nodes speak for any
    assert anywhere.lookup("all_reduce", 64, 2, "float32", nodes=2).backend == "mpi"


def test_a_table_from_another_node_count_is_refused_naming_both_and_the_fix():
    table = TuningTable({"world_size": 4, "nodes": 1, "ranks_per_node": 4}, [], "one-node.yaml")
    with pytest.raises(
        TuningTableError, match=r"measured on 1 node\(s\) but this job runs on 2.*mcr.tools.tune. on 2 node"
    ):
        table.check_fits(4, hostname="x", ranks_per_node=2, nodes=2)
    two = TuningTable({"world_size": 4, "nodes": 2, "ranks_per_node": 2}, [], "two-nodes.yaml")
    with pytest.raises(TuningTableError, match="2 ranks per node but this job has different numbers of ranks per node"):
        two.check_fits(4, hostname="x", ranks_per_node=None, nodes=2)  # 3 + 1
    two.check_fits(4, hostname="x", ranks_per_node=2, nodes=2)  # fits


def test_start_up_line_names_the_jobs_shape_and_the_table_with_its_shape_and_fingerprint(tmp_path):
    path = tmp_path / "n2.yaml"
    fingerprint = {"hostname": "*", "world_size": 2, "nodes": 1, "ranks_per_node": 2, "versions": {"mpi": "v5"}}
    table = TuningTable(fingerprint, [_entry(None, "mpi")])
    table.save(str(path))
    out = run_script(2, os.path.join(SCRIPTS, "load_table.py"), "use", env={"MCR_TUNING_FILE": str(path)})
    out = out.check().output
    assert "mcr: 2 ranks, 1 node x 2 via openmpi; backends mpi" in out, out[-3000:]
    digest = re.search(r"fingerprint ([0-9a-f]{8}) \(hosts '\*', mpi v5\)", table.fingerprint_text()).group(1)
    said = f"; tuning table {path} (measured for 2 ranks, 1 node x 2; fingerprint {digest} (hosts '*', mpi v5))"
    assert said in out, out[-3000:]
    assert TuningTable(dict(fingerprint, hostname="vm*"), []).fingerprint_text() != table.fingerprint_text()
