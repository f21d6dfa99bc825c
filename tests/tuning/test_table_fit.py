"""A table measured for another job shape or machine is refused with a message naming the fix,
or used through the model when tuning_predict asks for it."""

import os

import pytest

from mcr.tuning.model import predict_table
from mcr.tuning.rules import entries_for
from mcr.tuning.table import Curve, TuningTable, TuningTableError
from tests.ranks import run_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
SIZES = [2**k for k in range(4, 25)]


def _table(world_size=4, hostname="*", ranks_per_node=2):
    # measured on 4 ranks: mpi for small messages, gloo above ~1 MiB (unlike the built-in order)
    lat = {"mpi": [2 + 4e-4 * s for s in SIZES], "gloo": [300 + 1e-4 * s for s in SIZES]}
    curve = Curve("all_reduce", world_size, "float32", SIZES, lat)
    fp = {"hostname": hostname, "world_size": world_size, "ranks_per_node": ranks_per_node}
    return TuningTable(fp, entries_for(curve), "t.yaml", [curve])


def test_world_size_mismatch_names_both_sizes_and_the_fix():
    with pytest.raises(
        TuningTableError, match=r"measured on 4 ranks but this job has 2.*mcr.tools.tune.*tuning_predict"
    ):
        _table().check_fits(2)


def test_hostname_and_layout_mismatch_are_refused():
    with pytest.raises(TuningTableError, match=r"hosts matching 'node\*', this is 'login1'"):
        _table(hostname="node*").check_fits(4, hostname="login1")
    with pytest.raises(TuningTableError, match="2 ranks per node but this job has 4"):
        _table().check_fits(4, ranks_per_node=4)
    _table(hostname="node*").check_fits(4, hostname="node17", ranks_per_node=2)  # fits


def test_predicting_needs_measured_curves():
    bare = TuningTable({"world_size": 4}, _table().entries, "bare.yaml")
    with pytest.raises(TuningTableError, match="no measured curves"):
        predict_table(bare, 2)


def test_runtime_refuses_a_table_for_another_world_size_and_uses_it_when_asked(tmp_path):
    path = tmp_path / "n4.yaml"
    _table().save(str(path))
    refused = (
        run_script(2, os.path.join(SCRIPTS, "load_table.py"), "refuse", env={"MCR_TUNING_FILE": str(path)})
        .check()
        .output
    )
    assert refused.count("refused: tuning table") == 2 and "measured on 4 ranks but this job has 2" in refused, refused
    used = (
        run_script(2, os.path.join(SCRIPTS, "load_table.py"), "predict", env={"MCR_TUNING_FILE": str(path)})
        .check()
        .output
    )
    # predicted for 2 ranks: still mpi for 1 KiB and gloo for 8 MiB, every entry marked predicted
    for rank in (0, 1):
        assert f"rank {rank}: all_reduce 1024 -> mpi chunk 0" in used, used
        assert f"rank {rank}: all_reduce 8388608 -> gloo chunk 0" in used, used
        assert f"rank {rank}:" in used and "predicted True" in used


def test_a_node_aware_winner_is_written_as_the_pair_and_read_back_as_it(tmp_path):
    # 2 x 2 ranks: flat mpi wins small messages, node:mpi+gloo large ones; before, the entry kept
    # only the intra backend, so the table sent those sizes to flat mpi
    lat = {
        "mpi": [2 + 4e-4 * s for s in SIZES],
        "gloo": [300 + 3e-4 * s for s in SIZES],
        "node:mpi+gloo": [60 + 1e-4 * s for s in SIZES],
    }
    curve = Curve("all_reduce", 4, "float32", SIZES, lat)
    path = tmp_path / "2x2.yaml"
    fp = {"hostname": "*", "world_size": 4, "ranks_per_node": 2, "nodes": 2}
    TuningTable(fp, entries_for(curve), None, [curve]).save(str(path))
    entries = TuningTable.load(str(path)).entries
    assert [(e.choice.backend, e.choice.inter) for e in entries][0] == ("mpi", "")
    assert (entries[-1].backend, entries[-1].inter, entries[-1].max_bytes) == ("mpi", "gloo", None), entries
